"""Claim A12: GRPO of a language model with FP8 rollouts and FP8 training (notebook 12).

Everything the rule decides by is A12's ``rule`` and ``margin`` in ``repro/data/claims.yaml``:
the judged arm (``recipes``), its ``reference``, the arms shown beside it (``shown``), the
seeds needed (``min_seeds``), BF16's minimum gain over the base model (``rl_works``) and the
speed ``target``. Per hardware, on the seeds where both the judged arm and the reference were
recorded (paired: the same base model and problems), the held-out accuracy gap
``judged - reference`` with its 95% t-interval [lo, hi] against the margin [low, high]:
accuracy **kept** if lo >= low, **lost** if hi < low, undecided if the interval straddles low.
No verdict on precision ("not yet measured") while fewer than ``min_seeds`` paired seeds
exist or while the reference's mean gain over the base model is below ``rl_works`` (GRPO did
not work, so there is no accuracy to keep). Then: **reproduced** kept and the FP8/BF16 speedup
of the whole RL step >= ``target``; **partly** kept without that speedup (or with it
unmeasured); **inconclusive** undecided; **contradicted** lost.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from repro.analysis.stats import t_interval
from repro.verdict import Verdict, margin
from repro.verdict import rule as rule_of
from repro.catalogue import get as experiment

CLAIM = "A12"
SOURCE = experiment("grpo").source("heldout_accuracy", "base_accuracy per arm and seed")
COLUMNS = ["hardware", "arm", "seed", "base", "final", "emulated"]


def _paired(table: pd.DataFrame, arm: str, reference: str) -> pd.DataFrame:
    """Per seed with both arms: ``final`` of each, the reference's ``base`` and the gap."""
    a = table[table.arm == arm].set_index("seed")
    b = table[table.arm == reference].set_index("seed")
    seeds = sorted(set(a.index) & set(b.index))
    return pd.DataFrame({"seed": seeds, "final": [float(a.final[s]) for s in seeds],
                         "ref_final": [float(b.final[s]) for s in seeds],
                         "ref_base": [float(b.base[s]) for s in seeds]}).assign(
        gap=lambda d: d.final - d.ref_final)


def _interval(values) -> tuple[float, float, float]:
    return t_interval(list(values))


def _pts(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.1f} pts"


def a12(table: pd.DataFrame, speed: float | None = None, rule: Mapping[str, Any] | None = None,
        speed_where: str = "") -> Verdict:
    """A12 from ``repro.experiments.grpo.tables.accuracy_table`` (one row per hardware, arm and
    seed: ``base`` and ``final`` held-out accuracy, ``emulated``) and ``speed``, the FP8/BF16
    speedup of the whole RL step (None: not measured; ``speed_where``: where it was timed, or
    why there is none: ``repro.experiments.grpo.tables.rl_step_speedup``)."""
    r = rule_of(CLAIM, rule)
    arm, reference = r["recipes"][0], r["reference"]
    need, works, target = int(r["min_seeds"]), float(r["rl_works"]), float(r["speed"]["target"])
    low, high = margin(CLAIM)
    if table is None or not len(table):
        return Verdict(CLAIM, "not yet measured", "no full-profile GRPO records", "", SOURCE)
    best = None
    for hw, g in table.groupby("hardware"):
        pairs = _paired(g, arm, reference)
        if best is None or len(pairs) > len(best[1]):
            best = (str(hw), pairs, g)
    hw, pairs, g = best
    emulated = bool(g[g.arm.isin([arm, reference])].emulated.any())
    if len(pairs) < need:
        return Verdict(CLAIM, "not yet measured",
                       f"{len(pairs)} paired seed(s) of {arm} and {reference} on {hw}, "
                       f"{need} needed", hw, SOURCE, emulated=emulated,
                       numbers={"n_seeds": len(pairs)})
    gain = float((pairs.ref_final - pairs.ref_base).mean())
    numbers: dict[str, Any] = {"n_seeds": len(pairs), "bf16_gain": gain,
                               "bf16_final": float(pairs.ref_final.mean())}
    if not gain >= works:
        return Verdict(CLAIM, "not yet measured",
                       f"{reference} GRPO raised held-out accuracy by {_pts(gain)} over the "
                       f"base model ({len(pairs)} seeds on {hw}), below the registered "
                       f"{_pts(works)}: RL did not work, no verdict on precision", hw, SOURCE,
                       emulated=emulated, numbers=numbers)
    mean, lo, hi = _interval(pairs.gap)
    kept = lo >= low
    lost = hi < low
    fast = speed is not None and math.isfinite(speed) and speed >= target
    verdict = ("contradicted" if lost else "inconclusive" if not kept
               else "reproduced" if fast else "partly")
    key = (f"{arm} - {reference} held-out accuracy {_pts(mean)} (95% CI {_pts(lo)} .. "
           f"{_pts(hi)}, {len(pairs)} seeds) vs margin {_pts(low)}; {reference} gained "
           f"{_pts(gain)} over the base model")
    against = r["speed"].get("reported_against", {})
    key += ((f"; RL step speedup not measured ({speed_where})" if speed_where else
             "; RL step speedup not measured") if speed is None or not math.isfinite(speed)
            else f"; RL step {speed:.2f}x {reference} with FP8 linear layers (target "
            f"{target:.2f}x, the source's linear-layer gain"
            + (f"; its {against['with_fp8_kv_and_attention']:.2f}x also had FP8 attention and "
               "KV cache, not timed here" if "with_fp8_kv_and_attention" in against else "")
            + (f"; {speed_where}" if speed_where else "") + ")")
    shown = []
    for other in r.get("shown", []):
        p = _paired(g, other, reference)
        if len(p):
            m, lo_o, hi_o = _interval(p.gap)
            shown.append(f"{other} {_pts(m)} [{_pts(lo_o)}, {_pts(hi_o)}] over {len(p)} seeds "
                         "(not judged)")
            numbers[f"gap_{other}"] = m
    numbers.update(gap=mean, gap_lo=lo, gap_hi=hi, margin_low=low, margin_high=high)
    if speed is not None:
        numbers["speedup"] = speed
    return Verdict(CLAIM, verdict, key, hw, SOURCE, "; ".join(shown), emulated=emulated,
                   numbers=numbers)
