"""Claims A5-A8 and A10: FP8 RL quality and reproducibility; C2: INT8 RL quality on a TPU
(notebook 04).

The statistics are probabilities of improvement ``P(X > Y)`` with 95% intervals [lo, hi]
(``repro.analysis.stats.probability_of_improvement``). A *difference* claim asks whether X is
better than Y (lo > 0.5). A *parity* claim ("quality is kept", A5, A6, A10) asks whether X is
not worse than Y by more than the claim's equivalence margin [low, high] (``margin`` in
``repro/data/claims.yaml``, fixed in the claim's definition): **kept** if lo >= low (the
interval inside the margin: equivalent; reaching above it: X may be better, which keeps quality
too), **lost** if hi < low, and **inconclusive** when the interval straddles low: too wide to
tell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import pandas as pd

from repro.verdict import UNSURE, Verdict, margin, parity, poi_row, poi_text
from repro.verdict import rule as rule_of
from repro.catalogue import get as experiment

QUALITY_SOURCE = experiment("rl_quality").source("final_return", "random_return",
                                                 "same_seed_identical")
FP8_PREFIX = "fp8"  # variants whose GEMMs run in FP8


@dataclass(frozen=True)
class QualityEvidence:
    """What the quality statistics rest on: the hardware, the profile of its records
    (``full`` is evidence, ``smoke`` a plumbing check), the environments used, the seeds per
    (env, variant) and the number of environments the full study plans."""

    hardware: str
    profile: str
    envs: tuple[str, ...]
    n_seeds: int
    planned_envs: int


def _compare(poi: pd.DataFrame, x: str, y: str) -> tuple[str | None, str]:
    """X better / worse / same as Y from P(X > Y) and its 95% interval [lo, hi]."""
    r = poi_row(poi, x, y)
    if r is None:
        return None, poi_text(r, x, y)
    s = "better" if r.lo > 0.5 else "worse" if r.hi < 0.5 else "same"
    return s, poi_text(r, x, y)


def _not_worse(poi, x, y) -> bool | None:
    s, _ = _compare(poi, x, y)
    return None if s is None else s != "worse"


def _better(poi, x, y) -> bool | None:
    s, _ = _compare(poi, x, y)
    return None if s is None else s == "better"


def _combine(parts: Sequence[bool | str | None]) -> str:
    """A claim made of parts: reproduced if all hold; partly if some hold and some fail (or
    some are not measured); contradicted if those decided all fail; inconclusive if none
    fails but some cannot be decided; not yet measured if none was measured."""
    known = [p for p in parts if p is not None]
    if not known:
        return "not yet measured"
    yes, no = sum(p is True for p in known), sum(p is False for p in known)
    if yes and no:
        return "partly"
    if no:
        return "contradicted"
    if yes < len(known):
        return "inconclusive"
    return "reproduced" if len(known) == len(parts) else "partly"


def _numbers(poi: pd.DataFrame, *pairs: tuple[str, str]) -> dict:
    """``{"X_vs_Y": {"p", "lo", "hi"}}`` of the comparisons that were run."""
    out = {}
    for x, y in pairs:
        r = poi_row(poi, x, y)
        if r is not None:
            out[f"{x}_vs_{y}"] = {"p": r.p, "lo": r.lo, "hi": r.hi}
    return out


def _quality(claim: str, v: str, parts: list[str], ev: QualityEvidence,
             numbers: dict | None = None, rule: Mapping | None = None,
             decides: str = "") -> Verdict:
    """Smoke records never decide; fewer environments than the rule's ``min_envs`` cap at
    partly (that clause then decides, else ``decides``)."""
    min_envs = rule_of(claim, rule)["min_envs"]
    if ev.profile != "full" and v != "not yet measured":
        parts = [f"smoke only ({v} on {ev.n_seeds} seeds, {', '.join(ev.envs)})"] + parts
        v, decides = "not yet measured", ""
    elif v == "reproduced" and len(ev.envs) < min_envs:
        v = "partly"
        parts = [(f"reproduced on {len(ev.envs)} of {ev.planned_envs} planned environments "
                  f"(< {min_envs}: capped at partly)")] + parts
        decides = ""
    note = (f"notebook 04_rl_quality; {ev.profile} profile; IQM/POI over "
            f"{', '.join(ev.envs)}")
    return Verdict(claim, v, "; ".join(parts), ev.hardware, QUALITY_SOURCE, note,
                   numbers=numbers or {}, decides=decides)


def a5(poi: pd.DataFrame, ev: QualityEvidence, bounds: Sequence[float] | None = None,
       rule: Mapping | None = None) -> Verdict:
    """A5 (its ``rule``): scaled FP8 (fp8-delayed) keeps the reference's (FP32's) quality
    within the margin AND is better than the unscaled FP8 it ``beats`` (fp8-noscale); the
    recipes ``shown`` against it too, not judged."""
    r = rule_of("A5", rule)
    x, ref, worse = r["recipes"][0], r["reference"], r["beats"]
    kept, text = parity(poi, x, ref, bounds or margin("A5"))
    v = _combine([kept, _better(poi, x, worse)])
    shown = [(s, worse) for s in r.get("shown", [])]
    return _quality("A5", v, [text, _compare(poi, x, worse)[1]]
                    + [_compare(poi, a, b)[1] for a, b in shown], ev,
                    _numbers(poi, (x, ref), (x, worse), *shown), r)


def a6(poi: pd.DataFrame, ev: QualityEvidence, bounds: Sequence[float] | None = None,
       rule: Mapping | None = None) -> Verdict:
    """A6 (its ``rule``): FP8 compute with FP32 master weights (fp8-delayed) keeps the
    reference's (FP32's) quality within the margin."""
    r = rule_of("A6", rule)
    x, ref = r["recipes"][0], r["reference"]
    kept, text = parity(poi, x, ref, bounds or margin("A6"))
    return _quality("A6", _combine([kept]), [text], ev, _numbers(poi, (x, ref)), r)


def a7(poi: pd.DataFrame, ev: QualityEvidence, rule: Mapping | None = None) -> Verdict:
    """A7 (its ``rule``): the Kahan update beats the naive one in either of its ``pairs``
    (FP8- or BF16-stored weights); reproduced if fp8-e2e is then also not worse than the
    reference (FP32), partly if it is."""
    r = rule_of("A7", rule)
    x, ref, pairs = r["recipes"][0], r["reference"], [tuple(p) for p in r["pairs"]]
    kahan = [_better(poi, a, b) for a, b in pairs]
    helps = None if all(k is None for k in kahan) else any(bool(k) for k in kahan)
    v = ("not yet measured" if helps is None else "contradicted" if not helps else
         "reproduced" if _not_worse(poi, x, ref) else "partly")
    return _quality("A7", v, [_compare(poi, a, b)[1] for a, b in pairs + [(x, ref)]], ev,
                    _numbers(poi, *pairs, (x, ref)), r,
                    decides=_compare(poi, x, ref)[1] if v == "partly" else "")


def _prevents(poi, x: str, ablation: str, what: str, diverged: Mapping[str, int]):
    """Does ``x`` (fp8-e2e) beat its ablation without ``what``? Undecidable (UNSURE) when no
    seed diverged in either arm: there was no divergence for the clipping to prevent."""
    state, text = _better(poi, x, ablation), _compare(poi, x, ablation)[1]
    if state is not None and not (diverged.get(x, 0) or diverged.get(ablation, 0)):
        return UNSURE, (f"{text}, but no seed diverged in {x} or {ablation}: no divergence "
                        f"for {what} to prevent")
    return state, text


def a8(poi: pd.DataFrame, ev: QualityEvidence, diverged: Mapping[str, int],
       rule: Mapping | None = None) -> Verdict:
    """A8: removing gradient clipping and removing weight clipping both make fp8-e2e worse.
    ``diverged``: diverged seeds per variant; without any divergence in either arm of a
    comparison, that part is inconclusive (clipping had nothing to prevent)."""
    r = rule_of("A8", rule)
    x, ablations = r["recipes"][0], r["ablations"]
    parts = [_prevents(poi, x, ab, what, diverged) for what, ab in ablations.items()]
    div = ", ".join(f"{k} {int(n)}" for k, n in diverged.items() if n) or "none"
    numbers = _numbers(poi, *[(x, ab) for ab in ablations.values()])
    numbers["diverged_seeds"] = {k: int(n) for k, n in diverged.items()}
    return _quality("A8", _combine([p[0] for p in parts]),
                    [p[1] for p in parts] + [f"diverged seeds: {div}"], ev, numbers, r)


def _determinism(same_seed: bool | None, repeats: pd.DataFrame) -> tuple[bool | None, str]:
    """Bit-identical returns of the same seed in one process and, for the cells recorded
    twice, across processes; the text names which variants were checked across processes."""
    if len(repeats):
        same = bool(repeats.identical.all())
        same_seed = same if same_seed is None else bool(same_seed and same)
    text = f"same seed bit-identical: {same_seed}"
    if len(repeats):
        variants = sorted(repeats.variant.unique())
        text += (f" (in one process, and across processes for {len(repeats)} cells x "
                 f"{int(repeats.seeds.min())} seeds: {', '.join(variants)})")
        if not any(v.startswith(FP8_PREFIX) for v in variants):
            text += "; FP8 not checked across processes"
    return same_seed, text


def a10(poi: pd.DataFrame, ev: QualityEvidence, same_seed: bool | None,
        repeats: pd.DataFrame, bounds: Sequence[float] | None = None,
        rule: Mapping | None = None) -> Verdict:
    """A10: fp8-delayed keeps the quality of FP32 and of BF16 within the margin, AND the same
    seed gives bit-identical returns: within a process (``same_seed``, None if not measured)
    and across processes (``repro.analysis.rl.repeat_identical`` rows of this hardware)."""
    bounds = bounds or margin("A10")
    r = rule_of("A10", rule)
    x = r["recipes"][0]
    kept = [parity(poi, x, ref, bounds) for ref in r["references"]]
    states = [k for k, _ in kept]
    quality = (None if None in states else True if all(k is True for k in states)
               else False if False in states else UNSURE)
    same, text = _determinism(same_seed, repeats)
    numbers = _numbers(poi, *[(x, ref) for ref in r["references"]])
    if same is not None:
        numbers["same_seed_identical"] = int(bool(same))
    return _quality("A10", _combine([quality, same]), [t for _, t in kept] + [text], ev,
                    numbers, r)


def c2(poi: pd.DataFrame, ev: QualityEvidence, bounds: Sequence[float] | None = None,
       rule: Mapping | None = None) -> Verdict:
    """C2 (its ``rule``): INT8 training keeps the reference's (FP32's) quality within the
    margin, on the rule's hardware: ``poi`` and ``ev`` of the records of that hardware (both
    recipes recorded there). Evidence of another hardware is not this claim's ("not yet
    measured"); fewer seeds than ``min_seeds`` cap a kept verdict at partly, as fewer
    environments than ``min_envs`` do."""
    r = rule_of("C2", rule)
    x, ref, hw = r["recipes"][0], r["reference"], r["cells"]["hardware"]
    if ev.hardware != hw:
        return Verdict("C2", "not yet measured",
                       f"no {x} and {ref} quality records on {hw} (evidence given: "
                       f"{ev.hardware})", hw, QUALITY_SOURCE, "notebook 04_rl_quality")
    kept, text = parity(poi, x, ref, bounds or margin("C2"))
    v = _combine([kept])
    parts = [text]
    if v == "reproduced" and ev.n_seeds < r["min_seeds"]:
        v = "partly"
        parts.insert(0, f"{ev.n_seeds} seeds (< {r['min_seeds']}: capped at partly)")
    return _quality("C2", v, parts, ev, _numbers(poi, (x, ref)), r)
