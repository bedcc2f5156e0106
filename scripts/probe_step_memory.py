"""Probe: what holds the memory of an MLP train step at its peak, per recipe.

For the MLP step of ``repro.experiments.mlp_step.measure`` (fwd + bwd + Adam, FP32 master
weights) at one shape, compiles each recipe's step (compile only, nothing runs) and prints
XLA's own account: ``memory_analysis`` (arguments, outputs, temporaries, aliased; the step's
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

    PYTHONPATH=. python3 scripts/probe_step_memory.py --width 4096 \\
        bf16 fp8-delayed fp8-delayed:fp8_layout=natural
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

DUMP = Path(tempfile.mkdtemp(prefix="probe_step_memory_"))
# before JAX starts its backend: dump only the train step's optimized module
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_dump_to={DUMP} --xla_dump_hlo_module_re=.*step.*")

import jax  # noqa: E402

from repro.experiments.mlp_step import measure as mlp_step  # noqa: E402
from repro.experiments.mlp_step.tables import temp_timeline  # noqa: E402

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


def probe(recipe: str, width: int, batch: int, depth: int, top: int) -> None:
    shutil.rmtree(DUMP)
    DUMP.mkdir()
    step, variables, opt_state, x, y = mlp_step._setup(recipe, width, batch, depth)
    compiled = step.lower(variables, opt_state, x, y).compile()
    m = compiled.memory_analysis()
    total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)
    print(f"== {recipe}  width {width} batch {batch} depth {depth} on {jax.devices()[0]}")
    print(f"   step memory {total / 1e9:.3f} GB = args {m.argument_size_in_bytes / 1e9:.3f} + "
          f"outputs {m.output_size_in_bytes / 1e9:.3f} + temps {m.temp_size_in_bytes / 1e9:.3f}"
          f" - aliased {m.alias_size_in_bytes / 1e9:.3f}")
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
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--top", type=int, default=12, help="largest live buffers to list")
    a = ap.parse_args(argv)
    for r in a.recipes:
        probe(r, a.width, a.batch, a.depth, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
