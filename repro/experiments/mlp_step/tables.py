"""The MLP training-step benchmark (``mlp_step`` records): speedups, GEMM ceilings, levers.

Every ``mlp_step`` cell times all its recipes interleaved in one process, so a speedup is a
ratio of two timings of one run. ``step_table`` adds the BF16 time of the same cell and the
speedup, and says which FP8 rows ran no FP8 GEMM at all (``no_fp8``: a BF16 timing, never an
FP8 speedup); ``gemm_ceiling`` reads the FP8/16-bit rate ratio of the matching GEMM from the ``gemm``
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


NO_FP8 = "no FP8 GEMM: ran BF16"  # the label of an FP8 row whose program had no FP8 GEMM
EMULATED = "emulated FP8: not a speed"  # the label of an FP8 row the hardware emulated


def kind(recipe: str) -> str:
    """``baseline`` (no FP8 GEMM), ``peer`` (another library's FP8), ``ours`` (a default FP8
    recipe), ``policy`` (a per-layer policy over a default: FP8 only in layers of at least
    ``fp8_min_dim``, ``fp8-auto``) or ``ablation`` (a lever variant of a default)."""
    r = resolve(recipe)
    if r.backend != "repro":
        return "peer"
    if r.gemm != "fp8":
        return "baseline"
    if recipe in OURS:
        return "ours"
    return "policy" if r.fp8_min_dim > 0 else "ablation"


def ran_no_fp8(recipe: str, extra) -> bool:
    """Whether a record of an FP8 ``recipe`` ran no FP8 GEMM at all: its compiled program has
    no f8 value (``extra.fp8_lowering == "no-f8"``), or, in a record without the lowering, no
    cuBLASLt FP8 call (``extra.fp8_gemm_calls == 0``; XLA's Triton GEMMs with f8 operands,
    ``fused-f8-dot``, are FP8 GEMMs that this count misses). False for recipes that are not
    FP8 and for records that say neither."""
    if resolve(recipe).gemm != "fp8" or not isinstance(extra, dict):
        return False
    lowering = extra.get("fp8_lowering")
    if lowering is not None:
        return lowering == "no-f8"
    return extra.get("fp8_gemm_calls") == 0


def step_table(df: pd.DataFrame) -> pd.DataFrame:
    """``step_time_ms`` records with ``width``, ``batch``, ``kind``, ``bf16_ms`` (BF16 of the
    same cell) and ``speedup`` (BF16 time / this time), and ``lever_cell``: the row comes from
    a lever cell (``..._levers``) or a variant cell (``..._variants``), which times an ablation
    or a candidate variant beside BF16 and the defaults again. The defaults and BF16 of those
    cells serve :func:`lever_delta` only: ``main`` marks the rows that make one number per
    (hardware, width, recipe).

    ``no_fp8``: an FP8 recipe whose program ran no FP8 GEMM (:func:`ran_no_fp8`; a policy
    such as ``fp8-auto`` below its ``fp8_min_dim``): its speedup is BF16 against BF16, never
    an FP8 number, and ``label`` says so. ``emulated`` is the record's (a program without f8
    values reads as not emulated: ``repro.studies.lowering.recipe_emulated``): an FP8 row that
    ran emulated FP8 (the hardware lacks it) is no speed either, and ``label`` says that too
    (else it is the recipe)."""
    steps = df[df.metric == "step_time_ms"].copy() if len(df) else pd.DataFrame()
    if not len(steps):
        return pd.DataFrame(columns=["hardware", "width", "batch", "recipe", "value", "kind",
                                     "speedup", "main", "emulated", "no_fp8", "label"])
    steps["width"] = steps.size_width.astype(int)
    steps["batch"] = steps.size_batch.astype(int)
    steps["kind"] = steps.recipe.map(kind)
    base = steps[steps.recipe == "bf16"].set_index("source")
    steps["bf16_ms"] = steps.source.map(base.value)
    steps["speedup"] = steps.bf16_ms / steps.value
    steps["lever_cell"] = steps.source.astype(str).str.contains("_levers|_variants")
    steps["main"] = ~steps.lever_cell | ~steps.recipe.isin(["bf16", *OURS])
    steps["no_fp8"] = [ran_no_fp8(r, e) for r, e in zip(steps.recipe, steps["extra"])]
    emulated = steps.emulated.astype(bool) & (steps.kind != "baseline") & ~steps.no_fp8
    steps["label"] = steps.recipe.where(~steps.no_fp8, steps.recipe + f" ({NO_FP8})").where(
        ~emulated, steps.recipe + f" ({EMULATED})")
    return steps


def native(steps: pd.DataFrame) -> pd.DataFrame:
    """Rows of hardware where every FP8 recipe that ran an FP8 GEMM ran it natively (no
    emulated FP8 record; a row that ran no FP8 GEMM says nothing either way)."""
    if not len(steps):
        return steps
    fp8 = steps[(steps.kind != "baseline") & ~steps.no_fp8]
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


def _main(steps: pd.DataFrame, batch: int) -> pd.DataFrame:
    nat = native(steps)
    return nat[nat.main & (nat.batch == batch)] if len(nat) else nat


def targets_table(steps: pd.DataFrame, gemm: pd.DataFrame, targets: dict[int, float],
                  batch: int) -> pd.DataFrame:
    """Per (native hardware, target width): the step speedup of each default FP8 recipe
    (:data:`OURS`) against the target, ``met by`` the defaults that reach it, and beside them
    each per-layer policy (``fp8-auto``) with ``policy ran`` saying whether it ran FP8 there
    (where it ran no FP8 GEMM its number is left out: BF16 against BF16 is no FP8 speedup),
    flax's peer and the GEMM ceiling."""
    nat = _main(steps, batch)
    policies = sorted(set(nat[nat.kind == "policy"].recipe)) if len(nat) else []
    cols = ["hardware", "width", "target", *OURS, "met by", "met"]
    for p in policies:
        cols += [f"{p} (policy)", f"{p} ran"]
    cols += ["flax peer", "GEMM ceiling"]
    rows = []
    for hw, g in (nat.groupby("hardware") if len(nat) else []):
        for w, target in sorted(targets.items()):
            at = g[g.width == w].drop_duplicates("recipe").set_index("recipe")
            row = {"hardware": hw, "width": w, "target": target}
            fp8 = at[~at.no_fp8]
            for r in OURS:
                row[r] = float(fp8.speedup[r]) if r in fp8.index else np.nan
            have = [r for r in OURS if pd.notna(row[r])]
            met = [r for r in have if row[r] >= target]
            row["met by"] = ", ".join(met) if met else ("neither" if have else "not measured")
            row["met"] = bool(met) if have else None
            for p in policies:
                row[f"{p} (policy)"] = (float(at.speedup[p]) if p in at.index
                                        and not at.no_fp8[p] else np.nan)
                row[f"{p} ran"] = (None if p not in at.index else NO_FP8 if at.no_fp8[p]
                                   else "FP8")
            row["flax peer"] = (float(at.speedup["flax-fp8"]) if "flax-fp8" in at.index
                                else np.nan)
            row["GEMM ceiling"] = gemm_ceiling(gemm, hw, batch, w)
            rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def crossover(steps: pd.DataFrame, batch: int) -> pd.DataFrame:
    """Per native hardware and FP8 recipe of ours (the defaults, then the policies): the
    narrowest width from which it beats BF16 at every wider measured width, counting only
    widths where it ran an FP8 GEMM (a policy's BF16 layers are no FP8 speedup); at how many
    widths it beats flax's peer, and by how much at the widest."""
    rows = []
    nat = _main(steps, batch)
    for hw, g in (nat.groupby("hardware") if len(nat) else []):
        peer = g[g.recipe == "flax-fp8"].drop_duplicates("width").set_index("width").speedup
        policies = sorted(set(g[g.kind == "policy"].recipe))
        for recipe in [r for r in OURS if r in set(g.recipe)] + policies:
            d = g[(g.recipe == recipe) & ~g.no_fp8].drop_duplicates("width")
            s = d.set_index("width").speedup.sort_index()
            pays = None
            for w in s.index[::-1]:  # widest first: the crossover is where paying starts
                if s[w] <= 1.0:
                    break
                pays = int(w)
            both = s.index.intersection(peer.index)
            widest = max(both) if len(both) else None
            no_fp8 = sorted(int(w) for w in g[(g.recipe == recipe) & g.no_fp8].width)
            rows.append({"hardware": hw, "recipe": recipe,
                         "kind": "policy" if recipe in policies else "default",
                         "FP8 pays from width": pays,
                         "no FP8 GEMM at widths": ", ".join(map(str, no_fp8)),
                         "widths beating the peer": f"{sum(s[w] > peer[w] for w in both)}"
                                                    f"/{len(both)}",
                         "vs peer at the widest": (s[widest] / peer[widest] - 1
                                                   if widest else np.nan),
                         "widest": widest})
    return pd.DataFrame(rows, columns=["hardware", "recipe", "kind", "FP8 pays from width",
                                       "no FP8 GEMM at widths", "widths beating the peer",
                                       "vs peer at the widest", "widest"])


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
