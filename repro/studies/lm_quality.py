"""Claims B3/B4: the decoder LM trained under each recipe, and the bytes its tensors take.

    repro record lm --profile smoke          # tiny model, CPU, minutes (build/results/)
    repro record lm --profile full           # 20m and 120m on a GPU (results/), resumable
    REPRO_TIME_BUDGET_S=420 repro record lm --profile full   # stop cleanly after ~7 minutes

One resumable cell per (model size, variant, seed): the held-out loss curve (``eval_loss`` at
several steps), ``final_eval_loss``, ``tokens_per_s`` and the compiled step's memory. A
variant is a recipe plus, for the ablations, one change (:data:`VARIANTS`). Unfinished runs
checkpoint under ``build/lm_checkpoints/`` (``REPRO_LM_CKPT_DIR``) and the next call resumes
them, so one long run can span several time-limited jobs. A cell per (size, variant) holds the
stored bytes of weights and activations (claim B3), computed from the quantized tensors' own
dtypes and scale shapes (``jax.eval_shape`` of ``repro.precision.formats``' quantizers). A run spec's
``stop_at: {variant: step}`` truncates that variant's runs on purpose (the whole run's
schedule, ended early; ``truncated_at`` in the records): for a reference recipe too slow to
train in full, compared over the evaluations up to there.

Quality numbers of emulated recipes are valid (the numerics are bit-faithful to the formats);
their speed is not (``emulated=True`` in the records).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from repro import hardware, results
from repro.config import stage_params
from repro.models import lm as M
from repro.models import lm_train as T
from repro.precision import formats as F
from repro.precision import ops
from repro.precision.recipes import Recipe, resolve

EXPERIMENT = "lm"

CLAIMS = ("B3", "B4")


def select_variants(names: Iterable[str] | None = None,
                    recipes: Iterable[str] | None = None) -> list[Recipe]:
    """Registry entries by name; ``recipes`` (as ``repro record --recipe``) keeps the entries
    of those names or built on them (``nvfp4`` keeps every NVFP4 ablation)."""
    out = [resolve(n) for n in (names if names is not None else ["bf16", "nvfp4"])]
    if recipes is not None:
        keep = set(recipes)
        out = [r for r in out if r.family in keep or r.name in keep]
    return out


def _bits(dtype) -> int:
    dt = jnp.dtype(dtype)
    return jnp.finfo(dt).bits if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).bits


def _nbytes(*arrays) -> float:
    return sum(math.prod(a.shape) * _bits(a.dtype) / 8 for a in arrays)


def tensor_bytes(shape: tuple[int, ...], recipe, role: str) -> float:
    """Bytes of one stored tensor in the format ``recipe`` puts it in for a GEMM.

    ``role``: "weight" (NVFP4 16x16 blocks when ``weight_block_2d``; MXFP8 32-blocks along
    the contraction axis) or "activation" (1x16 / 1x32 blocks along the last axis). Computed
    from the quantizers' output dtypes and scale shapes, e.g. NVFP4 = 4-bit E2M1 elements +
    one E4M3 byte per block + one FP32 per tensor. Per-tensor FP8: 1 byte + an FP32 scale.
    Dense recipes: the compute dtype (BF16 = 2 bytes).
    """
    spec = jax.ShapeDtypeStruct(tuple(shape), jnp.float32)
    if recipe.gemm == "nvfp4":
        block = (16, 16) if role == "weight" and recipe.weight_block_2d else (1, 16)
        t = jax.eval_shape(lambda a: F.nvfp4_quantize(a, block), spec)
        return _nbytes(t.q, t.block_scale, t.global_scale)
    if recipe.gemm == "mxfp8":
        axis = 0 if role == "weight" else -1
        t = jax.eval_shape(lambda a: F.mxfp8_quantize(a, axis=axis), spec)
        return _nbytes(t.q, t.scale)
    if recipe.gemm == "fp8":
        return _nbytes(jax.ShapeDtypeStruct(shape, jnp.dtype(recipe.fwd_dtype))) + 4
    return _nbytes(jax.ShapeDtypeStruct(shape, recipe.dtype))


def _linear_layers(cfg: M.LMConfig) -> list[tuple[str, str, int | None, int, int]]:
    """(name, kind, block, d_in, d_out) of every linear layer."""
    d, f = cfg.d_model, cfg.d_ff
    shapes = {"attn_qkv": (d, 3 * d), "attn_out": (d, d), "mlp_in": (d, 2 * f),
              "mlp_out": (f, d)}
    out = [(f"block{i}/{k}", k, i, *shapes[k]) for i in range(cfg.n_layers)
           for k in M.BLOCK_LINEAR_KINDS]
    return out + [("head", "head", None, d, cfg.vocab_size)]


def stored_bytes(cfg: M.LMConfig, recipe: Recipe, tokens: int) -> dict[str, float]:
    """Stored bytes of the GEMM operands under ``recipe``'s policy, and the BF16 baseline.

    weights: every linear layer's weight in its layer recipe's format, plus the embedding
    table (BF16 in every recipe); activations: the input of every linear layer for ``tokens``
    tokens (what the backward pass keeps). ``*_quantized_only``: the same over the layers the
    policy quantizes, i.e. the format's own ratio.
    """
    bf16 = resolve("bf16")
    emb = tensor_bytes((cfg.vocab_size, cfg.d_model), bf16, "weight")
    out = {"weight_bytes": emb, "weight_bytes_bf16": emb, "activation_bytes": 0.0,
           "activation_bytes_bf16": 0.0, "weight_bytes_quantized_only": 0.0,
           "weight_bytes_quantized_only_bf16": 0.0, "activation_bytes_quantized_only": 0.0,
           "activation_bytes_quantized_only_bf16": 0.0, "quantized_layers": 0,
           "linear_layers": 0}
    for _, kind, block, d_in, d_out in _linear_layers(cfg):
        r = M.layer_recipe(recipe, kind, block, cfg)
        w, w16 = tensor_bytes((d_in, d_out), r, "weight"), tensor_bytes((d_in, d_out), bf16,
                                                                       "weight")
        a, a16 = tensor_bytes((tokens, d_in), r, "activation"), tensor_bytes((tokens, d_in),
                                                                            bf16, "activation")
        out["weight_bytes"] += w
        out["weight_bytes_bf16"] += w16
        out["activation_bytes"] += a
        out["activation_bytes_bf16"] += a16
        out["linear_layers"] += 1
        if r.quantized:
            out["quantized_layers"] += 1
            out["weight_bytes_quantized_only"] += w
            out["weight_bytes_quantized_only_bf16"] += w16
            out["activation_bytes_quantized_only"] += a
            out["activation_bytes_quantized_only_bf16"] += a16
    return out


def ckpt_root() -> Path:
    return Path(os.environ.get("REPRO_LM_CKPT_DIR",
                               results.repo_root() / "build" / "lm_checkpoints"))


@dataclass
class Run:
    size: str
    train: T.TrainConfig
    variants: list[Recipe]
    seeds: list[int] = field(default_factory=list)
    # variant -> step at which its runs end on purpose (train's ``stop_at``): a truncated run
    # under the whole run's schedule, for a reference too slow to train in full
    stop_at: dict[str, int] = field(default_factory=dict)


def early_eval_steps(start: int, stop: int, n: int) -> tuple[int, ...]:
    """``n`` log-spaced steps in ``[start, stop)``: evaluations before the first regular one.

    A run that makes many epochs over the small corpus overfits early (notebook 05), and its
    best held-out loss falls before the first of ``eval_points`` evenly spaced evaluations.
    """
    if n <= 0 or stop <= start:
        return ()
    pts = np.geomspace(max(1, start), stop, n + 1)[:-1]
    return tuple(sorted({int(round(x)) for x in pts} - {stop}))


def plan(profile: str, variants: Iterable[str] | None = None,
         recipes: Iterable[str] | None = None, sizes: Iterable[str] | None = None,
         seeds: Iterable[int] | None = None, params: dict | None = None) -> list[Run]:
    """The runs of a profile from params.yaml's ``lm`` section (optionally filtered)."""
    p = params if params is not None else stage_params("lm", profile)
    default_variants = p.get("variants", ["bf16", "nvfp4"])
    runs = []
    for spec in p["runs"]:
        if sizes is not None and spec["size"] not in set(sizes):
            continue
        cfg = M.get_config(spec["size"])
        tokens_per_step = spec["batch_size"] * cfg.seq_len
        if "steps" in spec:
            steps = int(spec["steps"])
        else:
            steps = math.ceil(spec["tokens_per_param"] * M.param_count(cfg) / tokens_per_step)
        n_points = int(p.get("eval_points", 5))
        warmup = int(spec.get("warmup_steps", max(1, steps // 20)))
        tc = T.TrainConfig(
            steps=steps, batch_size=int(spec["batch_size"]), lr=float(spec["lr"]),
            warmup_steps=warmup,
            min_lr_ratio=float(p.get("min_lr_ratio", 0.1)),
            weight_decay=float(p.get("weight_decay", 0.1)),
            eval_every=max(1, steps // n_points),
            eval_extra=early_eval_steps(warmup, max(1, steps // n_points),
                                        int(p.get("eval_log_points", 0))),
            eval_batches=int(p.get("eval_batches", 4)),
            checkpoint_every=int(spec.get("checkpoint_every", 0)))
        names = [n for n in spec.get("variants", default_variants)
                 if variants is None or n in set(variants)]
        vs = select_variants(names, recipes)
        sd = [s for s in spec.get("seeds", [0]) if seeds is None or s in set(seeds)]
        stop_at = {str(k): int(v) for k, v in (spec.get("stop_at") or {}).items()}
        for name in stop_at:
            try:
                resolve(name)
            except ValueError as e:
                raise ValueError(f"lm run {spec['size']}: stop_at names an unknown variant: "
                                 f"{e}") from None
        runs.append(Run(spec["size"], tc, vs, sd, stop_at))
    return runs


def cell_order(run: Run, priority: Iterable[str] = ()) -> list[tuple[int, Recipe]]:
    """(seed, variant) in training order: the ``priority`` variants over all seeds first, then
    the rest seed by seed, so a study cut short is still balanced across seeds."""
    first = [v for v in run.variants if v.name in set(priority)]
    rest = [v for v in run.variants if v.name not in set(priority)]
    return [(s, v) for s in run.seeds for v in first] + [(s, v) for s in run.seeds for v in rest]


def cell_name(size: str, variant: str, seed: int) -> str:
    return f"{size}_{variant}_s{seed}"


def _train_records(run: Run, v: Recipe, seed: int, res: T.TrainResult, profile: str,
                   cfg: M.LMConfig) -> list[dict]:
    tc = run.train
    sizes = {"model": run.size, "params": res.n_params, "seed": seed, "steps": tc.steps,
             "batch_size": tc.batch_size, "seq_len": cfg.seq_len,
             "tokens": res.steps_done * res.tokens_per_step}
    common = dict(claims=CLAIMS, recipe=v.name, emulated=ops.is_emulated(v), profile=profile)
    extra = {"base_recipe": v.family, "ablation": v.about, "lr": tc.lr,
             "warmup_steps": tc.warmup_steps, "n_bf16_last_blocks": cfg.n_bf16_last_blocks,
             "scope": v.scope, "layer_recipes": M.recipe_map(v, cfg),
             "resumed_from": res.resumed_from, "tokens_per_param": round(
                 res.steps_done * res.tokens_per_step / res.n_params, 2)}
    if res.truncated_at is not None:  # a run ended on purpose before its schedule's end
        extra["truncated_at"] = res.truncated_at
    recs = []
    for h in res.eval_history:
        recs.append(results.make_record(
            EXPERIMENT, "eval_loss", h["eval_loss"], "nats/byte",
            sizes={**sizes, "step": h["step"], "tokens_seen": h["tokens"]},
            extra={**extra, "train_loss": h["train_loss"], "lr_at_step": h["lr"]}, **common))
    recs.append(results.make_record(EXPERIMENT, "final_eval_loss", res.final_eval_loss,
                                    "nats/byte", sizes=sizes, extra=extra, **common))
    recs.append(results.make_record(
        EXPERIMENT, "tokens_per_s", res.tokens_per_s, "tokens/s", sizes=sizes,
        extra={**extra, "note": "this process's steps only (a resumed run restarts the clock)"},
        **common))
    if res.compiled_memory:
        recs.append(results.make_record(
            EXPERIMENT, "compiled_step_bytes", res.compiled_memory["total_bytes"], "bytes",
            sizes=sizes, extra={**extra, **res.compiled_memory,
                                "note": "XLA memory analysis of the jitted train step "
                                        "(arguments + outputs + temporaries - aliased); "
                                        "emulated formats materialise dequantized copies"},
            **common))
    if res.peak_bytes_in_use is not None:
        recs.append(results.make_record(
            EXPERIMENT, "peak_bytes_in_use", res.peak_bytes_in_use, "bytes", sizes=sizes,
            extra={**extra, "note": "memory_stats() high-water mark of the whole process"},
            **common))
    return recs


def _memory_records(run: Run, v: Recipe, profile: str) -> list[dict]:
    cfg = M.get_config(run.size)
    tokens = run.train.batch_size * cfg.seq_len
    b = stored_bytes(cfg, v, tokens)
    sizes = {"model": run.size, "params": M.param_count(cfg), "tokens": tokens}
    common = dict(claims=("B3",), recipe=v.name, emulated=False, profile=profile)
    recs = []
    for what in ("weight", "activation"):
        for suffix in ("", "_quantized_only"):
            val, ref = b[f"{what}_bytes{suffix}"], b[f"{what}_bytes{suffix}_bf16"]
            recs.append(results.make_record(
                EXPERIMENT, f"stored_{what}_bytes{suffix}", val, "bytes", sizes=sizes,
                extra={"bf16_bytes": ref, "ratio_to_bf16": val / ref if ref else None,
                       "quantized_layers": b["quantized_layers"],
                       "linear_layers": b["linear_layers"], "base_recipe": v.family,
                       "note": "from the quantizers' dtypes and scale shapes; the same on "
                               "every device (not a measurement of an emulated run)"},
                **common))
    return recs


def record(profile: str, root: Path | None = None, force: bool = False,
           recipes: list[str] | None = None, variants: list[str] | None = None,
           sizes: list[str] | None = None, seeds: list[int] | None = None,
           time_budget_s: float | None = None, progress: bool = True) -> list[Path]:
    """Train every (size, variant, seed) cell not yet recorded; returns the files written.

    ``time_budget_s`` (default: ``REPRO_TIME_BUDGET_S``) stops the current run cleanly with a
    checkpoint when the budget is spent; the next call resumes it. ``force`` re-records cells
    that exist, from step 0; a re-record cut by its time budget resumes when ``force`` is given
    again (a marker beside its checkpoint says it is one). GPU-only variants are
    skipped with a message elsewhere.
    """
    root = Path(root) if root is not None else results.record_root(profile)
    if time_budget_s is None and os.environ.get("REPRO_TIME_BUDGET_S"):
        time_budget_s = float(os.environ["REPRO_TIME_BUDGET_S"])
    t_start = time.monotonic()
    runs = plan(profile, variants, recipes, sizes, seeds)
    priority = stage_params("lm", profile).get("priority", [])
    on_gpu = jax.default_backend() == "gpu"
    written: list[Path] = []
    for run in runs:
        for v in run.variants:
            if v.backend == "jax" and not on_gpu:
                continue
            cell = f"{run.size}_{v.name}_memory"
            if force or not results.have_cell(EXPERIMENT, cell, root=root):
                written.append(results.write_records(_memory_records(run, v, profile),
                                                     EXPERIMENT, cell, root=root))
    for run in runs:
        skipped = [v.name for v in run.variants if v.backend == "jax" and not on_gpu]
        if skipped:
            print(f"lm: skipping {', '.join(skipped)} on {jax.default_backend().upper()}: "
                  "jax.nn.scaled_dot_general (nvfp4) has no CPU lowering; GPU only")
        for seed, v in cell_order(run, priority):
            if v.backend == "jax" and not on_gpu:
                continue
            cell = cell_name(run.size, v.name, seed)
            if not force and results.have_cell(EXPERIMENT, cell, root=root):
                continue
            left = None
            if time_budget_s is not None:
                left = time_budget_s - (time.monotonic() - t_start)
                if left <= 0:
                    print(f"lm: time budget spent; stopping before {cell}")
                    return written
            cfg = M.get_config(run.size)
            tc = run.train.replace(seed=seed)
            ckpt = ckpt_root() / hardware.detect().slug / profile / cell
            forced = ckpt.parent / f"{cell}.forced"  # marks a re-record under way
            if force and not forced.exists():
                # A fresh re-record: drop any checkpoint of an earlier run. A re-record that
                # an earlier --force call left cut (time budget) resumes instead.
                T.remove_checkpoints(ckpt)
                forced.parent.mkdir(parents=True, exist_ok=True)
                forced.touch()
            res = T.train(cfg, tc, v, ckpt_dir=ckpt, time_budget_s=left,
                          stop_at=run.stop_at.get(v.name), progress=progress, desc=cell)
            if not res.finished:
                print(f"lm: {cell} stopped at step {res.steps_done}/"
                      f"{run.stop_at.get(v.name, tc.steps)} "
                      f"(checkpoint in {ckpt}); run again to resume")
                return written
            if res.final_eval_loss is None or not math.isfinite(res.final_eval_loss):
                warnings.warn(f"lm: {cell} ended with eval loss {res.final_eval_loss}",
                              stacklevel=2)
            if res.truncated_at is not None:
                print(f"lm: {cell} truncated at step {res.truncated_at} of {tc.steps} "
                      "(params.yaml stop_at): its best held-out loss is compared over the "
                      "evaluations up to there")
            recs = _train_records(run, v, seed, res, profile, cfg)
            written.append(results.write_records(recs, EXPERIMENT, cell, root=root))
            T.remove_checkpoints(ckpt)
            forced.unlink(missing_ok=True)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m repro.studies.lm_quality PROFILE [--sizes ..] [--variants ..] [--seeds ..]``:
    record a subset of the cells (e.g. one per GPU of a multi-GPU machine)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m repro.studies.lm_quality")
    ap.add_argument("profile", choices=["smoke", "full", "auto"])
    ap.add_argument("--sizes", nargs="*")
    ap.add_argument("--variants", nargs="*", help="recipe names (repro.precision)")
    ap.add_argument("--seeds", nargs="*", type=int)
    ap.add_argument("--time-budget-s", type=float, help="default: REPRO_TIME_BUDGET_S")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    from repro.config import resolve_profile

    profile = resolve_profile(a.profile)
    written = record(profile, force=a.force, variants=a.variants, sizes=a.sizes,
                     seeds=a.seeds, time_budget_s=a.time_budget_s)
    for p in written:
        print(p)
    print(f"lm [{profile}]: wrote {len(written)} cell(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
