"""Claims A5-A8 and A10: FP8 RL quality and reproducibility (notebook 04)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import pandas as pd

from repro.claims.verdicts._base import Verdict

QUALITY_SOURCE = "results/*/rl_quality (final_return, random_return, same_seed_identical)"
MIN_ENVS = 3  # fewer environments behind the statistics cap "reproduced" at "partly"


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
    r = poi[(poi.x == x) & (poi.y == y)] if len(poi) else poi
    if not len(r):
        return None, f"{x} vs {y}: not run"
    r = r.iloc[0]
    s = "better" if r.lo > 0.5 else "worse" if r.hi < 0.5 else "same"
    return s, f"P({x}>{y})={r.p:.2f} [{r.lo:.2f},{r.hi:.2f}]"


def _not_worse(poi, x, y) -> bool | None:
    s, _ = _compare(poi, x, y)
    return None if s is None else s != "worse"


def _better(poi, x, y) -> bool | None:
    s, _ = _compare(poi, x, y)
    return None if s is None else s == "better"


def _combine(parts: Sequence[bool | None]) -> str:
    """reproduced (all hold) / partly (some) / contradicted (none); None = not measured."""
    known = [p for p in parts if p is not None]
    if not known:
        return "not yet measured"
    if all(known) and len(known) == len(parts):
        return "reproduced"
    return "partly" if any(known) else "contradicted"


def _quality(claim: str, v: str, parts: list[str], ev: QualityEvidence) -> Verdict:
    """Smoke records never decide; fewer than MIN_ENVS environments cap at partly."""
    if ev.profile != "full" and v != "not yet measured":
        parts = [f"smoke only ({v} on {ev.n_seeds} seeds, {', '.join(ev.envs)})"] + parts
        v = "not yet measured"
    elif v == "reproduced" and len(ev.envs) < MIN_ENVS:
        v = "partly"
        parts = [f"reproduced on {len(ev.envs)} of {ev.planned_envs} planned environments "
                 f"(< {MIN_ENVS}: capped at partly)"] + parts
    note = (f"notebook 04_rl_quality; {ev.profile} profile; IQM/POI over "
            f"{', '.join(ev.envs)}")
    return Verdict(claim, v, "; ".join(parts), ev.hardware, QUALITY_SOURCE, note)


def a5(poi: pd.DataFrame, ev: QualityEvidence) -> Verdict:
    """A5: scaled FP8 (fp8-delayed) not worse than FP32 AND better than unscaled FP8."""
    v = _combine([_not_worse(poi, "fp8-delayed", "fp32"),
                  _better(poi, "fp8-delayed", "fp8-noscale")])
    return _quality("A5", v, [_compare(poi, "fp8-delayed", "fp32")[1],
                              _compare(poi, "fp8-delayed", "fp8-noscale")[1],
                              _compare(poi, "fp8-current", "fp8-noscale")[1]], ev)


def a6(poi: pd.DataFrame, ev: QualityEvidence) -> Verdict:
    """A6: FP8 compute with FP32 master weights (fp8-delayed) not worse than FP32."""
    v = _combine([_not_worse(poi, "fp8-delayed", "fp32")])
    return _quality("A6", v, [_compare(poi, "fp8-delayed", "fp32")[1]], ev)


def a7(poi: pd.DataFrame, ev: QualityEvidence) -> Verdict:
    """A7: the Kahan update beats the naive one (FP8- or BF16-stored weights); reproduced if
    fp8-e2e is then also not worse than FP32, partly if it is."""
    kahan = [_better(poi, "fp8-e2e", "fp8-e2e-nokahan"),
             _better(poi, "bf16w-kahan", "bf16w-nokahan")]
    helps = None if all(k is None for k in kahan) else any(bool(k) for k in kahan)
    v = ("not yet measured" if helps is None else "contradicted" if not helps else
         "reproduced" if _not_worse(poi, "fp8-e2e", "fp32") else "partly")
    return _quality("A7", v, [_compare(poi, "fp8-e2e", "fp8-e2e-nokahan")[1],
                              _compare(poi, "bf16w-kahan", "bf16w-nokahan")[1],
                              _compare(poi, "fp8-e2e", "fp32")[1]], ev)


def a8(poi: pd.DataFrame, ev: QualityEvidence, diverged: Mapping[str, int]) -> Verdict:
    """A8: removing gradient clipping and removing weight clipping both make fp8-e2e worse.
    ``diverged``: diverged seeds per variant."""
    v = _combine([_better(poi, "fp8-e2e", "fp8-e2e-nogradclip"),
                  _better(poi, "fp8-e2e", "fp8-e2e-noweightclip")])
    div = ", ".join(f"{k} {int(n)}" for k, n in diverged.items() if n) or "none"
    return _quality("A8", v, [_compare(poi, "fp8-e2e", "fp8-e2e-nogradclip")[1],
                              _compare(poi, "fp8-e2e", "fp8-e2e-noweightclip")[1],
                              f"diverged seeds: {div}"], ev)


def a10(poi: pd.DataFrame, ev: QualityEvidence, same_seed: bool | None,
        repeats: pd.DataFrame) -> Verdict:
    """A10: fp8-delayed not worse than FP32 and BF16, AND the same seed gives bit-identical
    returns: within a process (``same_seed``, None if not measured) and across processes
    (``repro.analysis.rl.repeat_identical`` rows of this hardware)."""
    if len(repeats):
        same = bool(repeats.identical.all())
        same_seed = same if same_seed is None else bool(same_seed and same)
    q = _not_worse(poi, "fp8-delayed", "fp32")
    quality = None if q is None else bool(q and _not_worse(poi, "fp8-delayed", "bf16"))
    v = _combine([quality, same_seed])
    across = (f" (in one process, and across processes for {len(repeats)} cells x "
              f"{int(repeats.seeds.min())} seeds)" if len(repeats) else "")
    return _quality("A10", v, [_compare(poi, "fp8-delayed", "fp32")[1],
                               _compare(poi, "fp8-delayed", "bf16")[1],
                               f"same seed bit-identical: {same_seed}{across}"], ev)
