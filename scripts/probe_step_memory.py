"""Probe: what holds the memory of an MLP train step or a PPO update at its peak, per recipe.

For the MLP step of ``repro.experiments.mlp_step.measure`` (fwd + bwd + Adam, FP32 master
weights) at one shape, or (``--workload ppo``) the PPO update that ``rl_throughput`` times
(``repro.experiments.rl_throughput.measure.update_step``: its full profile's MinAtar MLP at
``--width`` and ``--envs``), compiles each recipe's program and prints XLA's own account: ``memory_analysis`` (arguments, outputs, temporaries, aliased; the step's
``step_memory_bytes`` is args + outputs + temps - aliased); from XLA's buffer live ranges, the
buffers live at the program's peak, largest first, each with its shape and the JAX operation
that made it; and the layout of the temporary allocation (XLA's memory-usage report): its
slots, largest first, each with the shapes of the values that take turns in it; and the
temporary allocation over time (``repro.experiments.mlp_step.tables.temp_timeline``): its
extent, the largest sum of its values live at one instruction, and the values live there with
their offsets. XLA's own live-range "peak" counts arguments too and can sit elsewhere; the
extent beyond the temporaries' live peak is what XLA's packing of them costs.
Recipes take the lever syntax of ``mlp_step`` (``base:field=value``). Run it on the GPU the
question is about: XLA:CPU assigns buffers differently, so CPU numbers only check the script.

``--measure`` also runs each compiled program once, in a fresh process per recipe (the
executable compiled here is handed to it, so no autotuning allocates there), and prints the
device's measured peak (``memory_stats()["peak_bytes_in_use"]``) beside XLA's estimate: the
bytes resident when the program starts (its arguments, the data), the process's peak before
the run (the setup's) and after it; where the run did not raise the peak, its own peak is not
known (at most the setup's). A device without memory statistics (a CPU) says so.

    PYTHONPATH=. python3 scripts/probe_step_memory.py --width 4096 \\
        bf16 fp8-delayed fp8-delayed:fp8_layout=natural
    PYTHONPATH=. python3 scripts/probe_step_memory.py --workload ppo --width 4096 \\
        --envs 2048 --measure fp16 fp8-delayed fp8-lean
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RUN_ONE = "--run-serialized"  # the fresh process of --measure: no dump there
DUMP = Path(tempfile.mkdtemp(prefix="probe_step_memory_"))
MODULE = {"mlp": ".*step.*", "ppo": ".*update.*"}  # the jitted function's module name
if RUN_ONE not in sys.argv:
    # before JAX starts its backend: dump only the program's optimized module
    _w = sys.argv[sys.argv.index("--workload") + 1] if "--workload" in sys.argv else "mlp"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP}"
                               f" --xla_dump_hlo_module_re={MODULE.get(_w, '.*')}")

import jax  # noqa: E402

from repro.experiments.mlp_step import measure as mlp_step  # noqa: E402
from repro.experiments.mlp_step.tables import temp_timeline  # noqa: E402
from repro.precision.recipes import resolve  # noqa: E402

_BUFFER = re.compile(r"^\s+(\S+)\{[^}]*\}: (\d+) bytes")


def _shapes(hlo: str) -> dict[str, str]:
    """Instruction name -> its result shape, from optimized HLO text."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+?\[[^\]]*\](?:\{[^}]*\})?|\([^=]*?\))"
                         r" ", hlo, re.M):
        out[m.group(1)] = re.sub(r"\{[^}]*\}$", "", m.group(2))
    return out


def peak(dump: Path) -> tuple[int | None, list[tuple[str, int]], list[str]]:
    """From the newest ``*live-range.txt`` in ``dump``: the peak's instruction index, the
    buffers live there (name, bytes), and the stack-trace breakdown lines that follow."""
    files = sorted(dump.glob("*after_optimizations-live-range.txt"),
                   key=lambda p: p.stat().st_mtime)
    if not files:
        return None, [], []
    text = files[-1].read_text().splitlines()
    at, bufs, stack, part = None, [], [], None
    for line in text:
        m = re.match(r"\s+Live ranges at (\d+) \(peak\):", line)
        if m:
            at, part = int(m.group(1)), "bufs"
            continue
        if line.strip().startswith("Stack trace breakdown"):
            part = "stack"
        if part == "bufs" and (b := _BUFFER.match(line)):
            bufs.append((b.group(1), int(b.group(2))))
        elif part == "stack":
            stack.append(line.rstrip())
    return at, bufs, stack


def build(workload: str, recipe: str, a) -> tuple:
    """``(jitted program, its arguments, what it is)``: the MLP train step of ``mlp_step`` or
    the PPO update of ``rl_throughput`` (its full profile's settings) for ``recipe``."""
    if workload == "mlp":
        step, variables, opt_state, x, y = mlp_step._setup(resolve(recipe), a.width, a.batch,
                                                           a.depth)
        return step, (variables, opt_state, x, y), (f"MLP step, width {a.width} batch "
                                                    f"{a.batch} depth {a.depth}")
    from repro import studies
    from repro.experiments.rl_throughput import measure as rl

    p = studies.params("rl_throughput", "full")
    c = rl.throughput_config("mlp", a.width, recipe, a.envs, p)
    update, args = rl.update_step(c)
    return update, args, (f"PPO update, {c.env} MLP width {a.width}, {c.num_envs} envs x "
                          f"{c.num_steps} steps, minibatch {c.minibatch_size}")


def estimate(compiled) -> int:
    """XLA's bytes of a compiled program: arguments + outputs + temporaries - aliased (the
    records' ``step_memory_bytes`` and ``update_memory_bytes``)."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def _stats() -> dict | None:
    try:
        return jax.devices()[0].memory_stats() or None
    except Exception:  # noqa: BLE001 - a backend without memory statistics
        return None


def run_serialized(path: str, workload: str, recipe: str, a) -> dict:
    """The fresh process of ``--measure``: the program's arguments made here, the executable
    compiled by the parent loaded (nothing compiles or autotunes here), one run; the device's
    memory statistics around it."""
    from jax.experimental.serialize_executable import deserialize_and_load

    _, args, _ = build(workload, recipe, a)
    jax.block_until_ready(args)
    payload, in_tree, out_tree = pickle.loads(Path(path).read_bytes())
    compiled = deserialize_and_load(payload, in_tree, out_tree)
    before = _stats()
    jax.block_until_ready(compiled(*args))
    after = _stats()
    if before is None or after is None:
        return {"stats": None}
    return {"stats": True, "resident": int(before["bytes_in_use"]),
            "peak_before": int(before["peak_bytes_in_use"]),
            "peak_after": int(after["peak_bytes_in_use"])}


def measured_peak(compiled, workload: str, recipe: str, a) -> dict:
    """:func:`run_serialized` in a fresh process for ``compiled``; its JSON, or why none."""
    from jax.experimental.serialize_executable import serialize

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "program.pickle"
        path.write_bytes(pickle.dumps(serialize(compiled)))
        cmd = [sys.executable, __file__, RUN_ONE, str(path), "--workload", workload,
               "--width", str(a.width), "--batch", str(a.batch), "--depth", str(a.depth),
               "--envs", str(a.envs), recipe]
        out = subprocess.run(cmd, capture_output=True, text=True)
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")), None)
    if out.returncode or line is None:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(line)


def peak_line(est: int, m: dict) -> str:
    """XLA's estimate beside the device's measured peak, in one line."""
    if "error" in m:
        return f"   measured: the fresh process failed: {m['error']}"
    if not m.get("stats"):
        return "   measured: this device reports no memory statistics"
    gb = 1e9
    ran = m["peak_after"] > m["peak_before"]
    told = (f"measured peak {m['peak_after'] / gb:.3f} GB (the run's; "
            f"{m['peak_after'] / est:.3f} of XLA's estimate)" if ran else
            f"the run did not raise the process's peak {m['peak_after'] / gb:.3f} GB (the "
            "setup's): its own peak is at most that")
    return (f"   XLA's estimate {est / gb:.3f} GB; resident at the start {m['resident'] / gb:.3f}"
            f" GB; {told}")


def probe(workload: str, recipe: str, a, top: int) -> None:
    shutil.rmtree(DUMP)
    DUMP.mkdir()
    fn, args, what = build(workload, recipe, a)
    compiled = fn.lower(*args).compile()
    m = compiled.memory_analysis()
    total = estimate(compiled)
    print(f"== {recipe}  {what} on {jax.devices()[0]}")
    print(f"   step memory {total / 1e9:.3f} GB = args {m.argument_size_in_bytes / 1e9:.3f} + "
          f"outputs {m.output_size_in_bytes / 1e9:.3f} + temps {m.temp_size_in_bytes / 1e9:.3f}"
          f" - aliased {m.alias_size_in_bytes / 1e9:.3f}")
    if a.measure:
        print(peak_line(total, measured_peak(compiled, workload, recipe, a)), flush=True)
    at, bufs, stack = peak(DUMP)
    if at is None:
        print("   (no live-range dump: this XLA writes none)")
        return
    hlo = next(iter(sorted(DUMP.glob("*after_optimizations.txt"))), None)
    shape = _shapes(hlo.read_text()) if hlo else {}
    live = sum(b for _, b in bufs)
    print(f"   live at the peak (instruction {at}): {live / 1e9:.3f} GB in {len(bufs)} buffers")
    for name, size in sorted(bufs, key=lambda b: -b[1])[:top]:
        print(f"   {size / 1e6:10.1f} MB  {shape.get(name, '?'):28s} {name}")
    print("\n".join(stack[:top + 2]))
    assignment = sorted(DUMP.glob("*after_optimizations-buffer-assignment.txt"))
    ranges = sorted(DUMP.glob("*after_optimizations-live-range.txt"))
    text = assignment[-1].read_text() if assignment else ""
    if ranges and "preallocated-temp" in text:
        extent, most, at, name, live = temp_timeline(text, ranges[-1].read_text())
        print(f"   temporary allocation: {extent / 2**20:.0f} MiB; its values' live peak "
              f"{most / 2**20:.0f} MiB at instruction {at} ({name}), held at [offset, end) MiB:")
        for n, o, size, shape in [v for v in live if v[2] >= 2**20][:top]:
            print(f"   [{o / 2**20:7.0f}, {(o + size) / 2**20:7.0f})  {shape:28s} {n}")
    report = sorted(DUMP.glob("*memory-usage-report.txt"))
    if report:
        lines = report[-1].read_text().splitlines()
        print("   temporary allocation, slots largest first (XLA's memory-usage report):")
        print("\n".join("   " + line for line in lines[1:top + 4]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipes", nargs="+", help="recipes (mlp_step lever syntax allowed)")
    ap.add_argument("--workload", choices=sorted(MODULE), default="mlp")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=65536, help="MLP rows")
    ap.add_argument("--depth", type=int, default=3, help="MLP layers")
    ap.add_argument("--envs", type=int, default=2048, help="PPO environments")
    ap.add_argument("--measure", action="store_true",
                    help="also run each program once in a fresh process: the device's peak")
    ap.add_argument("--top", type=int, default=12, help="largest live buffers to list")
    ap.add_argument(RUN_ONE, dest="run_one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.run_one:
        print(json.dumps(run_serialized(a.run_one, a.workload, a.recipes[0], a)), flush=True)
        return 0
    for r in a.recipes:
        probe(a.workload, r, a, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
