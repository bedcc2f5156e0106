"""Claims B3/B4: the decoder LM trained under each recipe, and the bytes its tensors take.

    repro record lm --profile smoke          # tiny model, CPU, minutes (build/results/)
    repro record lm --profile full           # 20m and 120m on a GPU (results/), resumable
    repro record lm --profile full --time-budget 420   # stop cleanly after ~7 minutes
    repro record lm --profile full --only '20m_*_s1'   # the cells of one seed (e.g. per GPU)

One resumable cell per (model size, variant, seed): the held-out loss curve (``eval_loss`` at
several steps), ``final_eval_loss``, ``tokens_per_s`` and the compiled step's memory. A
variant is a registry entry (``repro.precision``): a recipe plus, for the ablations, one
change. Unfinished runs checkpoint under ``build/lm_checkpoints/`` and the next call resumes
them, so one long run can span several time-limited jobs (the runner hands a cell the seconds
left of ``--time-budget``). A cell per (size, variant) holds the stored bytes of weights and
activations (claim B3), computed from the quantized tensors' own dtypes and scale shapes
(``jax.eval_shape`` of ``repro.precision.formats``' quantizers). A run spec's ``stop_at:
{variant: step}`` truncates that variant's runs on purpose (the whole run's schedule, ended
early; ``truncated_at`` in the records): for a reference recipe too slow to train in full,
compared over the evaluations up to there.

Quality numbers of emulated recipes are valid (the numerics are bit-faithful to the formats);
their speed is not (``emulated=True`` in the records).
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from repro import hardware, results
from repro.config import Section, from_cli, positive, recipe_names, within
from repro.models import lm as M
from repro.models import lm_train as T
from repro.precision import blockfp8 as B
from repro.precision import formats as F
from repro.precision import ops
from repro.precision.recipes import Recipe, resolve
from repro.program import Program
from repro.studies.runner import Cell, Study

EXPERIMENT = "lm"

CLAIMS = ("B3", "B4")


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
    if recipe.gemm == "fp8block":
        block = (128, 128) if role == "weight" else (1, 128)
        t = jax.eval_shape(lambda a: B.quantize(a, block), spec)
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


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One entry of ``runs``: a model size trained for ``steps`` steps, or for
    ``tokens_per_param`` tokens per parameter, under each of ``variants`` and ``seeds``."""

    size: str
    batch_size: int = positive()
    lr: float = positive()
    steps: int | None = positive(None)
    tokens_per_param: float | None = positive(None)
    warmup_steps: int | None = None
    seeds: tuple[int, ...] = (0,)
    checkpoint_every: int = 0
    stop_at: dict[str, int] | None = positive(None)
    variants: tuple[str, ...] | None = recipe_names(None)


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``lm`` section. ``priority``: variants trained over all seeds before
    the others. ``checkpoints``: where unfinished runs checkpoint (default
    ``build/lm_checkpoints/``)."""

    runs: tuple[RunSpec, ...]
    variants: tuple[str, ...] = recipe_names(("bf16", "nvfp4"))
    eval_points: int = positive(5)
    eval_log_points: int = 0
    eval_batches: int = positive(4)
    min_lr_ratio: float = within(0.1, 0.0, 1.0)
    weight_decay: float = within(0.1)
    priority: tuple[str, ...] = ()
    checkpoints: str | None = from_cli()


def ckpt_root(p: Params) -> Path:
    return Path(p.checkpoints) if p.checkpoints else (
        results.repo_root() / "build" / "lm_checkpoints")


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


def _train_config(spec: RunSpec, p: Params) -> T.TrainConfig:
    cfg = M.get_config(spec.size)
    if spec.steps is not None:
        steps = spec.steps
    elif spec.tokens_per_param is not None:
        steps = math.ceil(spec.tokens_per_param * M.param_count(cfg)
                          / (spec.batch_size * cfg.seq_len))
    else:
        raise ValueError(f"lm run {spec.size}: give steps or tokens_per_param")
    warmup = spec.warmup_steps if spec.warmup_steps is not None else max(1, steps // 20)
    every = max(1, steps // p.eval_points)
    return T.TrainConfig(
        steps=steps, batch_size=spec.batch_size, lr=spec.lr, warmup_steps=warmup,
        min_lr_ratio=p.min_lr_ratio, weight_decay=p.weight_decay, eval_every=every,
        eval_extra=early_eval_steps(warmup, every, p.eval_log_points),
        eval_batches=p.eval_batches, checkpoint_every=spec.checkpoint_every)


def plan(p: Params | str) -> list[Run]:
    """The runs of the ``lm`` section (``p``: its params, or a profile to read them for)."""
    if isinstance(p, str):
        from repro import studies

        p = studies.params(EXPERIMENT, p)
    runs = []
    for spec in p.runs:
        stop_at = dict(spec.stop_at or {})
        for name in stop_at:
            try:
                resolve(name)
            except ValueError as e:
                raise ValueError(f"lm run {spec.size}: stop_at names an unknown variant: "
                                 f"{e}") from None
        variants = [resolve(n) for n in (spec.variants or p.variants)]
        runs.append(Run(spec.size, _train_config(spec, p), variants, list(spec.seeds), stop_at))
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


def train_cell(run: Run, v: Recipe, seed: int, p: Params, budget_s: float | None
               ) -> list[dict] | None:
    """Train (or resume) one (size, variant, seed) run; its records, or None when it stopped
    at ``budget_s`` with a checkpoint (the next call resumes it)."""
    cell = cell_name(run.size, v.name, seed)
    cfg = M.get_config(run.size)
    tc = run.train.replace(seed=seed)
    ckpt = _ckpt_dir(p, cell)
    res = T.train(cfg, tc, v, ckpt_dir=ckpt, time_budget_s=budget_s,
                  stop_at=run.stop_at.get(v.name), progress=sys.stderr.isatty(), desc=cell)
    if not res.finished:
        print(f"lm: {cell} stopped at step {res.steps_done}/{run.stop_at.get(v.name, tc.steps)}"
              f" (checkpoint in {ckpt}); run again to resume")
        return None
    if res.final_eval_loss is None or not math.isfinite(res.final_eval_loss):
        warnings.warn(f"lm: {cell} ended with eval loss {res.final_eval_loss}", stacklevel=2)
    if res.truncated_at is not None:
        print(f"lm: {cell} truncated at step {res.truncated_at} of {tc.steps} (params.yaml "
              "stop_at): its best held-out loss is compared over the evaluations up to there")
    recs = _train_records(run, v, seed, res, p.profile, cfg)
    T.remove_checkpoints(ckpt)
    _forced(ckpt).unlink(missing_ok=True)
    return recs


def _ckpt_dir(p: Params, cell: str) -> Path:
    return ckpt_root(p) / hardware.detect().slug / p.profile / cell


def _forced(ckpt: Path) -> Path:
    return ckpt.parent / f"{ckpt.name}.forced"  # marks a forced re-record under way


def restart(ckpt: Path) -> None:
    """Before a ``--force`` run: drop any checkpoint of an earlier run, unless an earlier
    ``--force`` call left this re-record cut (time budget): that one resumes."""
    if not _forced(ckpt).exists():
        T.remove_checkpoints(ckpt)
        _forced(ckpt).parent.mkdir(parents=True, exist_ok=True)
        _forced(ckpt).touch()


def program(size: str, recipe: str, kind: str = "train", seed: int = 0,
            train: dict | None = None, stop_at: int | None = None,
            tokens: int | None = None) -> Program:
    """What a record of cell ``<size>_<recipe>_s<seed>`` (``kind`` "train") or
    ``<size>_<recipe>_memory`` ("memory") measures.

    train: the trained function, traced on abstract arguments of the run's shapes: the
    initialisation, the training step (``repro.models.lm_train``'s own, with the run's
    schedule and optimizer: ``train``, the TrainConfig's fields but the seed) and the held-out
    evaluation; plus, as constants, the run's settings (``train``, ``seed``, ``stop_at``) and a
    digest of its data (the corpus file, the first training batch, the held-out windows); the
    kit: the training loop and the data pipeline. memory: the stored bytes
    (:func:`stored_bytes` for ``tokens`` tokens, from the quantizers' output shapes), as a
    constant of the program."""
    import hashlib
    import json

    from repro.models import lm_data as D

    cfg, r = M.get_config(size), resolve(recipe)
    if kind == "memory":
        def stored():
            b = stored_bytes(cfg, r, int(tokens))
            return jnp.asarray(np.frombuffer(json.dumps(b, sort_keys=True).encode(), np.uint8))

        return Program(stored, ())
    t = dict(train or {})
    fields = T.TrainConfig.__dataclass_fields__
    tc = T.TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()
                          if k in fields and k != "seed"})
    init, step, evaluate = T._raw_functions(cfg, r, T._static_key(tc))
    setup = json.dumps({"train": t, "seed": seed, "stop_at": stop_at}, sort_keys=True)

    def trained(seed_, x, y, step_i, ex, ey):
        variables, opt_state = init(seed_, x)
        variables, opt_state, loss = step(variables, opt_state, x, y, seed_, step_i)
        data = hashlib.sha256()
        with open(D.corpus_path(), "rb") as f:  # opened here: a trace's files name it
            data.update(f.read())
        splits = D.load_splits()
        windows = D.heldout_batches(splits.heldout, cfg.seq_len, tc.batch_size,
                                    max(1, tc.eval_batches))
        for a in [*D.train_batch(splits.train, 0, tc.batch_size, cfg.seq_len, seed),
                  *(w for xy in windows for w in xy)]:
            data.update(np.ascontiguousarray(a).tobytes())
        digests = [np.frombuffer(b, np.uint8) for b in (data.digest(), setup.encode())]
        return (loss, evaluate(variables, ex, ey), *map(jnp.asarray, digests))

    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    batch = jax.ShapeDtypeStruct((tc.batch_size, cfg.seq_len), jnp.int32)
    return Program(trained, (i32, batch, batch, i32, batch, batch),
                   kit=(T.train, T.TrainConfig.eval_steps, D.train_batch, D.heldout_batches))


def _train_settings(tc: T.TrainConfig) -> dict:
    """:func:`program`'s ``train`` of a run's TrainConfig (its fields but the seed)."""
    out = {k: getattr(tc, k) for k in T.TrainConfig.__dataclass_fields__ if k != "seed"}
    out["eval_extra"] = [int(s) for s in tc.eval_extra]
    return out


def program_settings(rec: dict) -> dict | None:
    """:func:`program`'s settings of a record. A memory record: its size, recipe and tokens.
    A training record: its size, recipe, seed, steps, batch size, learning rate, warmup and
    truncation (``extra.truncated_at``) from the record; the TrainConfig's other fields (decay,
    evaluation schedule) from params.yaml's run of that size in the record's profile (None
    where it has none)."""
    sizes, extra = rec.get("sizes") or {}, rec.get("extra") or {}
    recipe, size = rec.get("recipe"), sizes.get("model")
    if not recipe or not size:
        return None
    if str(rec.get("metric", "")).startswith("stored_"):
        if not sizes.get("tokens"):
            return None
        return {"size": size, "recipe": recipe, "kind": "memory", "tokens": int(sizes["tokens"])}
    if not all(k in sizes for k in ("seed", "steps", "batch_size")) or "lr" not in extra:
        return None
    try:
        runs = [r for r in plan(str(rec.get("profile") or "full")) if r.size == size]
    except Exception:  # noqa: BLE001 - no such profile or section: not derivable
        return None
    runs = [r for r in runs if recipe in {v.name for v in r.variants}] or runs
    if not runs:
        return None
    tc = runs[0].train.replace(steps=int(sizes["steps"]), batch_size=int(sizes["batch_size"]),
                               lr=float(extra["lr"]),
                               warmup_steps=int(extra.get("warmup_steps",
                                                          runs[0].train.warmup_steps)))
    stop = extra.get("truncated_at")
    return {"size": size, "recipe": recipe, "kind": "train", "seed": int(sizes["seed"]),
            "train": _train_settings(tc), "stop_at": None if stop is None else int(stop)}


def check(p: Params) -> None:
    plan(p)


def cells(p: Params) -> list[Cell]:
    """The memory cell of every (size, variant), then the training cells in
    :func:`cell_order`. ``jax.nn.scaled_dot_general`` entries (jax-nvfp4) are GPU only."""
    runs = plan(p)
    on_gpu = hardware.platform() == "gpu"

    def usable(run):
        return [v for v in run.variants if on_gpu or v.backend != "jax"]

    def memory_programs(run, v):
        tokens = run.train.batch_size * M.get_config(run.size).seq_len
        return lambda: {v.name: program(run.size, v.name, "memory", tokens=tokens)}

    def train_programs(run, v, seed):
        return lambda: {v.name: program(run.size, v.name, "train", seed, _train_settings(
            run.train), run.stop_at.get(v.name))}

    out = [Cell(f"{run.size}_{v.name}_memory",
                lambda _b, run=run, v=v: _memory_records(run, v, p.profile), (v.name, v.family),
                programs=memory_programs(run, v))
           for run in runs for v in usable(run)]
    for run in runs:
        if skipped := [v.name for v in run.variants if v not in usable(run)]:
            print(f"lm: skipping {', '.join(skipped)} on {hardware.platform().upper()}: "
                  "jax.nn.scaled_dot_general (nvfp4) has no CPU lowering; GPU only")
        for seed, v in cell_order(run, p.priority):
            if v in usable(run):
                name = cell_name(run.size, v.name, seed)
                out.append(Cell(name, lambda b, run=run, v=v, s=seed: train_cell(run, v, s, p, b),
                                (v.name, v.family),
                                restart=lambda n=name: restart(_ckpt_dir(p, n)),
                                programs=train_programs(run, v, seed)))
    return out


STUDY = Study(EXPERIMENT, CLAIMS, cells, check, about="decoder LM losses and bytes per recipe",
              params=Params, data=("repro/data/lm_corpus.txt.gz",))
