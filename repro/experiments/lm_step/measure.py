"""The decoder LM's whole training step (forward, backward, AdamW on FP32 master weights),
timed per precision recipe in the same process, interleaved, on the same device.

The step is ``repro.models.lm_train``'s own (``_functions``: the function ``train`` runs), on
a fixed batch of the shipped corpus. A cell is one (model size, batch): all its recipes are
compiled one at a time, then timed together in rounds (recipe A, B, C, A, B, C, ...) exactly
as ``repro.experiments.mlp_step.measure`` times the MLP step
(``repro.studies.timing.time_interleaved``), so a speedup is always a ratio of two timings from
the same run. Each recipe's records carry the compiled program's facts
(``repro.studies.lowering.compiled_facts``: XLA's bytes accessed, flops and launching ops) for
the step-time model (``repro.perfmodel.validate``, claim B2). Recipes without tensor cores on
this device (NVFP4 and MXFP8 off Blackwell, FP8 on a CPU) are timed and stamped
``emulated=True``: their speed is that of the emulation, never evidence.

    repro record lm_step --profile smoke     # tiny model, CPU, seconds (build/results/)
    repro record lm_step --profile full      # 120m and 20m on a GPU (results/), resumable
    repro record lm_step --profile full --recipe int8 --only 'wide2_*'  # int8 beside bf16:
                                             # cell wide2_b8_bf16-int8
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp

from repro import hardware, results
from repro.config import ConfigError, Section, from_cli, positive, recipe_names
from repro.precision import Recipe, resolve
from repro.program import Program
from repro.studies import lowering
from repro.studies.runner import Cell, Study
from repro.studies.lowering import compiled_facts, recipe_emulated
from repro.studies.timing import quartiles, stepper, time_interleaved

EXPERIMENT = "lm_step"
CLAIMS = ("B2",)


def _log(msg: str) -> None:
    """One progress line on stderr (an FP8 step of the 120m model compiles for ~40 s)."""
    print(f"{EXPERIMENT}: {msg}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------- inputs


def check_recipes(recipes) -> dict[str, Recipe]:
    """``{name: Recipe}`` of the recipe names in their order (a name once), or a one-line
    ConfigError naming the unknown ones."""
    from repro.precision.recipes import names as recipe_names
    from repro.precision.recipes import resolve

    if isinstance(recipes, str) or not recipes:
        raise ConfigError(f"{EXPERIMENT}: recipes must be a non-empty list, got {recipes!r}")
    out, bad = {}, []
    for r in recipes:
        try:
            out[r] = resolve(r)
        except ValueError:
            bad.append(str(r))
    if bad:
        raise ConfigError(f"{EXPERIMENT}: unknown recipe(s) {', '.join(bad)}; valid recipes: "
                          f"{', '.join(recipe_names())}")
    return out


def check_size(size: str):
    """The ``repro.models.lm`` preset, or a one-line ConfigError listing the presets."""
    from repro.models import lm as M

    if not isinstance(size, str) or size not in M.PRESETS:
        raise ConfigError(f"{EXPERIMENT}: unknown model size {size!r}; presets: "
                          f"{', '.join(M.PRESETS)}")
    return M.PRESETS[size]


def _batches(batch, size: str) -> list[int]:
    """``batch`` of params.yaml: an int, a list of ints, or a mapping size -> int / list."""
    if isinstance(batch, dict):
        if size not in batch:
            raise ConfigError(f"{EXPERIMENT}: no batch size for model {size!r} in {batch!r}")
        batch = batch[size]
    values = batch if isinstance(batch, (list, tuple)) else [batch]
    if not values or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                             for b in values):
        raise ConfigError(f"{EXPERIMENT}: batch size(s) {batch!r} for model {size!r} must be "
                          "positive integers")
    return [int(b) for b in values]


def batches_of(p: "Params", size: str) -> list[int]:
    """The batch sizes of model ``size``: ``batch`` is an int, a list, or size -> either."""
    return _batches(p.batch, size)


def check(p: "Params") -> None:
    """Every size a preset, every batch positive, and the checks of
    ``repro.models.lm_data.preflight`` (corpus, NVFP4 tiling of batch x seq_len) for every
    cell and recipe: all before anything compiles. The memory estimate against this device
    is checked as each cell starts (:func:`fixed_batch`, before its first compile), so a
    cell too large for this device (120m at batch 32 on a 16 GiB chip) fails alone, in one
    line, and the cells that fit run."""
    from repro.models import lm_data as D

    recipes = check_recipes(list(p.selected or p.recipes))
    for size in p.sizes:
        cfg = check_size(size)
        for b in batches_of(p, size):
            for r in recipes.values():
                D.preflight(cfg, b, recipe=r, bytes_limit=NO_LIMIT)


NO_LIMIT = 2 ** 62  # bytes: the memory estimate is left to each cell (fixed_batch)


def cell_name(size: str, batch: int) -> str:
    return f"{size}_b{batch}"


# ------------------------------------------------------------------------------- timing


def fixed_batch(cfg, batch: int, recipes: list[str]):
    """The batch a step is timed on: the first training batch of the shipped corpus, after
    every recipe's preflight (a bad recipe or size fails before the first compile)."""
    from repro.models import lm_data as D

    splits = None
    for r in recipes:
        splits = D.preflight(cfg, batch, recipe=resolve(r))
    x, y = D.train_batch(splits.train, 0, batch, cfg.seq_len, 0)
    return jnp.asarray(x), jnp.asarray(y)


def compile_step(cfg, recipe: str, x, y, tag: str = ""):
    """``(facts, times, run)`` of ``recipe``'s training step on the batch ``(x, y)``:
    ``train.train``'s own step function compiled (only the batch size of its static config
    matters to the compiled shapes; the schedule's values do not change a step's work), the
    compiled program's facts, init/compile/first-step seconds, and a zero-argument ``run``
    that takes one step (``repro.studies.timing.stepper``), already warmed up."""
    from repro.models import lm_train as T

    r = resolve(recipe)
    tc = T.TrainConfig(batch_size=int(x.shape[0]))
    seed, step_i = jnp.int32(0), jnp.int32(0)
    t0 = time.perf_counter()
    init_fn, step_fn, _ = T._functions(cfg, r, T._static_key(tc),
                                       hardware.platform() == "gpu")
    variables, opt_state = init_fn(seed, x[:1])  # parameter shapes do not depend on B
    jax.block_until_ready(variables)
    t1 = time.perf_counter()
    _log(f"{tag} {recipe}: compiling")
    compiled = step_fn.lower(variables, opt_state, x, y, seed, step_i).compile()
    facts = compiled_facts(compiled)
    facts.update(lowering.int8_facts(r, compiled))
    t2 = time.perf_counter()
    run = stepper(compiled, variables, opt_state, x, y, seed, step_i)
    jax.block_until_ready(run())  # warm up
    t3 = time.perf_counter()
    _log(f"{tag} {recipe}: init {t1 - t0:.1f} s, compile {t2 - t1:.1f} s, first step "
         f"{t3 - t2:.2f} s, lowering {lowering.narrow_lowering(r, facts)}")
    times = {"init_s": round(t1 - t0, 3), "compile_s": round(t2 - t1, 3),
             "first_step_s": round(t3 - t2, 3)}
    return facts, times, run


def program(recipe: str, size: str, batch: int) -> Program:
    """What a record of ``recipe`` in cell ``<size>_b<batch>`` measures: the training step that
    :func:`compile_step` compiles (``repro.models.lm_train``'s own), on abstract arguments of
    the cell's shapes, and the kit that times it."""
    from repro.models import lm as M
    from repro.models import lm_train as T

    cfg = M.get_config(size)
    tc = T.TrainConfig(batch_size=int(batch))
    init, step, _ = T._raw_functions(cfg, resolve(recipe), T._static_key(tc))
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    variables, opt_state = jax.eval_shape(init, i32,
                                          jax.ShapeDtypeStruct((1, cfg.seq_len), jnp.int32))
    tokens = jax.ShapeDtypeStruct((int(batch), cfg.seq_len), jnp.int32)
    return Program(step, (variables, opt_state, tokens, tokens, i32, i32),
                   kit=(stepper, time_interleaved, quartiles, compiled_facts, fixed_batch))


def program_settings(rec: dict) -> dict | None:
    """:func:`program`'s settings of a record: its recipe, model size and batch."""
    sizes = rec.get("sizes") or {}
    if not rec.get("recipe") or not sizes.get("model") or not sizes.get("batch"):
        return None
    return {"recipe": rec["recipe"], "size": str(sizes["model"]), "batch": int(sizes["batch"])}


def bench_cell(size: str, batch: int, recipes: list[str], repeats: int,
               steps_per_sample: int = 5, profile: str | None = None) -> list[dict]:
    """Time every recipe's LM training step for one (size, batch), interleaved.

    Per recipe: ``step_time_ms`` (median, spread = IQR), ``tokens_per_s`` (batch x seq_len
    tokens per step), ``compile_time_s`` and ``step_memory_bytes`` (XLA's memory analysis of
    the compiled step, where the backend has one); ``extra`` holds the samples and the
    compiled program's facts.
    """
    from repro.models import lm as M

    cfg = check_size(size)
    recipes = check_recipes(recipes)
    (batch,) = _batches(batch, size)
    if repeats < 1 or steps_per_sample < 1:
        raise ConfigError(f"{EXPERIMENT}: repeats and steps_per_sample must be >= 1")
    x, y = fixed_batch(cfg, batch, list(recipes))
    tag = f"{size} b{batch}"
    facts_of, times_of, runners = {}, {}, {}
    for r in recipes:
        facts_of[r], times_of[r], runners[r] = compile_step(cfg, r, x, y, tag)
    samples_of = time_interleaved(runners, repeats, steps_per_sample, f" in {tag}")

    tokens = batch * cfg.seq_len
    sizes = {"model": size, "batch": batch, "seq_len": cfg.seq_len, "tokens": tokens,
             "d_model": cfg.d_model, "n_layers": cfg.n_layers, "params": M.param_count(cfg)}
    run_id = f"{time.time():.0f}"
    records = []
    for r in recipes:
        facts, s = facts_of[r], samples_of[r]
        q1, med, q3 = quartiles(s)
        common = dict(claims=CLAIMS, recipe=r, sizes=sizes, repeats=len(s),
                      emulated=recipe_emulated(recipes[r], facts), profile=profile,
                      extra={"run_id": run_id, "samples_ms": (s * 1e3).round(4).tolist(),
                             "steps_per_sample": steps_per_sample, **times_of[r], **facts,
                             "layer_recipes": sorted(set(M.recipe_map(r, cfg).values()))})
        records.append(results.make_record(EXPERIMENT, "step_time_ms", med * 1e3, "ms",
                                           spread=(q3 - q1) * 1e3, **common))
        records.append(results.make_record(EXPERIMENT, "tokens_per_s", tokens / med,
                                           "tokens/s", spread=tokens / q1 - tokens / q3,
                                           **common))
        records.append(results.make_record(EXPERIMENT, "compile_time_s",
                                           times_of[r]["compile_s"], "s", **{**common,
                                                                            "repeats": 1}))
        if facts["memory_bytes"] is not None:
            records.append(results.make_record(EXPERIMENT, "step_memory_bytes",
                                               facts["memory_bytes"], "bytes",
                                               **{**common, "repeats": 1}))
    return records


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``lm_step`` section: one cell per (model size, batch), in order.
    ``selected``: ``--recipe``, the recipes timed beside bf16 in cells of their own
    (``wide2_b8_bf16-int8``), which never mask the cells of ``recipes``."""

    sizes: tuple[str, ...]
    batch: int | tuple[int, ...] | dict[str, int | tuple[int, ...]]
    recipes: tuple[str, ...] = recipe_names()
    repeats: int = positive(10)
    steps_per_sample: int = positive(5)
    selected: tuple[str, ...] | None = from_cli()


def narrow(p: Params, recipes) -> Params:
    """``--recipe``: the named recipes (checked by :func:`check`), bf16 first."""
    return replace(p, selected=tuple(dict.fromkeys(["bf16", *recipes])))


def cells(p: Params) -> list[Cell]:
    """One cell per (size, batch), in params order; every recipe timed in each."""
    recipes = list(dict.fromkeys(p.selected or p.recipes))
    suffix = "_" + "-".join(recipes) if p.selected else ""

    def one(size, batch):
        return lambda _budget: bench_cell(size, batch, recipes, p.repeats, p.steps_per_sample,
                                          profile=p.profile)

    def programs(size, batch):
        return lambda: {r: program(r, size, batch) for r in recipes}

    return [Cell(cell_name(size, b) + suffix, one(size, b), programs=programs(size, b))
            for size in p.sizes for b in batches_of(p, size)]


STUDY = Study(EXPERIMENT, CLAIMS, cells, check, about="the decoder LM's train step per recipe",
              params=Params, data=("repro/data/lm_corpus.txt.gz",), narrow=narrow)
