"""Where a training step's device time goes, kernel by kernel (issue 6: the perfmodel's misses).

    python -m repro.studies.kernel_times mlp --width 256 --recipes bf16,fp8-delayed   # on a GPU
    python -m repro.studies.kernel_times lm --size 20m --batch 64 --recipes bf16,fp8-delayed
    python -m repro.studies.kernel_times gemm --recipes bf16,fp8     # the gemm sweep's GEMMs, traced
    python -m repro.studies.kernel_times ppo --width 4096 --recipes bf16,fp8-delayed   # the PPO update

The step is built and compiled exactly as the ``mlp_step`` / ``lm_step`` benchmarks do it
(``repro.studies.mlp_step._setup`` and ``_compile``, ``repro.studies.lm_step.compile_step``; ``ppo``: the update
step of an ``rl_throughput`` MLP cell, ``repro.studies.rl_throughput.update_program``), run once to warm
up, and then ``--steps`` steps run under JAX's profiler (CUPTI on a GPU). The Perfetto trace's
kernel events on the device's streams are classed by name (:func:`kernel_class`: gemm,
attention, collective, memory, other) and summed. Per recipe, records under
``results/<hardware>/kernel_times/<cell>.json``: ``<class>_ms_per_step`` for every class,
``kernel_ms_per_step`` (their sum: device busy time, streams added up), ``kernels_per_step``
and ``wall_ms_per_step`` (wall time per traced step, profiler on: an upper bound of the
untraced step). ``extra.top_kernels`` lists the costliest kernels.

This is what :mod:`repro.perfmodel` cannot see from step times alone: how much of a step the
GEMMs take, how much the quantization and other fusions, and how much is gaps between
kernels. The ``gemm`` workload traces single calls of the ``gemm`` sweep's GEMM (dtypes, not
recipes): their device time without the host's per-call overhead, which swamps a small GEMM
in the sweep's wall-clock timing; ``perfmodel.RateTable`` prefers it where it exists. On a
CPU the trace holds no device kernels: nothing is recorded, and it says so.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import jax

from repro import results
from repro.analysis.traces import kernel_events, load_trace, summarize

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
    from repro.studies import mlp_step as mlpbench
    from repro.studies import timing

    step, variables, opt_state, x, y = mlpbench._setup(recipe, width, batch, depth)
    compiled, facts = mlpbench._compile(step, variables, opt_state, x, y)
    return timing.stepper(compiled, variables, opt_state, x, y), facts


def _lm_runner(recipe: str, size: str, batch: int):
    from repro.studies import lm_step as lmbench

    cfg = lmbench.check_size(size)
    x, y = lmbench.fixed_batch(cfg, batch, [recipe])
    facts, _, run = lmbench.compile_step(cfg, recipe, x, y, f"{size} b{batch}")
    return run, facts


def _gemm_runner(dtype: str, m: int, k: int, n: int):
    """One GEMM call of the ``gemm`` sweep (``repro.studies.gemm``: same operands and function)."""
    from repro.studies import gemm as bench
    from repro.studies import timing

    a, b = bench._random_inputs(jax.random.key(0), m, k, n)
    ops = bench.gemm_operands(dtype, a, b)
    info = timing.compiled_gemm_info(bench.gemm_fn(dtype), *ops)
    fn = jax.jit(bench.gemm_fn(dtype))
    return (lambda: fn(*ops)), {**info, "emulated": bench._emulated(dtype, info,
                                                                    jax.default_backend())}


def _ppo_runner(token: str, width: int, num_envs: int, profile: str = "full"):
    """The PPO update of the ``rl_throughput`` MLP cell ``mlp_w{width}_{token}_e{num_envs}``
    (``params.yaml``'s settings of ``profile``), built as that cell builds it
    (``repro.studies.rl_throughput.update_program``); ``token`` is a recipe name such as
    ``fp8-all-layers``."""
    from repro.config import stage_params
    from repro.studies import rl_throughput as X
    from repro.studies.timing import compiled_facts, recipe_emulated

    c = X.throughput_config("mlp", width, token, num_envs, stage_params(X.THROUGHPUT, profile))
    compiled, args, _ = X.update_program(c)
    facts = compiled_facts(compiled)
    return (lambda: compiled(*args)), {
        **facts, "emulated": recipe_emulated(c.recipe, facts["fp8_lowering"])}


def profile_cell(workload: str, recipes: list[str], steps: int, sizes: dict[str, Any],
                 make_runner: Callable[[str], tuple[Callable[[], Any], dict]],
                 profile: str = "full") -> list[dict[str, Any]]:
    """Records of one shape, one recipe after the other; [] where the trace has no kernels.

    ``make_runner(recipe)`` gives ``(run, facts)``: one training step and the compiled
    program's facts (``repro.studies.gemm.compiled_facts``), whose FP8 lowering says whether the
    recipe ran emulated (then the kernels are those of the emulation, and records say so);
    facts with an ``emulated`` key (the GEMM workload's dtypes) say it themselves."""
    from repro.studies.timing import recipe_emulated

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.studies.kernel_times", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("workload", choices=["mlp", "lm", "gemm", "ppo"])
    ap.add_argument("--recipes", default=None,
                    help="comma-separated (default bf16,fp8-delayed; gemm: dtypes, bf16,fp8)")
    ap.add_argument("--shapes", default=",".join(f"65536x{w}x{w}"
                                                 for w in (256, 512, 1024, 2048, 4096)),
                    help="gemm: MxKxN,... (one cell each; shapes of the gemm sweep; default: "
                         "the mlp_step GEMMs)")
    ap.add_argument("--width", type=int, default=256, help="mlp: width")
    ap.add_argument("--depth", type=int, default=3, help="mlp: depth")
    ap.add_argument("--num-envs", type=int, default=2048,
                    help="ppo: parallel envs of the rl_throughput cell whose update is traced "
                         "(MLP of --width; --profile's rl_throughput settings)")
    ap.add_argument("--batch", type=int, default=None,
                    help="rows (mlp, default 65536) or sequences (lm, default 64)")
    ap.add_argument("--size", default="20m", help="lm: model preset")
    ap.add_argument("--steps", type=int, default=5, help="steps traced per recipe")
    ap.add_argument("--force", action="store_true", help="re-record a recorded cell")
    ap.add_argument("--profile", default="full", help="records' profile (where they go)")
    a = ap.parse_args(argv)
    from repro.precision.recipes import resolve
    from repro.studies.gemm import _check_dtypes

    gemm = a.workload == "gemm"
    recipes = [r for r in (a.recipes or ("bf16,fp8" if gemm else "bf16,fp8-delayed")).split(",")
               if r]
    try:  # an unknown recipe fails before any compilation, naming the valid ones
        for r in recipes:
            if gemm:
                _check_dtypes([r])
            else:
                resolve(r)
    except ValueError as e:
        ap.error(str(e))
    # (cell, sizes, make_runner) per cell: one per shape for gemm, one for mlp / lm
    if gemm:
        try:
            shapes = [tuple(int(v) for v in x.lower().split("x")) for x in a.shapes.split(",")]
            assert shapes and all(len(t) == 3 and min(t) > 0 for t in shapes)
        except (ValueError, AssertionError):
            ap.error(f"--shapes: expected MxKxN[,MxKxN...], got {a.shapes!r}")
        cells = [(f"gemm_{m}x{k}x{n}", {"M": m, "K": k, "N": n},
                  lambda r, m=m, k=k, n=n: _gemm_runner(r, m, k, n)) for m, k, n in shapes]
    elif a.workload == "mlp":
        batch = a.batch or 65536
        cells = [(f"mlp_{batch}x{a.width}x{a.depth}",
                  {"batch": batch, "width": a.width, "depth": a.depth},
                  lambda r: _mlp_runner(r, a.width, batch, a.depth))]
    elif a.workload == "ppo":
        cells = [(f"ppo_update_w{a.width}_e{a.num_envs}",
                  {"network": "mlp", "width": a.width, "num_envs": a.num_envs},
                  lambda r: _ppo_runner(r, a.width, a.num_envs, a.profile))]
    else:
        batch = a.batch or 64
        cells = [(f"lm_{a.size}_b{batch}", {"model": a.size, "batch": batch},
                  lambda r: _lm_runner(r, a.size, batch))]
    root = results.record_root(a.profile)
    for cell, sizes, make in cells:
        cell += "_" + "_".join(recipes)
        if not a.force and results.have_cell(EXPERIMENT, cell, root=root):
            print(f"kernelprof: {cell} already recorded (--force to redo)")
            continue
        recs = profile_cell(a.workload, recipes, a.steps, sizes, make, a.profile)
        if recs:
            print(results.write_records(recs, EXPERIMENT, cell, root=root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
