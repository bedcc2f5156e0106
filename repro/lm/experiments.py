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
dtypes and scale shapes (``jax.eval_shape`` of ``repro.formats``' quantizers). A run spec's
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
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from repro import formats as F
from repro import hardware, ops, results
from repro.config import stage_params
from repro.lm import model as M
from repro.lm import train as T

EXPERIMENT = "lm"
CLAIMS = ("B3", "B4")


@dataclass(frozen=True)
class Variant:
    """A recipe, optionally changed in one way (an ablation)."""

    name: str
    recipe: str
    overrides: tuple[tuple[str, Any], ...] = ()
    model_overrides: tuple[tuple[str, Any], ...] = ()
    gpu_only: bool = False
    ablation: str | None = None  # what the ablation removes/changes, for the notebook

    def make_recipe(self):
        if self.recipe == M.JAX_NVFP4:
            return M.JAX_NVFP4
        return M.base_recipe(self.recipe).replace(**dict(self.overrides)) if self.overrides \
            else M.base_recipe(self.recipe)

    def make_config(self, cfg: M.LMConfig) -> M.LMConfig:
        return cfg.replace(**dict(self.model_overrides)) if self.model_overrides else cfg

    @property
    def emulated(self) -> bool:
        base = "nvfp4" if self.recipe == M.JAX_NVFP4 else self.recipe
        return ops.is_emulated(base)


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("bf16", "bf16"),
    Variant("fp8-delayed", "fp8-delayed"),
    Variant("fp8-current", "fp8-current"),
    Variant("mxfp8", "mxfp8"),
    Variant("nvfp4", "nvfp4"),
    Variant("nvfp4-no-rht", "nvfp4", (("rht", False),), ablation="no random Hadamard transform"),
    Variant("nvfp4-no-sr", "nvfp4", (("stochastic_rounding", False),),
            ablation="round-to-nearest gradients"),
    Variant("nvfp4-1d-weights", "nvfp4", (("weight_block_2d", False),),
            ablation="1x16 weight blocks"),
    Variant("nvfp4-all-layers", "nvfp4", model_overrides=(("nvfp4_scope", "all"),),
            ablation="NVFP4 in every linear layer"),
    Variant("nvfp4-mlp-only", "nvfp4", model_overrides=(("nvfp4_scope", "mlp"),),
            ablation="NVFP4 on MLP GEMMs only (MaxText)"),
    Variant(M.JAX_NVFP4, M.JAX_NVFP4, gpu_only=True,
            ablation="JAX built-in scaled_dot_general nvfp4"),
]}


def select_variants(names: Iterable[str] | None = None,
                    recipes: Iterable[str] | None = None) -> list[Variant]:
    """Variants by name; ``recipes`` (base recipe names, as ``repro record --recipe``) keeps
    those variants whose recipe is listed (``nvfp4`` keeps every NVFP4 ablation)."""
    names = list(names) if names is not None else list(VARIANTS)
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise ValueError(f"unknown LM variant(s) {bad}; valid: {', '.join(VARIANTS)}")
    out = [VARIANTS[n] for n in names]
    if recipes is not None:
        keep = set(recipes)
        out = [v for v in out if v.recipe in keep or v.name in keep]
    return out


# ----------------------------------------------------------------------- stored bytes


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
    if recipe == M.JAX_NVFP4:
        recipe = M.base_recipe(M.JAX_NVFP4)
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


def stored_bytes(cfg: M.LMConfig, variant: Variant, tokens: int) -> dict[str, float]:
    """Stored bytes of the GEMM operands under ``variant``'s policy, and the BF16 baseline.

    weights: every linear layer's weight in its layer recipe's format, plus the embedding
    table (BF16 in every recipe); activations: the input of every linear layer for ``tokens``
    tokens (what the backward pass keeps). ``*_quantized_only``: the same over the layers the
    policy quantizes, i.e. the format's own ratio.
    """
    cfg = variant.make_config(cfg)
    recipe = variant.make_recipe()
    bf16 = M.base_recipe("bf16")
    emb = tensor_bytes((cfg.vocab_size, cfg.d_model), bf16, "weight")
    out = {"weight_bytes": emb, "weight_bytes_bf16": emb, "activation_bytes": 0.0,
           "activation_bytes_bf16": 0.0, "weight_bytes_quantized_only": 0.0,
           "weight_bytes_quantized_only_bf16": 0.0, "activation_bytes_quantized_only": 0.0,
           "activation_bytes_quantized_only_bf16": 0.0, "quantized_layers": 0,
           "linear_layers": 0}
    for _, kind, block, d_in, d_out in _linear_layers(cfg):
        r = M.layer_recipe(recipe, kind, block, cfg)
        r = M.JAX_NVFP4 if getattr(r, "name", None) == M.JAX_NVFP4 else r
        w, w16 = tensor_bytes((d_in, d_out), r, "weight"), tensor_bytes((d_in, d_out), bf16,
                                                                       "weight")
        a, a16 = tensor_bytes((tokens, d_in), r, "activation"), tensor_bytes((tokens, d_in),
                                                                            bf16, "activation")
        out["weight_bytes"] += w
        out["weight_bytes_bf16"] += w16
        out["activation_bytes"] += a
        out["activation_bytes_bf16"] += a16
        out["linear_layers"] += 1
        if r == M.JAX_NVFP4 or r.quantized:
            out["quantized_layers"] += 1
            out["weight_bytes_quantized_only"] += w
            out["weight_bytes_quantized_only_bf16"] += w16
            out["activation_bytes_quantized_only"] += a
            out["activation_bytes_quantized_only_bf16"] += a16
    return out


# ------------------------------------------------------------------------------ record


def ckpt_root() -> Path:
    return Path(os.environ.get("REPRO_LM_CKPT_DIR",
                               results.repo_root() / "build" / "lm_checkpoints"))


@dataclass
class Run:
    size: str
    train: T.TrainConfig
    variants: list[Variant]
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
    default_variants = p.get("variants", list(VARIANTS))
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
        unknown = sorted(set(stop_at) - set(VARIANTS))
        if unknown:
            raise ValueError(f"lm run {spec['size']}: stop_at names unknown variant(s) "
                             f"{', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
        runs.append(Run(spec["size"], tc, vs, sd, stop_at))
    return runs


def cell_order(run: Run, priority: Iterable[str] = ()) -> list[tuple[int, Variant]]:
    """(seed, variant) in training order: the ``priority`` variants over all seeds first, then
    the rest seed by seed, so a study cut short is still balanced across seeds."""
    first = [v for v in run.variants if v.name in set(priority)]
    rest = [v for v in run.variants if v.name not in set(priority)]
    return [(s, v) for s in run.seeds for v in first] + [(s, v) for s in run.seeds for v in rest]


def cell_name(size: str, variant: str, seed: int) -> str:
    return f"{size}_{variant}_s{seed}"


def _train_records(run: Run, v: Variant, seed: int, res: T.TrainResult, profile: str,
                   cfg: M.LMConfig) -> list[dict]:
    tc = run.train
    sizes = {"model": run.size, "params": res.n_params, "seed": seed, "steps": tc.steps,
             "batch_size": tc.batch_size, "seq_len": cfg.seq_len,
             "tokens": res.steps_done * res.tokens_per_step}
    common = dict(claims=CLAIMS, recipe=v.name, emulated=v.emulated, profile=profile)
    extra = {"base_recipe": v.recipe, "ablation": v.ablation, "lr": tc.lr,
             "warmup_steps": tc.warmup_steps, "n_bf16_last_blocks": cfg.n_bf16_last_blocks,
             "nvfp4_scope": cfg.nvfp4_scope, "layer_recipes": M.recipe_map(v.make_recipe(), cfg),
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


def _memory_records(run: Run, v: Variant, profile: str) -> list[dict]:
    cfg = v.make_config(M.get_config(run.size))
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
                       "linear_layers": b["linear_layers"], "base_recipe": v.recipe,
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
            if v.gpu_only and not on_gpu:
                continue
            cell = f"{run.size}_{v.name}_memory"
            if force or not results.have_cell(EXPERIMENT, cell, root=root):
                written.append(results.write_records(_memory_records(run, v, profile),
                                                     EXPERIMENT, cell, root=root))
    for run in runs:
        skipped = [v.name for v in run.variants if v.gpu_only and not on_gpu]
        if skipped:
            print(f"lm: skipping {', '.join(skipped)} on {jax.default_backend().upper()}: "
                  "jax.nn.scaled_dot_general (nvfp4) has no CPU lowering; GPU only")
        for seed, v in cell_order(run, priority):
            if v.gpu_only and not on_gpu:
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
            cfg = v.make_config(M.get_config(run.size))
            tc = run.train.replace(seed=seed)
            ckpt = ckpt_root() / hardware.detect().slug / profile / cell
            forced = ckpt.parent / f"{cell}.forced"  # marks a re-record under way
            if force and not forced.exists():
                # A fresh re-record: drop any checkpoint of an earlier run. A re-record that
                # an earlier --force call left cut (time budget) resumes instead.
                T.remove_checkpoints(ckpt)
                forced.parent.mkdir(parents=True, exist_ok=True)
                forced.touch()
            res = T.train(cfg, tc, v.make_recipe(), ckpt_dir=ckpt, time_budget_s=left,
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


# ---------------------------------------------------------------------------- analysis


def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t confidence interval of the mean (NaNs for n < 2)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], float)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if v.size < 2:
        return m, math.nan, math.nan
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1)
                 / math.sqrt(v.size))
    return m, m - half, m + half


RUN_KEYS = ["hardware", "profile", "model", "recipe", "seed"]
LOSS_METRICS = ("best_eval_loss", "final_eval_loss", "final_train_loss")


def run_losses(df):
    """One row per (hardware, profile, model, variant, seed): the losses a run ended with.

    ``final_eval_loss``: held-out loss at the last step. ``best_eval_loss``: the lowest
    held-out loss over the run's evaluations (the early-stopping loss; equal to the final one
    while the held-out loss still falls) and ``best_step``, where it was reached.
    ``final_train_loss``: the training loss logged at the last evaluation. ``overfit``:
    final / best held-out loss - 1 (0 for a run whose held-out loss never rose).
    ``truncated_at``: the step a run truncated on purpose ended at (params.yaml ``stop_at``;
    NaN otherwise); such a run has no final losses or overfit (NaN), only its curve and the
    best held-out loss over it.
    """
    import pandas as pd

    cols = RUN_KEYS + ["final_eval_loss", "best_eval_loss", "best_step", "final_train_loss",
                       "overfit", "truncated_at", "emulated", "curve"]
    need = {"hardware", "profile", "size_model", "recipe", "size_seed", "value", "emulated"}
    if df.empty or not need <= set(df.columns):
        return pd.DataFrame(columns=cols)
    ren = {"size_model": "model", "size_seed": "seed"}
    f = (df[df["metric"] == "final_eval_loss"].rename(columns=ren)
         .drop_duplicates(RUN_KEYS, keep="last").set_index(RUN_KEYS))
    ev = df[df["metric"] == "eval_loss"].rename(columns=ren)
    by_run = dict(iter(ev.groupby(RUN_KEYS)))
    rows = []
    for key, r in f.iterrows():
        g = by_run.get(key, ev.iloc[:0])
        g = g.drop_duplicates("size_step", keep="last").sort_values("size_step")
        final = float(r["value"])
        curve = {int(k): float(v) for k, v in zip(g["size_step"], g["value"])}
        if len(g):
            i = int(np.argmin(g["value"].to_numpy()))
            best, step = float(g["value"].iloc[i]), int(g["size_step"].iloc[i])
            train = g["extra"].iloc[-1].get("train_loss")
        else:
            best, step, train = final, None, None
        cut = r["extra"].get("truncated_at")
        if cut is not None:  # ended on purpose: no final losses, only the curve so far
            final = train = math.nan
        else:
            best = min(best, final)
        rows.append({**dict(zip(RUN_KEYS, key)), "final_eval_loss": final,
                     "best_eval_loss": best, "best_step": step,
                     "final_train_loss": None if train is None else float(train),
                     "overfit": final / best - 1.0,
                     "truncated_at": math.nan if cut is None else int(cut),
                     "emulated": bool(r["emulated"]), "curve": curve})
    return pd.DataFrame(rows, columns=cols)


def _paired_best(a: dict, b: dict, fallback: tuple[float, float]) -> tuple[float, float]:
    """Best held-out losses of two runs over the evaluation steps BOTH have (runs recorded
    with different evaluation schedules are compared at the same points)."""
    common = sorted(set(a) & set(b))
    if not common:
        return fallback
    return min(a[k] for k in common), min(b[k] for k in common)


def paired_gaps(df, baseline: str = "bf16", confidence: float = 0.95,
                metric: str = "best_eval_loss"):
    """Loss gap of every variant to ``baseline``, paired by seed (same init and batches).

    ``metric`` is one of :data:`LOSS_METRICS` (see :func:`run_losses`); the best held-out
    losses of a pair are taken over the evaluation steps both runs have. One row per
    (hardware, profile, model, variant): seeds, mean gap in nats with its t interval, and the
    relative gap (gap / baseline loss) with its t interval; ``overfit``: the largest
    final/best held-out loss - 1 of the runs compared; ``truncated_at``: where the variant's
    runs ended on purpose (NaN for whole runs): their best held-out loss is compared over the
    evaluations up to there, and they have no final losses to compare.
    """
    import pandas as pd

    if metric not in LOSS_METRICS:
        raise ValueError(f"metric {metric!r}: choose one of {', '.join(LOSS_METRICS)}")
    fl = run_losses(df)
    rows = []
    for (hw, prof, size), g in fl.groupby(["hardware", "profile", "model"]):
        base = g[g["recipe"] == baseline].set_index("seed")
        for rec, gr in g.groupby("recipe"):
            if rec == baseline:
                continue
            s = gr.set_index("seed")
            seeds = sorted(i for i in set(s.index) & set(base.index)
                           if s.loc[i, metric] is not None and base.loc[i, metric] is not None
                           and math.isfinite(s.loc[i, metric])
                           and math.isfinite(base.loc[i, metric]))
            if not seeds:
                continue
            b, x = base.loc[seeds, metric].astype(float), s.loc[seeds, metric].astype(float)
            if metric == "best_eval_loss":  # over the evaluation steps both runs have
                pairs = [_paired_best(base.loc[i, "curve"], s.loc[i, "curve"], (b[i], x[i]))
                         for i in seeds]
                b = pd.Series([u for u, _ in pairs], index=seeds)
                x = pd.Series([v for _, v in pairs], index=seeds)
            gap = list(x - b)
            rel = list((x - b) / b)
            m, lo, hi = t_interval(gap, confidence)
            rm, rlo, rhi = t_interval(rel, confidence)
            rows.append({"hardware": hw, "profile": prof, "model": size, "recipe": rec,
                         "baseline": baseline, "metric": metric, "n_seeds": len(seeds),
                         "baseline_loss": float(b.mean()), "loss": float(x.mean()),
                         "gap_nats": m, "gap_lo": lo, "gap_hi": hi,
                         "rel_gap": rm, "rel_lo": rlo, "rel_hi": rhi,
                         "overfit": float(pd.concat([base.loc[seeds, "overfit"],
                                                     s.loc[seeds, "overfit"]]).astype(float)
                                          .max()),  # NaN-skipping: truncated runs have none
                         "truncated_at": float(s.loc[seeds, "truncated_at"].max()),
                         "emulated": bool(gr["emulated"].any())})
    return pd.DataFrame(rows, columns=[
        "hardware", "profile", "model", "recipe", "baseline", "metric", "n_seeds",
        "baseline_loss", "loss", "gap_nats", "gap_lo", "gap_hi", "rel_gap", "rel_lo", "rel_hi",
        "overfit", "truncated_at", "emulated"])


SIZE_ORDER = {"tiny": 0, "20m": 1, "120m": 2}


def b4_verdict(gaps, threshold: float = 0.015, min_seeds: int = 3) -> dict[str, Any]:
    """Claim B4 from ``paired_gaps(df, "bf16")``: the rule the notebook states.

    Evidence: the largest model with >= ``min_seeds`` paired NVFP4/BF16 seeds (full profile
    preferred over smoke). With the 95% t-interval [lo, hi] of the relative gap
    (NVFP4 - BF16) / BF16 of the gaps' metric (the best held-out loss by default): hi <= 1.5%
    -> "reproduced"; lo > 1.5% -> "contradicted"; otherwise "partly" (the interval straddles
    1.5%). From smoke records only (the tiny model, ~100 steps) a passing rule gives at most
    "partly": that is a pipeline check, not evidence.
    """
    g = gaps[(gaps["recipe"] == "nvfp4") & (gaps["n_seeds"] >= min_seeds)]
    if g.empty:
        return {"verdict": "not yet measured", "row": None,
                "key_number": "no NVFP4/BF16 pair with enough seeds"}
    g = g.assign(_full=(g["profile"] == "full").astype(int),
                 _size=g["model"].map(SIZE_ORDER).fillna(-1))
    row = g.sort_values(["_full", "_size", "n_seeds"]).iloc[-1]
    if row["rel_hi"] <= threshold:
        verdict = "reproduced"
    elif row["rel_lo"] > threshold:
        verdict = "contradicted"
    else:
        verdict = "partly"
    smoke_only = row["profile"] != "full"
    if smoke_only and verdict == "reproduced":
        verdict = "partly"
    what = {"best_eval_loss": "best held-out loss", "final_eval_loss": "final held-out loss",
            "final_train_loss": "final training loss"}.get(row.get("metric"), "held-out loss")
    key = (f"NVFP4 vs BF16 {what} {100 * row['rel_gap']:+.2f}% "
           f"(95% CI {100 * row['rel_lo']:+.2f}% .. {100 * row['rel_hi']:+.2f}%, "
           f"{int(row['n_seeds'])} seeds, {row['model']} model, {row['profile']} profile"
           f"{', emulated NVFP4' if row['emulated'] else ''})")
    return {"verdict": verdict, "row": row, "key_number": key, "smoke_only": smoke_only}


def b3_verdict(df, limit: float = 0.30) -> dict[str, Any]:
    """Claim B3 from the stored-bytes records: the rule the notebook states.

    format ratio: NVFP4 bytes / BF16 (= FP16) bytes over the tensors the policy quantizes,
    max of weights and activations. model ratio: weights + activations of the whole model
    under the paper policy (BF16 embedding, head, last block). format ratio <= 0.30 (1/4 plus
    at most 5 points of scales) and model ratio <= 0.30 -> "reproduced"; format ratio <= 0.30
    only -> "partly"; else "contradicted". Uses the largest model recorded.
    """
    m = df[(df["recipe"] == "nvfp4") & df["metric"].str.startswith("stored_")] \
        if not df.empty else df
    if m.empty:
        return {"verdict": "not yet measured", "key_number": "no stored-bytes records"}
    m = m.assign(_size=m["size_model"].map(SIZE_ORDER).fillna(-1))
    size = m.sort_values("_size")["size_model"].iloc[-1]
    m = m[m["size_model"] == size].drop_duplicates("metric", keep="last").set_index("metric")
    hardware = str(m["hardware"].iloc[-1])

    def ratio(metric):
        return float(m.loc[metric, "extra"]["ratio_to_bf16"])

    w_q, a_q = ratio("stored_weight_bytes_quantized_only"), ratio(
        "stored_activation_bytes_quantized_only")
    whole = ((m.loc["stored_weight_bytes", "value"] + m.loc["stored_activation_bytes", "value"])
             / (m.loc["stored_weight_bytes", "extra"]["bf16_bytes"]
                + m.loc["stored_activation_bytes", "extra"]["bf16_bytes"]))
    fmt = max(w_q, a_q)
    verdict = ("reproduced" if fmt <= limit and whole <= limit else
               "partly" if fmt <= limit else "contradicted")
    key = (f"NVFP4 tensors take {w_q:.3f} (weights, 16x16 blocks) and {a_q:.3f} (activations, "
           f"1x16) of their BF16/FP16 bytes; the {size} model's GEMM operands under NVIDIA's "
           f"policy {whole:.3f}")
    return {"verdict": verdict, "key_number": key, "model": size, "weights": w_q,
            "activations": a_q, "whole": float(whole), "hardware": hardware}


def main(argv: list[str] | None = None) -> int:
    """``python -m repro.lm.experiments PROFILE [--sizes ..] [--variants ..] [--seeds ..]``:
    record a subset of the cells (e.g. one per GPU of a multi-GPU machine)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m repro.lm.experiments")
    ap.add_argument("profile", choices=["smoke", "full", "auto"])
    ap.add_argument("--sizes", nargs="*")
    ap.add_argument("--variants", nargs="*", help=f"of: {', '.join(VARIANTS)}")
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
