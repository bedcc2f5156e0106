"""Claim B6: the trained decoder LM served in FP8 and INT8 (and weight-only FP8 / INT8 / NVFP4):
accuracy against BF16, prefill and decode speed, and memory.

    repro record inference --profile smoke    # tiny model, CPU, under a minute (build/results/)
    repro record inference --profile full     # 20m model + a wide config on a GPU (results/)
    REPRO_TIME_BUDGET_S=420 repro record inference --profile full   # stop cleanly, resume later

Two kinds of cells (``repro.studies.runner``), in an order that gives a verdict early:

* ``quality_s<seed>``: train the LM in BF16 (``repro.models.lm_train``, orbax checkpoints under
  ``build/lm_checkpoints/inference/``), pick the step with the best held-out loss (a second,
  truncated run to that step when it is not the last: training is deterministic), load that
  checkpoint, export it in every format (``repro.models.lm_quantize``; each export saved and
  restored through orbax) and evaluate every format against BF16 on fixed held-out windows:
  loss (nats per byte) and bits per byte, KL(BF16 || format) and top-1 agreement of the
  next-token distributions, and the exact bytes of the weights.
* ``speed_<config>_<format>``: the format and BF16 on the same untrained weights (speed does
  not depend on training), compiled and timed in rounds (BF16, format, BF16, format, ...):
  prefill tokens/s at the config's training shape and decode tokens/s with the KV cache at
  each batch (``repro.models.lm_decode``). Each record carries the compiled program's lowering
  (:mod:`repro.experiments.inference.speed`): a record whose FP8 / INT8 products did not become
  FP8 / INT8 GEMMs, NVFP4 (no FP4 tensor cores on Hopper) and everything on a CPU are
  ``emulated=True`` and stay out of speed verdicts.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from repro import hardware, results
from repro.config import ConfigError, Section, check_mapping, positive
from repro.experiments.inference import speed as S
from repro.models import lm as M
from repro.models import lm_data as D
from repro.models import lm_quantize as Q
from repro.models import lm_train as T
from repro.precision import export as X
from repro.program import Program
from repro.studies.runner import Cell, Study

EXPERIMENT = "inference"
CLAIMS = ("B6",)


# ------------------------------------------------------------------------------ params


def formats(p: dict[str, Any]) -> list[str]:
    names = p.get("formats") or []
    if isinstance(names, str) or not names:
        raise ConfigError(f"{EXPERIMENT}: formats must be a non-empty list, got {names!r}")
    bad = [n for n in names if n not in X.FORMATS]
    if bad:
        raise ConfigError(f"{EXPERIMENT}: unknown format(s) {', '.join(map(str, bad))}; "
                          f"valid: {', '.join(X.FORMATS)}")
    if "bf16" not in names:
        raise ConfigError(f"{EXPERIMENT}: formats must include bf16, the reference")
    return list(dict.fromkeys(names))


def train_config(p: dict[str, Any]) -> T.TrainConfig:
    t = dict(p.get("train") or {})
    known = {f for f in T.TrainConfig.__dataclass_fields__ if f not in ("seed", "eval_extra")}
    bad = sorted(set(t) - known)
    if bad:
        raise ConfigError(f"{EXPERIMENT}: unknown train field(s) {bad}; valid: {sorted(known)}")
    return T.TrainConfig(**t)


@dataclass(frozen=True, kw_only=True)
class Schema(Section):
    """What ``params.yaml``'s ``inference`` section may hold (the study reads it as a mapping)."""

    formats: tuple[str, ...]
    priority: tuple[str, ...] = ()
    margins: dict[str, float] = positive(default_factory=dict)
    calib_batches: int = positive(2)
    model: str
    train: dict[str, Any]
    seeds: tuple[int, ...]
    eval_windows: int = positive(4)
    speed: dict[str, Any]
    checkpoints: str | None = None


def check(p: dict[str, Any]) -> None:
    """Every parameter a run needs, before the first cell (one-line ConfigError)."""
    check_mapping(p, Schema, f"params.yaml: inference.{p.get('profile')}")
    formats(p)
    train_config(p)
    if p.get("model") not in M.PRESETS:
        raise ConfigError(f"{EXPERIMENT}: unknown model {p.get('model')!r}; presets: "
                          f"{', '.join(M.PRESETS)}")
    if not p.get("seeds"):
        raise ConfigError(f"{EXPERIMENT}: seeds must be a non-empty list")
    S.check_speed(p)


# ----------------------------------------------------------------------------- quality


def ckpt_dir(p: dict[str, Any], cell: str) -> Path:
    """Where a cell's training run checkpoints (``checkpoints``: default build/lm_checkpoints)."""
    root = Path(p.get("checkpoints") or results.repo_root() / "build" / "lm_checkpoints")
    return root / "inference" / hardware.detect().slug / p["profile"] / cell


def best_step(history: list[dict]) -> int:
    """The step of the lowest held-out loss (the earliest of equal ones)."""
    losses = [h["eval_loss"] for h in history]
    return int(history[int(np.nanargmin(losses))]["step"])


def train_best(cfg: M.LMConfig, tc: T.TrainConfig, where: Path, budget: float | None,
               progress: bool = False):
    """``(variables, history, best)``: the BF16 LM trained by ``tc``, loaded from its orbax
    checkpoint at the step of its best held-out loss; None when the time budget stopped it
    (the next call resumes from the checkpoint)."""
    full = T.train(cfg, tc, "bf16", ckpt_dir=where / "full", time_budget_s=budget,
                   progress=progress, desc=f"{cfg.name} s{tc.seed}")
    if not full.finished:
        return None
    best = best_step(full.eval_history)
    ckpt = where / "full"
    if best != full.steps_done:  # the same run truncated at its best step
        cut = T.train(cfg, tc, "bf16", ckpt_dir=where / "best", stop_at=best, progress=progress)
        if not cut.finished:
            return None
        ckpt = where / "best"
    return Q.load_trained(ckpt, cfg, tc), full.eval_history, best


@functools.lru_cache(maxsize=32)
def _log_probs(model):
    """A jitted ``(variables, x) -> log-probabilities`` of the next token (FP32)."""
    return jax.jit(lambda v, x: jax.nn.log_softmax(model.apply(v, x).astype(jnp.float32), -1))


@functools.lru_cache(maxsize=32)
def _metrics(model):
    """A jitted ``(variables, x, y, lp_bf16) -> (loss, loss_bf16, kl, top1)``: token means of
    the format's and BF16's next-token loss (nats), KL(BF16 || format) and the share of
    tokens whose most likely next token agrees with BF16's."""
    def f(v, x, y, lb):
        lq = jax.nn.log_softmax(model.apply(v, x).astype(jnp.float32), axis=-1)
        nll = [-jnp.mean(jnp.take_along_axis(lp, y[..., None], axis=-1)) for lp in (lq, lb)]
        kl = jnp.mean(jnp.sum(jnp.exp(lb) * (lb - lq), axis=-1))
        top1 = jnp.mean(jnp.argmax(lb, -1) == jnp.argmax(lq, -1))
        return nll[0], nll[1], kl, top1
    return jax.jit(f)


def evaluate(base: X.Exported, ex: X.Exported, windows) -> dict[str, float]:
    """Means over the held-out ``windows`` (equal-sized ``(x, y)`` batches)."""
    lp, f = _log_probs(base.model), _metrics(ex.model)
    vals = []
    for x, y in windows:
        x, y = jnp.asarray(x), jnp.asarray(y)
        vals.append([float(v) for v in f(ex.variables, x, y, lp(base.variables, x))])
    loss, loss_bf16, kl, top1 = np.asarray(vals).mean(axis=0)
    return {"loss": loss, "loss_bf16": loss_bf16, "kl": kl, "top1": top1}


def _quality_records(fmt: X.ExportFormat, m: dict, wb: dict, disk: int, sizes: dict,
                     profile: str, extra: dict) -> list[dict]:
    rel = m["loss"] / m["loss_bf16"] - 1.0
    common = dict(claims=CLAIMS, recipe=fmt.name, sizes=sizes, profile=profile,
                  emulated=S.quality_emulated(fmt))
    ex = {**extra, "loss_bf16": m["loss_bf16"], "rel_gap": rel, "gemm": fmt.gemm,
          "maxtext": fmt.maxtext}
    mk = results.make_record
    return [
        mk(EXPERIMENT, "heldout_loss", m["loss"], "nats/byte", extra=ex, **common),
        mk(EXPERIMENT, "bits_per_byte", m["loss"] / math.log(2), "bits/byte", extra=ex,
           **common),
        mk(EXPERIMENT, "kl_to_bf16", m["kl"], "nats/token", extra=ex, **common),
        mk(EXPERIMENT, "top1_agreement", m["top1"], "fraction", extra=ex, **common),
        mk(EXPERIMENT, "weight_bytes", wb["bytes"], "bytes",
           extra={**ex, **wb, "checkpoint_bytes_on_disk": disk,
                  "note": "each array at its format's width (4-bit two to a byte, NVFP4 "
                          "block scales E4M3); in_memory: as the arrays run"}, **common),
    ]


def quality(p: dict[str, Any], seed: int, budget: float | None) -> list[dict] | None:
    """The records of one ``quality_s<seed>`` cell; None when stopped by the time budget."""
    cfg, tc = M.get_config(p["model"]), train_config(p).replace(seed=seed)
    profile, cell = p["profile"], f"quality_s{seed}"
    where = ckpt_dir(p, cell)
    trained = train_best(cfg, tc, where, budget)
    if trained is None:
        return None
    variables, history, best = trained
    splits = D.load_splits()
    windows = D.heldout_batches(splits.heldout, cfg.seq_len, tc.batch_size,
                                int(p.get("eval_windows", 4)))
    calib = [jnp.asarray(D.train_batch(splits.train, i, tc.batch_size, cfg.seq_len, seed)[0])
             for i in range(int(p.get("calib_batches", 2)))]
    sizes = {"model": cfg.name, "seed": seed, "step": best, "steps": tc.steps,
             "params": M.param_count(cfg), "eval_tokens": len(windows) * tc.batch_size
             * cfg.seq_len}
    extra = {"best_step": best, "curve": {int(h["step"]): h["eval_loss"] for h in history}}
    base = Q.export_lm(cfg, variables["params"], "bf16")
    recs = []
    for name in formats(p):
        fmt = X.resolve_format(name)
        ex = Q.export_lm(cfg, variables["params"], fmt, calib_batches=calib)
        disk = X.save(where / "export" / name, ex)
        ex = X.load(where / "export" / name, ex)
        m = evaluate(base, ex, windows)
        recs += _quality_records(fmt, m, X.weight_bytes(ex), disk, sizes, profile, extra)
    T.remove_checkpoints(where)
    return recs


# ----------------------------------------------------------------------------- programs


def program(fmt: str, kind: str, *, model: str | None = None, train: dict | None = None,
            seed: int = 0, eval_windows: int = 4, calib_batches: int = 2,
            config: str | None = None, spec: dict | None = None,
            phases: list | None = None, decode_steps: int = 1,
            reference: bool = True) -> Program:
    """What a record of format ``fmt`` measures, traced on abstract arguments.

    ``kind`` "quality" (cell ``quality_s<seed>``): the BF16 LM of ``model`` trained by
    ``train`` (TrainConfig fields but the seed): initialisation, training step and held-out
    evaluation; its parameters exported as ``fmt`` (calibrated on ``calib_batches`` batches)
    and as BF16, and the metrics of ``fmt`` against BF16 on one held-out window; as
    constants, the settings and a digest of the data (corpus file, first training batch,
    held-out windows, calibration batches); the kit: the training loop, the selection of the
    best step, the export's round trip and bytes, the evaluation loop.

    ``kind`` "speed" (cell ``speed_<config>_<fmt>``): for each ``(phase, batch, length)`` of
    ``phases`` ("prefill": ``length`` tokens; "decode": ``decode_steps`` tokens after a
    ``length``-token prefix), BF16's and ``fmt``'s export of the untrained ``config`` (speed
    config ``spec``) and the prefill or decode loop as :mod:`repro.experiments.inference.speed`
    compiles and times it (``reference=False``: ``fmt``'s alone, as ``repro trace inference``
    times it)."""
    import functools
    import hashlib
    import json

    from repro.experiments.inference import speed as S
    from repro.models import lm as M
    from repro.models import lm_data as D
    from repro.models import lm_decode as G
    from repro.models import lm_quantize as Q
    from repro.models import lm_train as T
    from repro.precision import export as X
    from repro.precision.recipes import resolve

    def exported(cfg, params, f, calib=None):
        """``Q.export_lm``, its cached helpers filled first outside this trace (their
        arguments would be traced into the program on a cache miss only)."""
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, calib))
        jax.eval_shape(lambda p, c: Q.export_lm(cfg, p, f, calib_batches=c).variables, *abstract)
        return Q.export_lm(cfg, params, f, calib_batches=calib)

    if kind == "speed":
        cfg = S.model_config(config, dict(spec or {}))
        model = M.Decoder(cfg, "bf16")
        params = jax.eval_shape(model.init, jax.random.key(0),
                                jax.ShapeDtypeStruct((1, 16), jnp.int32))["params"]

        def timed(params):
            calib = [jax.random.randint(jax.random.key(i), (2, cfg.seq_len), 0, cfg.vocab_size)
                     for i in range(2)]
            out = []
            for f in dict.fromkeys(("bf16", fmt) if reference else (fmt,)):
                ex = exported(cfg, params, f, calib)
                for phase, batch, length in phases:
                    if phase == "prefill":
                        fn = jax.jit(functools.partial(G.prefill, ex.model))
                        out.append(fn(ex.variables, jnp.zeros((batch, length), jnp.int32),
                                      G.init_cache(ex.model, batch, length)))
                    else:
                        fn = G.decode_loop(ex.model, decode_steps)
                        out.append(fn(ex.variables, G.init_cache(ex.model, batch,
                                                                 length + decode_steps),
                                      jnp.zeros((batch,), jnp.int32), jnp.int32(length),
                                      jax.random.key(0)))
            return out

        # the kit: what shapes the numbers outside the traced program (the interleaved timing,
        # the weight bytes reported); how the program is built is in its trace already
        return Program(timed, (params,), kit=(S.interleaved, X.weight_bytes))

    cfg = M.get_config(model)
    t = dict(train or {})
    fields = T.TrainConfig.__dataclass_fields__
    tc = T.TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()
                          if k in fields and k != "seed"})
    init, step, evaluate_ = T._raw_functions(cfg, resolve("bf16"), T._static_key(tc))
    setup = json.dumps({"train": t, "seed": seed, "eval_windows": eval_windows,
                        "calib_batches": calib_batches}, sort_keys=True)

    def trained_and_exported(seed_, x, y, step_i, ex, ey, calib, wx, wy):
        variables, opt_state = init(seed_, x)
        variables, opt_state, loss = step(variables, opt_state, x, y, seed_, step_i)
        params = variables["params"]
        base = exported(cfg, params, "bf16")
        out = exported(cfg, params, fmt, list(calib))
        metrics = _metrics(out.model)(out.variables, wx, wy,
                                      _log_probs(base.model)(base.variables, wx))
        data = hashlib.sha256()
        with open(D.corpus_path(), "rb") as f:  # opened here: a trace's files name it
            data.update(f.read())
        splits = D.load_splits()
        arrays = [*D.train_batch(splits.train, 0, tc.batch_size, cfg.seq_len, seed)]
        for n in (max(1, tc.eval_batches), eval_windows):
            arrays += [w for xy in D.heldout_batches(splits.heldout, cfg.seq_len,
                                                     tc.batch_size, n) for w in xy]
        arrays += [D.train_batch(splits.train, i, tc.batch_size, cfg.seq_len, seed)[0]
                   for i in range(calib_batches)]
        for a in arrays:
            data.update(np.ascontiguousarray(a).tobytes())
        digests = [np.frombuffer(b, np.uint8) for b in (data.digest(), setup.encode())]
        return (loss, evaluate_(variables, ex, ey), out.variables, metrics,
                *map(jnp.asarray, digests))

    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    batch = jax.ShapeDtypeStruct((tc.batch_size, cfg.seq_len), jnp.int32)
    return Program(trained_and_exported, (i32, batch, batch, i32, batch, batch,
                                          (batch,) * calib_batches, batch, batch),
                   kit=(T.train, T.TrainConfig.eval_steps, D.train_batch, D.heldout_batches,
                        train_best, best_step, Q.load_trained, X.save, X.load, X.weight_bytes,
                        evaluate))


def _speed_phases(p: dict[str, Any], config: str) -> list[list]:
    """``[phase, batch, length]`` of a speed cell, in the order it times them."""
    spec, sp = S.speed_configs(p)[config], p["speed"]
    cfg = S.model_config(config, spec)
    return ([["prefill", int(spec.get("prefill_batch", 1)), cfg.seq_len]]
            + [["decode", int(b), int(sp["prompt_len"])] for b in sp["decode_batches"]])


def _quality_settings(p: dict[str, Any], seed: int) -> dict[str, Any]:
    tc = train_config(p)
    t = {k: getattr(tc, k) for k in T.TrainConfig.__dataclass_fields__ if k != "seed"}
    t["eval_extra"] = [int(s) for s in tc.eval_extra]
    return {"kind": "quality", "model": p["model"], "train": t, "seed": int(seed),
            "eval_windows": int(p.get("eval_windows", 4)),
            "calib_batches": int(p.get("calib_batches", 2))}


def _speed_settings(p: dict[str, Any], config: str) -> dict[str, Any]:
    return {"kind": "speed", "config": config, "spec": dict(S.speed_configs(p)[config]),
            "phases": _speed_phases(p, config), "decode_steps": int(p["speed"]["decode_steps"])}


def program_settings(rec: dict) -> dict | None:
    """:func:`program`'s settings of a record: the format (``recipe``) and what the record
    says of its cell (quality: model, seed, steps, held-out windows; speed: config, phase,
    batch, shapes), the rest (training config, calibration batches, the cell's other phases)
    from params.yaml's inference settings of the record's profile; None where those
    disagree with the record or are missing."""
    from repro import studies

    sizes, fmt = rec.get("sizes") or {}, rec.get("recipe")
    if fmt not in X.FORMATS:
        return None
    try:
        p = studies.params(EXPERIMENT, str(rec.get("profile") or "full"))
    except Exception:  # noqa: BLE001 - no such profile: not derivable
        return None
    if "phase" in sizes:
        config = sizes.get("config")
        if config not in S.speed_configs(p):
            return None
        out = _speed_settings(p, config)
        cfg = S.model_config(config, out["spec"])
        want = {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "params": M.param_count(cfg)}
        if any(k in sizes and sizes[k] != v for k, v in want.items()):
            return None
        length = sizes.get("seq_len") if sizes["phase"] == "prefill" else sizes.get(
            "prompt_len")
        if [sizes["phase"], sizes.get("batch"), length] not in out["phases"]:
            return None
        if sizes["phase"] == "decode" and sizes.get("steps") != out["decode_steps"]:
            return None
        return {"fmt": fmt, **out}
    if "seed" not in sizes or sizes.get("model") != p.get("model"):
        return None
    out = _quality_settings(p, int(sizes["seed"]))
    if "steps" in sizes:
        out["train"]["steps"] = int(sizes["steps"])
    cfg = M.get_config(out["model"])
    if sizes.get("eval_tokens"):
        out["eval_windows"] = int(sizes["eval_tokens"]) // (out["train"]["batch_size"]
                                                            * cfg.seq_len)
    return {"fmt": fmt, **out}


# ------------------------------------------------------------------------------- study


def cells(p: dict[str, Any]) -> list[Cell]:
    """Quality of the first seed, then the first speed config's priority formats, the other
    seeds, the first config's other formats and the other configs: a call cut short still
    has every part of the verdict from the first seed and the first config."""
    fmts = [f for f in formats(p) if f != "bf16"]
    seeds = [int(s) for s in p["seeds"]]
    timed = {c: S.config_formats(p, c, fmts) for c in S.speed_configs(p)}
    first = next(iter(timed), None)
    prio = [f for f in p.get("priority", fmts) if first and f in timed[first]]

    def q(seed):
        return Cell(f"quality_s{seed}", lambda left: quality(p, seed, left), tuple(formats(p)),
                    programs=lambda: {f: program(f, **_quality_settings(p, seed))
                                      for f in formats(p)})

    def s(config, fmt):
        return Cell(f"speed_{config}_{fmt}", lambda left: S.speed(p, config, fmt), (fmt,),
                    programs=lambda: {fmt: program(fmt, **_speed_settings(p, config))})

    out = [q(seeds[0])] + [s(first, f) for f in prio]
    out += [q(seed) for seed in seeds[1:]]
    out += [s(c, f) for c, fs in timed.items() for f in fs if c != first or f not in prio]
    return out


STUDY = Study(EXPERIMENT, CLAIMS, cells, check=check,
              about="B6: FP8/INT8 post-training quantization of the LM: accuracy, speed, memory",
              data=("repro/data/lm_corpus.txt.gz",))
