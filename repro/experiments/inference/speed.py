"""Prefill and decode speed of an inference format beside BF16, with a lowering check
(the ``speed_<config>_<format>`` cells of ``repro.experiments.inference.measure``, claim B6).

A cell builds one model config with untrained weights (speed does not depend on the values),
exports it as BF16 and as the format (``repro.models.lm_quantize``), compiles

* prefill: ``[prefill_batch, seq_len]`` tokens through ``repro.models.lm_decode.prefill``
  (logits and the KV cache), the config's training shape;
* decode: ``decode_steps`` steps of ``repro.models.lm_decode.decode_loop`` at each of
  ``decode_batches``, after a ``prompt_len``-token prefix in the cache,

and times the two formats in rounds (BF16, format, BF16, format, ...) in one process, so a
speedup is a ratio of timings from the same run. Every record names how its compiled program
computes the quantized products (:func:`lowering`, read for the platform that compiled it:
``repro.studies.lowering``) and is ``emulated=True`` unless the format ran on its own tensor
cores or matrix units (:func:`speed_emulated`): FP8 as cuBLASLt's FP8 GEMM or an f8 x f8 dot
in a fusion, INT8 as an ``s8 x s8 -> s32`` product (INT8 tensor cores and the TPU's MXU
accumulate in 32-bit integers; any other form of the product is not their GEMM), never on a
CPU, never NVFP4 on a GPU without FP4 tensor cores, never FP8 on a TPU without FP8 arithmetic
(v5e, v5p, v6e). Apart from the compute, ``extra.weight_storage`` says whether the product's
kernels read the 1-byte (4-bit) weights from memory themselves ("native": fewer bytes moved
than BF16, a bandwidth gain whatever the compute), or another kernel widens them first
("widened").
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from repro import hardware, results
from repro.config import ConfigError
from repro.models import lm as M
from repro.models import lm_decode as G
from repro.models import lm_quantize as Q
from repro.precision import export as X
from repro.studies import lowering as L
from repro.studies import timing
from repro.studies.lowering import weight_storage

EXPERIMENT = "inference"
CLAIMS = ("B6",)


# ------------------------------------------------------------------------------ params


def speed_configs(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict((p.get("speed") or {}).get("configs") or {})


def model_config(name: str, spec: dict[str, Any]) -> M.LMConfig:
    """A speed config: ``preset`` with the other LMConfig fields of ``spec`` overriding it."""
    fields = {k: v for k, v in spec.items() if k in M.LMConfig.__dataclass_fields__}
    return M.get_config(spec.get("preset", "tiny"), **fields).replace(name=name)


def config_formats(p: dict[str, Any], config: str, default: list[str]) -> list[str]:
    """The formats a config is timed in: its own ``formats`` list, else ``default``."""
    own = speed_configs(p)[config].get("formats")
    return [f for f in (own or default) if f != "bf16"]


def check_speed(p: dict[str, Any]) -> None:
    sp = p.get("speed") or {}
    for key in ("repeats", "decode_steps", "prompt_len"):
        if not isinstance(sp.get(key), int) or sp[key] < 1:
            raise ConfigError(f"inference: speed.{key} must be a positive integer, "
                              f"got {sp.get(key)!r}")
    batches = sp.get("decode_batches")
    if not batches or not all(isinstance(b, int) and b > 0 for b in batches):
        raise ConfigError(f"inference: speed.decode_batches must be positive integers, "
                          f"got {batches!r}")
    for name, spec in speed_configs(p).items():
        try:
            cfg = model_config(name, spec)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"inference: speed config {name!r}: {e}") from None
        if sp["prompt_len"] + sp["decode_steps"] > cfg.seq_len:
            raise ConfigError(f"inference: speed config {name!r}: prompt_len + decode_steps "
                              f"> seq_len {cfg.seq_len}")
        bad = [f for f in spec.get("formats") or [] if f not in X.FORMATS]
        if bad:
            raise ConfigError(f"inference: speed config {name!r}: unknown format(s) {bad}; "
                              f"valid: {', '.join(X.FORMATS)}")


# ---------------------------------------------------------------------------- lowering


def lowering(fmt: X.ExportFormat, hlo_text: str, platform: str | None = None) -> str:
    """How ``fmt``'s products run in a program compiled for ``platform`` (by default
    :func:`repro.hardware.platform`), read by :mod:`repro.studies.lowering`."""
    platform = platform or hardware.platform()
    if fmt.gemm == "fp8":
        return L.fp8_lowering(hlo_text, platform)
    if fmt.gemm == "int8":
        return L.int8_lowering(hlo_text, platform)
    if fmt.gemm == "dequant-bf16":
        return L.dequant_lowering(hlo_text, platform)
    return "bf16"


def speed_emulated(fmt: X.ExportFormat, low: str, hw=None) -> bool:
    """Whether a timing of ``fmt`` measures something other than the format on its tensor
    cores (see the module docstring); weight-only FP8/INT8 on a GPU is never emulated (its
    GEMM is BF16 by design; ``lowering`` says whether the dequantization was fused)."""
    hw = hw or hardware.detect()
    if hw.backend == "tpu":
        return _tpu_emulated(fmt, low, hw)
    if hw.backend != "gpu":
        return fmt.name != "bf16"
    if not fmt.hopper and not hw.has_fp4:
        return True
    if fmt.gemm == "fp8":
        return not hw.has_fp8 or low not in L.NATIVE_FP8
    if fmt.gemm == "int8":
        return low != "s8-gemm"
    return False


def _tpu_emulated(fmt: X.ExportFormat, low: str, hw) -> bool:
    """:func:`speed_emulated` on a TPU: INT8 is native where the MXU multiplied ``s8 x s8 ->
    s32``, FP8 only on a chip with FP8 arithmetic that ran an f8 x f8 dot, weight-only
    FP8/INT8 never emulated (its GEMM is BF16 by design, as on a GPU), NVFP4 without FP4."""
    if fmt.name == "bf16":
        return False
    if fmt.gemm == "dequant-bf16":
        return not fmt.hopper and not hw.has_fp4
    if fmt.gemm == "int8":
        return not hw.has_int8 or low != "s8-gemm"
    if fmt.gemm == "fp8":
        return not hw.has_fp8 or low not in L.NATIVE_FP8
    return True


def quality_emulated(fmt: X.ExportFormat, hw=None) -> bool:
    """The label of accuracy records: the numbers are the format's either way (qwix computes
    with the quantized values), the label says whether this device has its tensor cores."""
    hw = hw or hardware.detect()
    if fmt.name == "bf16":
        return False
    if fmt.gemm == "dequant-bf16":
        return not fmt.hopper and not hw.has_fp4
    if hw.backend == "tpu":
        return not (hw.has_int8 if fmt.gemm == "int8" else hw.has_fp8)
    return hw.backend != "gpu" or (fmt.gemm == "fp8" and not hw.has_fp8)


# ------------------------------------------------------------------------------ timing


@functools.lru_cache(maxsize=4)
def _params(cfg: M.LMConfig):
    """Untrained FP32 parameters of ``cfg`` (seed 0), shared by a config's cells."""
    model = M.Decoder(cfg, "bf16")
    return jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]


@functools.lru_cache(maxsize=16)
def _export(cfg: M.LMConfig, fmt: str) -> X.Exported:
    calib = [jax.random.randint(jax.random.key(i), (2, cfg.seq_len), 0, cfg.vocab_size)
             for i in range(2)]
    return Q.export_lm(cfg, _params(cfg), fmt, calib_batches=calib)


@functools.lru_cache(maxsize=64)
def _program(cfg: M.LMConfig, fmt: str, phase: str, batch: int, length: int, steps: int):
    """``(compiled, args, tokens, facts)`` of one phase: "prefill" (``length`` tokens) or
    "decode" (``steps`` tokens per sequence after a ``length``-token prefix)."""
    ex = _export(cfg, fmt)
    if phase == "prefill":
        fn = jax.jit(functools.partial(G.prefill, ex.model))
        args = (ex.variables, jnp.zeros((batch, length), jnp.int32),
                G.init_cache(ex.model, batch, length))
        tokens = batch * length
    else:
        fn = G.decode_loop(ex.model, steps)
        args = (ex.variables, G.init_cache(ex.model, batch, length + steps),
                jnp.zeros((batch,), jnp.int32), jnp.int32(length), jax.random.key(0))
        tokens = batch * steps
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    facts = L.compiled_facts(compiled)
    facts["compile_s"] = round(time.perf_counter() - t0, 3)
    text = compiled.as_text() or ""
    facts["lowering"] = lowering(ex.fmt, text)
    facts["weight_storage"] = weight_storage(text)
    return compiled, args, tokens, facts


def interleaved(runs: dict[str, Any], repeats: int, warmup: int = 2) -> dict[str, np.ndarray]:
    """Seconds per call of each zero-argument ``run``, timed in rounds (A, B, A, B, ...)
    after ``warmup`` untimed calls each, every call ended by ``jax.block_until_ready``."""
    for run in runs.values():
        for _ in range(warmup):
            jax.block_until_ready(run())
    out: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for k, run in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run())
            out[k].append(time.perf_counter() - t0)
    return {k: np.asarray(v) for k, v in out.items()}


def _phase_record(fmt: X.ExportFormat, cfg, phase, batch, progs, samples, p, wb) -> dict:
    (_, _, tokens, f_bf16), (_, _, _, f_fmt) = progs["bf16"], progs[fmt.name]
    tps = {k: tokens / s for k, s in samples.items()}
    q1, med, q3 = (float(np.percentile(tps[fmt.name], q)) for q in (25, 50, 75))
    bf16_med = float(np.median(tps["bf16"]))
    sizes = {"config": cfg.name, "phase": phase, "batch": batch, "d_model": cfg.d_model,
             "n_layers": cfg.n_layers, "params": M.param_count(cfg)}
    sp = p["speed"]
    sizes.update({"seq_len": cfg.seq_len} if phase == "prefill" else
                 {"prompt_len": sp["prompt_len"], "steps": sp["decode_steps"]})
    extra = {"bf16_tokens_per_s": bf16_med, "speedup": med / bf16_med,
             "speedup_samples": (tps[fmt.name] / tps["bf16"]).round(4).tolist(),
             "lowering": f_fmt["lowering"], "weight_storage": f_fmt["weight_storage"],
             "gemm": fmt.gemm, "maxtext": fmt.maxtext,
             "granularity": fmt.granularity, "kernel": fmt.kernel,
             "program_bytes": f_fmt["memory_bytes"], "bf16_program_bytes": f_bf16["memory_bytes"],
             "compile_s": f_fmt["compile_s"], "fp8_gemm_calls": f_fmt["fp8_gemm_calls"],
             "weight_bytes": wb["bytes"], "weight_ratio_to_bf16": wb["ratio_to_bf16"],
             "samples_s": samples[fmt.name].round(6).tolist(),
             "bf16_samples_s": samples["bf16"].round(6).tolist()}
    return results.make_record(
        EXPERIMENT, f"{phase}_tokens_per_s", med, "tokens/s", claims=CLAIMS, recipe=fmt.name,
        sizes=sizes, repeats=len(samples[fmt.name]), spread=q3 - q1,
        emulated=speed_emulated(fmt, f_fmt["lowering"]), profile=p["profile"], extra=extra)


def speed(p: dict[str, Any], config: str, fmt_name: str) -> list[dict]:
    """The records of one ``speed_<config>_<format>`` cell (see the module docstring)."""
    spec = speed_configs(p)[config]
    cfg, fmt, sp = model_config(config, spec), X.resolve_format(fmt_name), p["speed"]
    wb = X.weight_bytes(_export(cfg, fmt_name))
    phases = [("prefill", int(spec.get("prefill_batch", 1)), cfg.seq_len)]
    phases += [("decode", int(b), sp["prompt_len"]) for b in sp["decode_batches"]]
    recs = []
    for phase, batch, length in phases:
        progs = {f: _program(cfg, f, phase, batch, length, sp["decode_steps"])
                 for f in ("bf16", fmt_name)}
        runs = {f: functools.partial(c, *a) for f, (c, a, _, _) in progs.items()}
        samples = interleaved(runs, int(sp["repeats"]))
        recs.append(_phase_record(fmt, cfg, phase, batch, progs, samples, p, wb))
    return recs
