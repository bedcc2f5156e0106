"""Claims A1-A4 and A9: FP8 RL speed, memory and storage; C1: INT8 RL speed on a TPU (notebook 03)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from repro.analysis import rl as rl_analysis
from repro.verdict import Verdict, _hw, _hw_judged, recipes
from repro.verdict import rule as rule_of
from repro.catalogue import get as experiment

RL_SPEED_SOURCE = experiment("rl_throughput").source("env_steps_per_s", "update_time_ms")
RL_MEMORY_SOURCE = experiment("rl_throughput").source("fp8_stores", "update_memory_bytes")
RL_NOTE = "notebook 03_rl_throughput"
A4_CAVEAT = ("memory is XLA's compile-time estimate of the update (memory_analysis), not a "
             "measured device peak")
ORDER = ("reproduced", "partly", "contradicted")


def _native(sp: pd.DataFrame, cells: Mapping[str, Any]) -> pd.DataFrame:
    """The ratios of the cells a rule judges (``cells`` of its ``rule``): its baseline, its
    network where it names one, native only where it says ``native``, two cells of one GPU
    call (``same_commit``) where it says ``one_call``. Ratios of paired cells (``timing``
    "paired", :func:`repro.analysis.rl.paired_speedups`) count only where the rule says
    ``timing: paired-first``, and then alone on each hardware that has them."""
    if not len(sp):
        return sp
    sp = rl_analysis.paired_first(sp) if cells.get("timing") == "paired-first" else \
        rl_analysis.separate(sp)
    keep = sp.baseline == cells["baseline"]
    if cells.get("native"):
        keep &= ~sp.emulated
    if cells.get("one_call"):
        keep &= sp.same_commit
    if "network" in cells:
        keep &= sp.network == cells["network"]
    return sp[keep]


def _recipes_of(sp: pd.DataFrame, r: Mapping[str, Any]) -> pd.DataFrame:
    have = sorted(set(sp.recipe)) if len(sp) and "recipe" in sp else []
    return sp[sp.recipe.isin(recipes(r, have))] if len(sp) and "recipe" in sp else sp


def a1(stores: pd.DataFrame, rule: Mapping[str, Any] | None = None) -> Verdict:
    """A1 from ``repro.analysis.rl.fp8_stores``: how many of the four A1 stores (parameters,
    GEMM activations, GEMM gradients, the optimizer update) the judged variant keeps in FP8
    (A1's ``rule``: its variant, or the most-FP8 one): ``reproduced`` at that many, ``partly``
    from ``partly`` on, contradicted below."""
    r = rule_of("A1", rule)
    if len(stores):
        stores = stores[stores["variant"].isin(recipes(r, list(stores["variant"])))]
    if not len(stores):
        return Verdict("A1", "not yet measured", "no stores record", "none", RL_MEMORY_SOURCE,
                       RL_NOTE)
    best = stores.loc[stores["stores"].idxmax()]
    n = int(best["stores"])
    v = "reproduced" if n >= r["reproduced"] else "partly" if n >= r["partly"] else \
        "contradicted"
    key = (f"at most {n} of 4 A1 stores in FP8 (variant {best['variant']}); optimizer "
           "moments and update arithmetic stay FP32; FP8 weight storage held in a BF16 container")
    return Verdict("A1", v, key, str(best["hardware"]), RL_MEMORY_SOURCE, RL_NOTE,
                   numbers={"fp8_stores": n})


def a2(sp: pd.DataFrame, rule: Mapping[str, Any] | None = None) -> Verdict:
    """A2 from ``repro.analysis.rl.speedups`` (FP8 recipes over FP16, MLP; A2's ``rule``):
    per hardware, reproduced if the whole PPO loop reaches ``target`` somewhere ("up to"),
    partly if only the update alone does or the loop is >= ``faster``, contradicted
    otherwise. "Up to" is met by any hardware: the best verdict of the hardware measured is
    the claim's. Where the rule takes the best of several recipes, the key number also
    names its ``default`` recipe's ratio."""
    r = rule_of("A2", rule)
    target, faster = r["target"], r["faster"]
    real = _recipes_of(_native(sp, r["cells"]), r)
    if not len(real):
        return Verdict("A2", "not yet measured",
                       "no FP8/FP16 ratio of native records made in one GPU call (emulated, "
                       "stale and unpaired cells do not count)", _hw(sp),
                       RL_SPEED_SOURCE, RL_NOTE)
    lines, verdicts, numbers = [], [], {}
    for h, g in real.groupby("hardware"):
        nmax = g.num_envs.max()
        best = g[g.num_envs == nmax].groupby("width")[["e2e", "update"]].max()
        e2e_max, upd_max = g.e2e.max(), g["update"].max()
        widths_ok = best.index[best.e2e >= target].tolist()
        if e2e_max >= target:
            verdicts.append("reproduced")
        elif upd_max >= target or e2e_max >= faster:
            verdicts.append("partly")
        else:
            verdicts.append("contradicted")
        top = g.loc[g.e2e.idxmax()]
        numbers[h] = {"fp8_fp16_e2e_max": e2e_max, "fp8_fp16_update_max": upd_max}
        paired = ("timing" in g and top.get("timing") == "paired")
        line = (f"{h}: FP8/FP16 whole loop up to {e2e_max:.2f}x (width {int(top.width)},"
                f" {int(top.num_envs)} envs"
                + (f"; paired, median of {int(top.rounds)} rounds, range {top.e2e_lo:.2f}-"
                   f"{top.e2e_hi:.2f}x" if paired else "")
                + f"), update alone up to {upd_max:.2f}x; "
                f">= {target}x end to end at widths {widths_ok or 'none'}")
        d = g[g.recipe == r["default"]] if r.get("combine") == "best-of" else g.iloc[:0]
        if len(d):
            line += f"; default {r['default']} up to {d.e2e.max():.2f}x"
            numbers[h]["default_e2e_max"] = d.e2e.max()
        lines.append(line)
    return Verdict("A2", min(verdicts, key=ORDER.index), "; ".join(lines),
                   _hw_judged(real, sp),
                   RL_SPEED_SOURCE, RL_NOTE, numbers=numbers)


def a3(projection: pd.DataFrame, bandwidth_ratio: float, fp16_ratio: float,
       fp8_ceiling: float, rule: Mapping[str, Any] | None = None) -> Verdict:
    """A3 is always a projection (no A100 measured): the measured FP8/FP16 ratio times the
    H100/A100 FP16 datasheet ratios (``repro.analysis.rl.a3_projection``: columns ``lo``,
    ``hi``), or the datasheet bounds alone without measured ratios; the seed's figure is
    A3's ``target``."""
    target = rule_of("A3", rule)["target"]
    if len(projection):
        b = projection.loc[projection.hi.idxmax()]
        key = (f"projected {b.lo:.1f}-{b.hi:.1f}x at width {int(b.width)} ({b.hardware} "
               f"FP8/FP16 {b.e2e:.2f}x x H100/A100 FP16 {bandwidth_ratio:.2f}-"
               f"{fp16_ratio:.2f}x); seed claims {target}x")
        hw = _hw(projection) + " -> a100-sxm (datasheet)"
        numbers = {"projected_lo": b.lo, "projected_hi": b.hi, "measured_fp8_fp16": b.e2e}
    else:
        key = (f"datasheet bounds only: {bandwidth_ratio:.2f}x (bandwidth) to "
               f"{fp8_ceiling:.2f}x (H100 FP8 peak / A100 FP16 peak); seed claims {target}x")
        hw = "datasheets h100-sxm, a100-sxm"
        numbers = {"projected_lo": bandwidth_ratio, "projected_hi": fp8_ceiling}
    return Verdict("A3", "projected", key, hw,
                   "repro/data/hardware.yaml + results/*/rl_throughput",
                   "PROJECTION from datasheet ratios; no A100 measured", numbers=numbers)


def a4(memory: pd.DataFrame, rule: Mapping[str, Any] | None = None) -> Verdict:
    """A4 from the throughput table's ``update_memory_bytes`` (A4's ``rule``): each FP8
    recipe of the rule over the first of its 16-bit ``baseline`` recorded (FP16 as the claim
    has it, else BF16: the same bytes) at the widest MLP and most envs of each hardware
    (native records only). One recipe decides (``combine: one``; the recipes ``shown`` are
    named beside it, not judged) or the leaner of several (``combine: leanest``): reproduced
    <= ``reproduced``, partly < ``partly_below``, contradicted otherwise."""
    r = rule_of("A4", rule)
    judged, shown = recipes(r), [x for x in r.get("shown", []) if x not in recipes(r)]
    rows = []  # (hardware, baseline, {recipe: ratio}, {recipe: emulated}, width)
    mlp = memory[memory.network == r["cells"]["network"]] if len(memory) else memory
    for h, g in (mlp.groupby("hardware") if len(mlp) else []):
        top = g[g.width == g.width.max()]
        top = top[top.num_envs == top.num_envs.max()].set_index("recipe")
        base = next((b for b in r["baseline"] if b in top.index), None)
        fp8 = [x for x in judged + shown if x in top.index]
        if base is None or not any(x in top.index for x in judged):
            continue
        mem = top["update_memory_bytes"]
        rows.append((h, base, {x: mem[x] / mem[base] for x in fp8},
                     {x: bool(top.loc[x, "emulated"]) for x in fp8}, int(g.width.max())))
    real = [(h, b, {x: y for x, y in ratios.items() if not emu[x]}, w)
            for h, b, ratios, emu, w in rows if not all(emu[x] for x in judged if x in emu)]
    if not real:
        note = ""
        if rows:
            h, b, ratios, _, _ = rows[0]
            note = f" (emulated: FP8/{b.upper()} = {min(ratios.values()):.2f} on {h})"
        return Verdict("A4", "not yet measured", "no native-FP8 memory record" + note,
                       ", ".join(x[0] for x in rows) or "none", RL_MEMORY_SOURCE, RL_NOTE)

    def decider(ratios):
        mine = {x: y for x, y in ratios.items() if x in judged}
        return min(mine, key=mine.get) if r["combine"] == "leanest" else next(iter(mine))

    def key(h, b, ratios, w):
        best = decider(ratios)
        text = f"{h}: update memory FP8/{b.upper()} = {ratios[best]:.2f} at width {w}"
        others = [f"{x} {y:.2f}" + ("" if x in judged else " not judged")
                  for x, y in ratios.items() if x != best]
        return text + (f" ({best}; {', '.join(others)})" if others else "")

    ratio = min(ratios[decider(ratios)] for _, _, ratios, _ in real)
    v = ("reproduced" if ratio <= r["reproduced"] else "partly" if ratio < r["partly_below"]
         else "contradicted")
    return Verdict("A4", v, "; ".join(key(*x) for x in real), ", ".join(x[0] for x in real),
                   RL_MEMORY_SOURCE, RL_NOTE,
                   numbers={h: {f"update_memory_{x}_{b}": round(float(y), 4)
                                for x, y in ratios.items()} for h, b, ratios, _ in real},
                   caveat=A4_CAVEAT)


def a9(sp: pd.DataFrame, rule: Mapping[str, Any] | None = None) -> Verdict:
    """A9's speed side from ``speedups`` over BF16 (A9's ``rule``): the best whole-loop
    FP8/BF16 ratio of the rule's recipes over the widths of the MLPs and of the CNNs (native,
    one call); reproduced if both are >= ``faster``, partly if one is (or if the other was not
    measured natively: the key number says so)."""
    r = rule_of("A9", rule)
    mlp, cnn = r["cells"]["networks"]
    real = _recipes_of(_native(sp, r["cells"]), r)
    if not len(real):
        return Verdict("A9", "not yet measured", "no native-FP8 records", _hw(sp),
                       "results/*/rl_throughput", RL_NOTE)
    best = real.groupby(real.network.map(lambda n: mlp if n == mlp else cnn)).e2e.max()
    ok = {k: v >= r["faster"] for k, v in best.items()}
    v = ("reproduced" if len(ok) == 2 and all(ok.values()) else
         "partly" if any(ok.values()) else "contradicted")
    clauses = {k: f"best FP8/BF16 whole loop, {k}: {x:.2f}x" for k, x in best.items()}
    key = "; ".join(clauses.values())
    # what decides: a network that is not faster, else the one not measured
    decides = next((clauses[k] for k, fast in ok.items() if not fast), "")
    if cnn not in best:
        missing = ("CNN speed not measured: every FP8 CNN cell is emulated (the FP8 "
                   "convolution's backward runs through BF16)")
        key += "; " + missing
        decides = decides or missing
    return Verdict("A9", v, key + " (speed; quality in notebook 04)", _hw_judged(real, sp),
                   "results/*/rl_throughput", RL_NOTE,
                   numbers={f"{k}_fp8_bf16_e2e_max": x for k, x in best.items()},
                   decides=decides if v != "reproduced" else "")


def c1(sp: pd.DataFrame, rule: Mapping[str, Any] | None = None) -> Verdict:
    """C1 from the paired speedups of INT8 over BF16 (``repro.analysis.rl.paired_speedups``
    with C1's recipes and baseline; C1's ``rule``): on the rule's hardware, network, width and
    most envs, the median of the per-round BF16/INT8 update-time ratios of a native paired
    cell (of several paired runs there, the median of theirs, with the range of all their
    rounds); reproduced at ``target`` or above, partly at ``faster`` or above (INT8 faster,
    short of the target), contradicted below. Emulated rows (INT8 not run on the matrix
    units) and rows of other hardware are not judged; the whole loop's ratio is shown."""
    r = rule_of("C1", rule)
    c = r["cells"]
    keep = sp.iloc[:0] if not len(sp) else sp[
        (sp.hardware == c["hardware"]) & (sp.network == c["network"])
        & (sp.width == c["width"]) & (sp.baseline == c["baseline"])
        & sp.recipe.isin(recipes(r)) & (sp.get("timing", "") == c["timing"])]
    real = keep[~keep.emulated.astype(bool)] if c.get("native") and len(keep) else keep
    if not len(real):
        why = ("emulated there (no INT8 on its matrix units)" if len(keep) else
               "no paired cell of the rule's recipes")
        return Verdict("C1", "not yet measured",
                       f"no native INT8/{c['baseline'].upper()} paired ratio at width "
                       f"{c['width']} on {c['hardware']} ({why})", _hw(sp),
                       RL_SPEED_SOURCE, RL_NOTE)
    runs = real[real.num_envs == real.num_envs.max()]  # most envs
    top = runs.iloc[0]
    upd, e2e = float(runs["update"].median()), float(runs["e2e"].median())
    lo, hi = float(runs.update_lo.min()), float(runs.update_hi.max())
    v = "reproduced" if upd >= r["target"] else "partly" if upd >= r["faster"] else \
        "contradicted"
    n = f"{len(runs)} paired runs, " if len(runs) > 1 else ""
    key = (f"{top.hardware}: {top.recipe.upper()}/{c['baseline'].upper()} PPO update "
           f"{upd:.2f}x (range {lo:.2f}-{hi:.2f} over {n}{int(runs.rounds.sum())} rounds), "
           f"whole loop {e2e:.2f}x (range {runs.e2e_lo.min():.2f}-{runs.e2e_hi.max():.2f}) at "
           f"width {int(top.width)}, {int(top.num_envs)} envs; target {r['target']}x")
    return Verdict("C1", v, key, str(top.hardware), RL_SPEED_SOURCE, RL_NOTE,
                   numbers={str(top.hardware): {"update_ratio": upd, "update_lo": lo,
                                                "update_hi": hi, "e2e_ratio": e2e}})
