"""Where a training step's device time goes, kernel by kernel (what step times alone hide).

    repro trace mlp --width 256 --recipes bf16,fp8-delayed      # on a GPU
    repro trace lm --size 20m --batch 64 --recipes bf16,fp8-delayed
    repro trace gemm --recipes bf16,fp8                         # the gemm sweep's GEMMs, traced
    repro trace ppo --width 4096 --recipes bf16,fp8-delayed     # the PPO update
    repro trace inference --config wide --phase decode --batch 1 --recipes bf16,fp8-w

The step is built and compiled exactly as the ``mlp_step`` / ``lm_step`` benchmarks do it
(``repro.experiments.mlp_step.measure._setup`` and ``_compile``,
``repro.experiments.lm_step.measure.compile_step``; ``ppo``: the update step of an
``rl_throughput`` MLP cell, ``repro.experiments.rl_throughput.measure.update_program``;
``inference``: a speed config's prefill or decode loop, compiled as the ``inference`` study
times it, ``repro.experiments.inference.speed``, under inference formats instead of recipes, a
"step" being one call: one prefill, or the ``decode_steps`` tokens of one decode loop), run
once to warm up, and then ``steps`` steps run under JAX's profiler (CUPTI on a GPU). The
Perfetto trace's kernel events on the device's streams are classed by name
(``repro.studies.kernel_trace.kernel_class``: gemm, attention, collective, memory, other) and
summed. Per recipe, records under ``results/<hardware>/kernel_times/<cell>.json``:
``<class>_ms_per_step`` for every class, ``kernel_ms_per_step`` (their sum: device busy time,
streams added up), ``kernels_per_step`` and ``wall_ms_per_step`` (wall time per traced step,
profiler on: an upper bound of the untraced step). ``extra.top_kernels`` lists the costliest
kernels.

This is what :mod:`repro.perfmodel` cannot see from step times alone: how much of a step the
GEMMs take, how much the quantization and other fusions, and how much is gaps between
kernels. The ``gemm`` workload traces single calls of the ``gemm`` sweep's GEMM (dtypes, not
recipes): their device time without the host's per-call overhead, which swamps a small GEMM
in the sweep's wall-clock timing; ``perfmodel.RateTable`` prefers it where it exists. On a
CPU the trace holds no device kernels: nothing is recorded, and it says so.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax

from repro import catalogue, results
from repro.config import Section
from repro.program import Program
from repro.studies.kernel_trace import kernel_events, load_trace, summarize
from repro.studies.runner import Cell, Study

EXPERIMENT = "kernel_times"  # repro.perfmodel reads these records by this name
CLAIMS = ["B2"]


def trace_steps(run: Callable[[], Any], steps: int, logdir: Path) -> float:
    """Run ``run`` (one training step) ``steps`` times under the profiler; wall s per step."""
    jax.block_until_ready(run())  # warm up outside the trace
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True):
        t0 = time.perf_counter()
        for _ in range(steps):
            out = run()
        jax.block_until_ready(out)
        wall = (time.perf_counter() - t0) / steps
    return wall


def _mlp_runner(recipe: str, width: int, batch: int, depth: int):
    from repro.experiments.mlp_step import measure as mlpbench
    from repro.precision.recipes import resolve
    from repro.studies import timing

    step, variables, opt_state, x, y = mlpbench._setup(resolve(recipe), width, batch, depth)
    compiled, facts = mlpbench._compile(step, variables, opt_state, x, y)
    return timing.stepper(compiled, variables, opt_state, x, y), facts


def _lm_runner(recipe: str, size: str, batch: int):
    from repro.experiments.lm_step import measure as lmbench

    cfg = lmbench.check_size(size)
    x, y = lmbench.fixed_batch(cfg, batch, [recipe])
    facts, _, run = lmbench.compile_step(cfg, recipe, x, y, f"{size} b{batch}")
    return run, facts


def _gemm_runner(dtype: str, m: int, k: int, n: int):
    """One GEMM call of the ``gemm`` sweep (``repro.experiments.gemm.measure``: same operands
    and function)."""
    from repro import hardware
    from repro.experiments.gemm import measure as bench
    from repro.studies.lowering import compiled_gemm_info

    a, b = bench._random_inputs(jax.random.key(0), m, k, n)
    ops = bench.gemm_operands(dtype, a, b)
    info = compiled_gemm_info(bench.gemm_fn(dtype), *ops)
    fn = jax.jit(bench.gemm_fn(dtype))
    return (lambda: fn(*ops)), {**info, "emulated": bench._emulated(dtype, info,
                                                                    hardware.current())}


def _ppo_runner(token: str, width: int, num_envs: int, profile: str = "full"):
    """The PPO update of the ``rl_throughput`` MLP cell ``mlp_w{width}_{token}_e{num_envs}``
    (``params.yaml``'s settings of ``profile``), built as that cell builds it
    (``repro.experiments.rl_throughput.measure.update_program``); ``token`` is a recipe name
    such as ``fp8-all-layers``."""
    from repro import studies
    from repro.experiments.rl_throughput import measure as rl_throughput
    from repro.studies.lowering import compiled_facts, recipe_emulated

    c = rl_throughput.throughput_config("mlp", width, token, num_envs,
                                        studies.params(rl_throughput.THROUGHPUT, profile))
    compiled, args, _ = rl_throughput.update_program(c)
    facts = compiled_facts(compiled)
    return (lambda: compiled(*args)), {
        **facts, "emulated": recipe_emulated(c.recipe, facts["fp8_lowering"])}


def _inference_runner(fmt: str, config: str, phase: str, batch: int, profile: str = "full"):
    """One prefill or decode loop of the ``inference`` study's speed config ``config``
    (``params.yaml``'s settings of ``profile``) exported as ``fmt``, compiled as its speed cell
    compiles it (``repro.experiments.inference.speed``); emulated as that cell would say."""
    from repro import studies
    from repro.experiments.inference import speed as inference_speed
    from repro.precision import export

    p = studies.params("inference", profile)
    cfg = inference_speed.model_config(config, inference_speed.speed_configs(p)[config])
    sp = p["speed"]
    length = cfg.seq_len if phase == "prefill" else sp["prompt_len"]
    compiled, args, _, facts = inference_speed._program(cfg, fmt, phase, batch, length,
                                                        sp["decode_steps"])
    emulated = inference_speed.speed_emulated(export.resolve_format(fmt), facts["lowering"])
    return (lambda: compiled(*args)), {**facts, "emulated": emulated}


def profile_cell(workload: str, recipes: list[str], steps: int, sizes: dict[str, Any],
                 make_runner: Callable[[str], tuple[Callable[[], Any], dict]],
                 profile: str = "full") -> list[dict[str, Any]]:
    """Records of one shape, one recipe after the other; [] where the trace has no kernels.

    ``make_runner(recipe)`` gives ``(run, facts)``: one training step and the compiled
    program's facts (``repro.studies.lowering.compiled_facts``), whose FP8 lowering says whether the
    recipe ran emulated (then the kernels are those of the emulation, and records say so);
    facts with an ``emulated`` key (the GEMM workload's dtypes) say it themselves."""
    from repro.studies.lowering import recipe_emulated

    records = []
    for r in recipes:
        run, facts = make_runner(r)
        with tempfile.TemporaryDirectory() as tmp:
            wall = trace_steps(run, steps, Path(tmp))
            kernels = kernel_events(load_trace(Path(tmp)))
        if kernels.empty:
            print(f"kernelprof: {workload} {r}: the trace holds no device kernels "
                  f"(backend {jax.default_backend()}): nothing recorded", file=sys.stderr)
            continue
        s = summarize(kernels, steps)
        extra = {"steps_traced": steps, "top_kernels": s.pop("top_kernels"),
                 "note": "JAX profiler (CUPTI) trace; kernel times of all streams added"}
        common = dict(claims=CLAIMS, recipe=r, sizes={"workload": workload, **sizes},
                      repeats=steps, profile=profile, extra=extra,
                      emulated=bool(facts["emulated"]) if "emulated" in facts
                      else recipe_emulated(r, facts["fp8_lowering"]))
        for metric, value in {**s, "wall_ms_per_step": wall * 1e3}.items():
            unit = "kernels" if metric == "kernels_per_step" else "ms"
            records.append(results.make_record(EXPERIMENT, metric, value, unit, **common))
    return records


# the workload of each experiment whose step `repro trace` traces (repro.experiments)
WORKLOADS = tuple(e.trace.workload for e in catalogue.TRACED)
_DEFAULT_RECIPES = {e.trace.workload: e.trace.recipes for e in catalogue.TRACED}
PHASES = ("prefill", "decode")
MLP_GEMMS = tuple((65536, w, w) for w in (256, 512, 1024, 2048, 4096))  # mlp_step's GEMMs


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """What ``repro trace`` traces: ``workload`` (mlp, lm, gemm, ppo, inference) under
    ``recipes`` (gemm: dtypes; inference: formats), ``steps`` steps per recipe; ``shapes``
    (gemm: one cell per MxKxN), ``width``/``depth``/``batch`` (mlp; ppo: the width and
    ``num_envs`` of the rl_throughput cell whose update is traced, with ``profile``'s
    rl_throughput settings), ``size``/``batch`` (lm), ``config``/``phase``/``batch``
    (inference: a speed config of ``profile``'s inference settings, prefill or decode, and
    its sequences: default the config's prefill batch, 1 for decode). ``profile``: the
    records' (where they go)."""

    workload: str
    recipes: tuple[str, ...] = ()
    steps: int = 5
    shapes: tuple[tuple[int, int, int], ...] = MLP_GEMMS
    width: int = 256
    depth: int = 3
    num_envs: int = 2048
    batch: int | None = None
    size: str = "20m"
    config: str = "wide"
    phase: str = "decode"


def parse_shapes(text: str) -> tuple[tuple[int, int, int], ...]:
    """``"MxKxN,MxKxN"`` -> shapes; a one-line ``ValueError`` for anything else."""
    try:
        shapes = tuple(tuple(int(v) for v in x.lower().split("x")) for x in text.split(","))
        if shapes and all(len(t) == 3 and min(t) > 0 for t in shapes):
            return shapes
    except ValueError:
        pass
    raise ValueError(f"--shapes: expected MxKxN[,MxKxN...] of positive integers, got {text!r}")


def default_recipes(workload: str) -> tuple[str, ...]:
    return _DEFAULT_RECIPES.get(workload, ("bf16", "fp8-delayed"))


def check(p: Params) -> None:
    """The workload, every recipe (gemm: dtype) and size: before anything compiles."""
    from repro.experiments.gemm.measure import _check_dtypes
    from repro.precision.recipes import resolve

    if p.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {p.workload!r}; valid: {', '.join(WORKLOADS)}")
    if not p.recipes:
        raise ValueError("no recipes to trace")
    if p.workload == "inference":
        from repro import studies
        from repro.experiments.inference.speed import speed_configs
        from repro.precision.export import resolve_format

        if p.phase not in PHASES:
            raise ValueError(f"unknown phase {p.phase!r}; valid: {', '.join(PHASES)}")
        configs = speed_configs(studies.params("inference", p.profile))
        if p.config not in configs:
            raise ValueError(f"inference: no speed config {p.config!r} in the {p.profile} "
                             f"profile; valid: {', '.join(configs)}")
    for r in p.recipes:
        if p.workload == "gemm":
            _check_dtypes([r])
        elif p.workload == "inference":
            resolve_format(r)
        else:
            resolve(r)
    sizes = {"steps": p.steps, "width": p.width, "depth": p.depth, "num_envs": p.num_envs,
             "batch": p.batch or 1, **{f"shape {s}": min(s) for s in p.shapes}}
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"kernel_times: {name} must be positive integers, got {v!r}")
    if p.workload == "lm":
        from repro.experiments.lm_step.measure import check_size

        check_size(p.size)


def program(workload: str, recipe: str, **settings) -> Program:
    """What a record of ``recipe`` (gemm: a dtype; inference: a format) in a cell of
    ``workload`` measures: the step the cell traces, as its own study names it (``gemm``:
    :func:`repro.experiments.gemm.measure.program` of ``m``, ``k``, ``n``; ``mlp``:
    :func:`repro.experiments.mlp_step.measure.program` of ``width``, ``batch``, ``depth``;
    ``lm``: :func:`repro.experiments.lm_step.measure.program` of ``size``, ``batch``;
    ``inference``: the format's prefill or decode loop,
    :func:`repro.experiments.inference.measure.program` of one ``phase``, ``batch``, ``length``
    of speed config ``config`` (``spec``) without BF16 beside it; ``ppo``: the update step of
    the ``rl_throughput`` cell of ``network``, ``width``, ``num_envs`` and that study's loop
    sizes, ``repro.models.ppo.make_update_step`` on a rollout-shaped batch, as
    ``repro.experiments.rl_throughput.measure.update_step`` builds it), with this study's kit:
    the traced steps and the kernel statistics."""
    from repro.studies import kernel_trace as traces

    kit = (trace_steps, traces.kernel_events, traces.kernel_class, traces.load_trace,
           traces.summarize)
    s = settings
    if workload == "gemm":
        from repro.experiments.gemm import measure as bench

        prog = bench.program(recipe, int(s["m"]), int(s["k"]), int(s["n"]))
    elif workload == "mlp":
        from repro.experiments.mlp_step import measure as mlpbench

        prog = mlpbench.program(recipe, int(s["width"]), int(s["batch"]), int(s["depth"]))
    elif workload == "lm":
        from repro.experiments.lm_step import measure as lmbench

        prog = lmbench.program(recipe, str(s["size"]), int(s["batch"]))
    elif workload == "inference":
        from repro.experiments.inference import measure as infer

        prog = infer.program(recipe, "speed", config=s["config"], spec=dict(s["spec"]),
                             phases=[[s["phase"], int(s["batch"]), int(s["length"])]],
                             decode_steps=int(s["decode_steps"]), reference=False)
    elif workload == "ppo":
        from repro.experiments.rl_throughput import measure as rl_throughput

        _, prog = rl_throughput.update_step_program(
            s["network"], int(s["width"]), recipe, int(s["num_envs"]), s["env"],
            int(s["num_steps"]), int(s["updates"]), int(s["depth"]), int(s["update_epochs"]),
            int(s["num_minibatches"]))
    else:
        raise ValueError(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}")
    return Program(prog.fn, prog.args, kit=kit)


def _ppo_settings(width: int, num_envs: int, profile: str) -> dict[str, Any]:
    """The ``rl_throughput`` settings of ``profile`` the PPO update of width ``width`` and
    ``num_envs`` environments is built with (``_ppo_runner``)."""
    from repro import studies
    from repro.experiments.rl_throughput import measure as rl_throughput

    p = studies.params(rl_throughput.THROUGHPUT, profile)
    return {"network": "mlp", "width": int(width), "num_envs": int(num_envs),
            "env": p.networks["mlp"], "num_steps": p.num_steps, "updates": p.updates,
            "depth": p.depth, "update_epochs": p.update_epochs,
            "num_minibatches": p.num_minibatches}


def _inference_settings(config: str, phase: str, batch: int, profile: str) -> dict[str, Any]:
    """The settings of one phase of speed config ``config`` (``params.yaml``'s inference
    settings of ``profile``, as ``_inference_runner`` reads them)."""
    from repro import studies
    from repro.experiments.inference.speed import model_config, speed_configs

    p = studies.params("inference", profile)
    spec, sp = dict(speed_configs(p)[config]), p["speed"]
    length = model_config(config, spec).seq_len if phase == "prefill" else sp["prompt_len"]
    return {"config": config, "spec": spec, "phase": phase, "batch": int(batch),
            "length": int(length), "decode_steps": int(sp["decode_steps"])}


def program_settings(rec: dict) -> dict | None:
    """:func:`program`'s settings of a record: its workload, recipe and sizes; for ``ppo``
    and ``inference`` also the settings of the cell they trace, from params.yaml's
    ``rl_throughput`` / ``inference`` section of the record's profile (the settings a
    ``repro trace`` of that profile reads)."""
    sizes, recipe = rec.get("sizes") or {}, rec.get("recipe")
    workload, profile = sizes.get("workload"), str(rec.get("profile") or "full")
    if not recipe or workload not in WORKLOADS:
        return None
    try:
        if workload == "gemm":
            more = {"m": int(sizes["M"]), "k": int(sizes["K"]), "n": int(sizes["N"])}
        elif workload == "mlp":
            more = {k: int(sizes[k]) for k in ("width", "batch", "depth")}
        elif workload == "lm":
            more = {"size": str(sizes["model"]), "batch": int(sizes["batch"])}
        elif workload == "ppo":
            if sizes.get("network", "mlp") != "mlp":
                return None
            more = _ppo_settings(sizes["width"], sizes["num_envs"], profile)
        else:
            more = _inference_settings(sizes["config"], sizes["phase"], sizes["batch"],
                                       profile)
    except (KeyError, TypeError, ValueError):
        return None
    return {"workload": workload, "recipe": recipe, **more}


def cells(p: Params) -> list[Cell]:

    """One cell per shape for gemm, one for mlp / lm / ppo; all recipes traced in each."""
    recipes = list(p.recipes)
    if p.workload == "gemm":
        plan = [(f"gemm_{m}x{k}x{n}", {"M": m, "K": k, "N": n},
                 lambda r, m=m, k=k, n=n: _gemm_runner(r, m, k, n)) for m, k, n in p.shapes]
    elif p.workload == "mlp":
        batch = p.batch or 65536
        plan = [(f"mlp_{batch}x{p.width}x{p.depth}",
                 {"batch": batch, "width": p.width, "depth": p.depth},
                 lambda r: _mlp_runner(r, p.width, batch, p.depth))]
    elif p.workload == "inference":
        from repro import studies
        from repro.experiments.inference.speed import speed_configs

        spec = speed_configs(studies.params("inference", p.profile))[p.config]
        batch = p.batch or (int(spec.get("prefill_batch", 1)) if p.phase == "prefill" else 1)
        plan = [(f"inference_{p.config}_{p.phase}_b{batch}",
                 {"config": p.config, "phase": p.phase, "batch": batch},
                 lambda r: _inference_runner(r, p.config, p.phase, batch, p.profile))]
    elif p.workload == "ppo":
        plan = [(f"ppo_update_w{p.width}_e{p.num_envs}",
                 {"network": "mlp", "width": p.width, "num_envs": p.num_envs},
                 lambda r: _ppo_runner(r, p.width, p.num_envs, p.profile))]
    else:
        batch = p.batch or 64
        plan = [(f"lm_{p.size}_b{batch}", {"model": p.size, "batch": batch},
                 lambda r: _lm_runner(r, p.size, batch))]

    def one(sizes, make):
        return lambda _budget: profile_cell(p.workload, recipes, p.steps, sizes, make, p.profile)

    def programs(sizes):
        def build():
            rec = {"sizes": {"workload": p.workload, **sizes}, "profile": p.profile}
            return {r: program(**program_settings({**rec, "recipe": r})) for r in recipes}
        return build

    return [Cell(f"{name}_{'_'.join(recipes)}", one(sizes, make), tuple(recipes),
                 programs=programs(sizes)) for name, sizes, make in plan]


STUDY = Study(EXPERIMENT, tuple(CLAIMS), cells, check, about="kernel times of traced steps",
              params=Params, section=None)
