"""The MLP training-step benchmark (``mlp_step`` records): speedups, GEMM ceilings, levers.

Every ``mlp_step`` cell times all its recipes interleaved in one process, so a speedup is a
ratio of two timings of one run. ``step_table`` adds the BF16 time of the same cell and the
speedup; ``gemm_ceiling`` reads the FP8/16-bit rate ratio of the matching GEMM from the ``gemm``
records; ``lever_delta`` is what switching one lever back costs, timed in the lever's own cell.
``temp_timeline`` reads where a compiled step's temporary memory goes from XLA's dumps
(``scripts/probe_step_memory.py``).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from repro.precision.recipes import resolve

OURS = ("fp8-current", "fp8-delayed")  # this repository's FP8 defaults


def kind(recipe: str) -> str:
    """``baseline`` (no FP8 GEMM), ``peer`` (another library's FP8), ``ours`` (a default FP8
    recipe) or ``ablation`` (a lever variant of one)."""
    r = resolve(recipe)
    if r.backend != "repro":
        return "peer"
    if r.gemm != "fp8":
        return "baseline"
    return "ours" if recipe in OURS else "ablation"


def step_table(df: pd.DataFrame) -> pd.DataFrame:
    """``step_time_ms`` records with ``width``, ``batch``, ``kind``, ``bf16_ms`` (BF16 of the
    same cell) and ``speedup`` (BF16 time / this time), and ``lever_cell``: the row comes from
    a lever cell (``..._levers``), which times an ablation beside BF16 and the defaults again.
    The defaults and BF16 of lever cells serve :func:`lever_delta` only: ``main`` marks the
    rows that make one number per (hardware, width, recipe)."""
    steps = df[df.metric == "step_time_ms"].copy() if len(df) else pd.DataFrame()
    if not len(steps):
        return pd.DataFrame(columns=["hardware", "width", "batch", "recipe", "value", "kind",
                                     "speedup", "main", "emulated"])
    steps["width"] = steps.size_width.astype(int)
    steps["batch"] = steps.size_batch.astype(int)
    steps["kind"] = steps.recipe.map(kind)
    base = steps[steps.recipe == "bf16"].set_index("source")
    steps["bf16_ms"] = steps.source.map(base.value)
    steps["speedup"] = steps.bf16_ms / steps.value
    steps["lever_cell"] = steps.source.astype(str).str.contains("_levers")
    steps["main"] = ~steps.lever_cell | ~steps.recipe.isin(["bf16", *OURS])
    # A per-layer policy (fp8-auto) that kept every GEMM in BF16 ran no FP8 at all: its timing
    # is native BF16, although `studies.timing.recipe_emulated` marks any FP8 recipe whose
    # program has no FP8 GEMM as emulated.
    lowering = steps["extra"].map(lambda e: e.get("fp8_lowering") if isinstance(e, dict) else None)
    policy = steps.recipe.map(lambda r: resolve(r).fp8_min_dim > 0)
    steps.loc[policy & (lowering == "no-f8"), "emulated"] = False
    return steps


def native(steps: pd.DataFrame) -> pd.DataFrame:
    """Rows of hardware where every FP8 recipe ran natively (no emulated FP8 record)."""
    if not len(steps):
        return steps
    fp8 = steps[steps.kind != "baseline"]
    hws = [h for h, g in fp8.groupby("hardware") if len(g) and not g.emulated.any()]
    return steps[steps.hardware.isin(hws)]


def gemm_ceiling(gemm: pd.DataFrame, hardware: str, batch: int, width: int) -> float | None:
    """FP8 / 16-bit TFLOP/s of the ``batch x width x width`` GEMM on ``hardware``, the 16-bit
    rate the faster of BF16 and FP16 (same tensor cores, same peak); None if not recorded."""
    if not len(gemm):
        return None
    g = gemm[(gemm.hardware == hardware) & (gemm.metric == "tflops") & ~gemm.emulated
             & (gemm.size_M == batch) & (gemm.size_K == width) & (gemm.size_N == width)]
    g = g.sort_values("timestamp").drop_duplicates("recipe", keep="last").set_index("recipe")
    if not {"fp8", "bf16"} <= set(g.index):
        return None
    return float(g.value["fp8"] / g.value.reindex(["bf16", "fp16"]).max())


def lever_delta(steps: pd.DataFrame, hardware: str, ablation: str, default: str, width: int,
                batch: int) -> tuple[float, float] | None:
    """(ms, sd): the ablation's median step time minus the default's, both timed in the
    ablation's own cell; sd combines their interquartile ranges (IQR / 1.35 each)."""
    g = steps[(steps.hardware == hardware) & (steps.width == width) & (steps.batch == batch)]
    cell = g[g.recipe == ablation].source
    g = g[g.source.isin(cell)].set_index("recipe")
    if ablation not in g.index or default not in g.index:
        return None
    a, d = g.loc[ablation], g.loc[default]
    return float(a.value - d.value), float(np.hypot(a.spread or 0.0, d.spread or 0.0) / 1.35)


def targets_table(steps: pd.DataFrame, gemm: pd.DataFrame, targets: dict[int, float],
                  batch: int) -> pd.DataFrame:
    """Per (native hardware, target width): this repository's best FP8 recipe (defaults and
    lever variants) against the target, flax's peer and the GEMM ceiling."""
    rows = []
    nat = native(steps)
    nat = nat[nat.main & (nat.batch == batch)] if len(nat) else nat
    for hw, g in (nat.groupby("hardware") if len(nat) else []):
        for w, target in sorted(targets.items()):
            d = g[(g.width == w) & g.kind.isin(["ours", "ablation"])]
            peer = g[(g.width == w) & (g.recipe == "flax-fp8")].speedup
            best = d.loc[d.speedup.idxmax()] if len(d) else None
            rows.append({"hardware": hw, "width": w, "target": target,
                         "best recipe": None if best is None else best.recipe,
                         "speedup": np.nan if best is None else float(best.speedup),
                         "flax peer": float(peer.iloc[0]) if len(peer) else np.nan,
                         "GEMM ceiling": gemm_ceiling(gemm, hw, batch, w),
                         "met": None if best is None else bool(best.speedup >= target)})
    return pd.DataFrame(rows, columns=["hardware", "width", "target", "best recipe", "speedup",
                                       "flax peer", "GEMM ceiling", "met"])


def crossover(steps: pd.DataFrame, batch: int) -> pd.DataFrame:
    """Per native hardware: the narrowest width at which the best FP8 recipe of ours beats
    BF16, and at how many widths it beats flax's peer (and by how much at the widest)."""
    rows = []
    nat = native(steps)
    nat = nat[nat.main & (nat.batch == batch)] if len(nat) else nat
    for hw, g in (nat.groupby("hardware") if len(nat) else []):
        best = (g[g.kind.isin(["ours", "ablation"])].sort_values("speedup").groupby("width")
                .tail(1).set_index("width").sort_index())
        peer = g[g.recipe == "flax-fp8"].set_index("width").speedup
        pays = best[best.speedup > 1.0]
        both = best.index.intersection(peer.index)
        widest = max(both) if len(both) else None
        rows.append({"hardware": hw,
                     "FP8 pays from width": int(pays.index.min()) if len(pays) else None,
                     "widths beating the peer": f"{sum(best.speedup[w] > peer[w] for w in both)}"
                                                f"/{len(both)}",
                     "vs peer at the widest": (best.speedup[widest] / peer[widest] - 1
                                               if widest else np.nan),
                     "widest": widest})
    return pd.DataFrame(rows)


_TEMP_VALUE = re.compile(r"value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\): (\S+)")
_RANGE = re.compile(r"^\s+(\S+):(\d+)-(\d+)$", re.M)
_STEP = re.compile(r"^\s+(\d+):(\S+)$", re.M)


def temp_timeline(assignment: str, live_range: str):
    """What the temporary allocation holds over time, from XLA's ``*buffer-assignment.txt``
    and ``*live-range.txt`` texts of one module.

    Returns ``(extent, peak, at, name, live)``: the allocation's extent (the highest offset
    + size of its values: what ``memory_analysis`` counts as temporaries), the largest sum of
    the sizes of its values live at one instruction, that instruction's index and name, and the
    values live there as ``(name, offset, size, shape)`` by offset. ``extent - peak`` is what
    the packing of the values into the allocation costs beyond the live bytes."""
    block = assignment[assignment.index("preallocated-temp"):]
    end = re.search(r"^allocation \d+:", block, re.M)
    block = block[:end.start()] if end else block
    # a value without a tuple index is "name{}" in the live ranges
    values = [(n if "{" in n else n + "{}", int(o), int(s), shape)
              for n, s, o, shape in _TEMP_VALUE.findall(block)]
    ranges = {n: (int(a), int(b)) for n, a, b in _RANGE.findall(live_range)}
    steps = {int(i): n for i, n in _STEP.findall(live_range)}

    def alive(name, t):
        a, b = ranges.get(name, (0, -1))
        return a <= t <= b

    live = [sum(s for n, _, s, _ in values if alive(n, t)) for t in range(max(steps) + 1)]
    at = max(range(len(live)), key=live.__getitem__)
    there = sorted((v for v in values if alive(v[0], at)), key=lambda v: v[1])
    extent = max((o + s for _, o, s, _ in values), default=0)
    return extent, live[at], at, steps.get(at, "?"), there
