"""The verdict record and its vocabulary."""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from typing import Any, Mapping, Sequence

import pandas as pd
import yaml

from repro.schema import CHECK, hints, suggest, type_name

VERDICTS = ("reproduced", "partly", "contradicted", "inconclusive", "projected",
            "not yet measured")

UNSURE = "inconclusive"  # a part of a claim the data cannot decide


def tidy(numbers: Any) -> Any:
    """``numbers`` (nested mappings of numbers) with floats to 4 significant digits, bools
    and ints kept, non-finite values and empty mappings dropped: the same bytes for the same
    evidence in ``verdicts/`` and ``metrics/``."""
    if isinstance(numbers, dict):
        out = {str(k): tidy(v) for k, v in numbers.items()}
        return {k: v for k, v in out.items() if v is not None and v != {}}
    if isinstance(numbers, (bool, int, str)) or numbers is None:  # a verdict's word stays one
        return numbers
    x = float(numbers)
    return float(f"{x:.4g}") if math.isfinite(x) else None


@dataclass(frozen=True)
class Verdict:
    """One claim's verdict, as the ledger stores it (``verdicts/<claim>.json``).

    ``numbers``: the key number's values as numbers (nested by hardware, comparison...), for
    ``metrics/<notebook>.json`` and ``dvc metrics``. ``stale``: the verdict rests on quality
    records made by other code than this checkout's, ``stale_note`` says which and since when
    (``repro.claims.staleness``; stale speed records are left out instead, named in ``note``).
    ``caveat``: the one caveat that most limits the verdict, short enough for the ledger's
    one-line row (a rule changed after its data, a projection's validation, what a memory
    number is). ``decides``: the clause of the key number that decides the verdict, where it
    is not the first (the ledger's row shows it whole).
    """

    claim: str
    verdict: str
    key_number: str = ""
    hardware: str = ""
    source: str = ""
    note: str = ""
    emulated: bool = False
    numbers: dict[str, Any] = field(default_factory=dict)
    stale: bool = False
    stale_note: str = ""
    caveat: str = ""
    decides: str = ""

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r} for claim {self.claim}; "
                             f"valid: {', '.join(VERDICTS)}")
        kinds = hints(Verdict)
        for f in fields(self):
            v, kind = getattr(self, f.name), typing.get_origin(kinds[f.name]) or kinds[f.name]
            if not CHECK.conforms(v, kind):  # numbers: any dict (tidy makes its keys text)
                raise ValueError(f"verdict of claim {self.claim}: {f.name} must be "
                                 f"{type_name(kind)}, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "numbers": tidy(dict(self.numbers))}


def _hw(frame: pd.DataFrame, default: str = "none") -> str:
    return ", ".join(sorted(frame["hardware"].unique())) if len(frame) else default


def _hw_judged(judged: pd.DataFrame, measured: pd.DataFrame) -> str:
    """The hardware column of a speed verdict: the hardware it was judged on, then each
    hardware with ``measured`` ratios (an ``emulated`` column) of which none was judged, and
    why: its low-precision format is emulated there (no such arithmetic), or no ratio of it
    passed the rule's other conditions."""
    if not len(measured) or "hardware" not in measured:
        return _hw(judged)
    left = sorted(set(measured["hardware"]) - set(judged["hardware"] if len(judged) else ()))
    why = {h: "emulated there" if measured[measured.hardware == h].emulated.all()
           else "no ratio under the rule" for h in left}
    return _hw(judged) + "".join(f"; {h}: not judged ({w})" for h, w in why.items())


@functools.cache
def definitions() -> dict[str, dict[str, Any]]:
    """The claims as ``repro/data/claims.yaml`` defines them (statement, notebook, margin)."""
    return yaml.safe_load(resources.files("repro").joinpath("data/claims.yaml").read_text())


def rule(claim: str, given: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The decision rule of ``claim`` as ``repro/data/claims.yaml`` writes it (its ``rule``):
    the studies and cells it judges, the recipes or formats and how several combine, the
    statistic and its thresholds. ``given`` replaces it (a rule as first registered, or one
    read from an older commit: :mod:`repro.claims.registration`)."""
    if given is not None:
        return given
    r = definitions().get(claim, {}).get("rule")
    if not r:
        hint = "" if claim in definitions() else suggest(claim, definitions())
        raise ValueError(f"claim {claim!r} has no rule in repro/data/claims.yaml{hint}")
    return r


def recipes(r: Mapping[str, Any], have: Sequence[str] = ()) -> list[str]:
    """The recipes (or formats) a rule names: its list, or where it names a family (``fp8``:
    every FP8 recipe; ``every variant``) the recipes of ``have`` in that family."""
    names = r.get("recipes", r.get("formats", []))
    if isinstance(names, str):
        if names == "every variant":
            return list(have)
        return [h for h in have if str(h).startswith(names)]
    return list(names)


def margin(claim: str, part: str | None = None) -> tuple[float, float]:
    """The equivalence margin [low, high] of a parity claim, from its definition; ``part``
    names one of them where the claim has several (B6: one per inference format)."""
    m = definitions().get(claim, {}).get("margin")
    if not m:
        have = ", ".join(k for k, v in definitions().items() if v.get("margin"))
        raise ValueError(f"claim {claim!r} has no margin in repro/data/claims.yaml; claims "
                         f"with one: {have}")
    bounds = m["bounds"]
    if isinstance(bounds, dict):
        if part not in bounds:
            raise ValueError(f"claim {claim!r} has a margin per part in "
                             f"repro/data/claims.yaml; part {part!r} is not one: "
                             f"{', '.join(bounds)}")
        bounds = bounds[part]
    elif part is not None:
        raise ValueError(f"claim {claim!r} has one margin in repro/data/claims.yaml, not one "
                         f"per part; got part {part!r}")
    return float(bounds[0]), float(bounds[1])


def poi_row(poi: pd.DataFrame, x: str, y: str):
    """The row of P(X > Y) of a probability-of-improvement table (None if not run)."""
    r = poi[(poi.x == x) & (poi.y == y)] if len(poi) else poi
    return r.iloc[0] if len(r) else None


def poi_text(r, x: str, y: str) -> str:
    """P(X > Y) and its interval as text (a :func:`poi_row`)."""
    if r is None:
        return f"{x} vs {y}: not run"
    ties = float(r.get("ties", 0.0) or 0.0)
    return (f"P({x}>{y})={r.p:.2f} [{r.lo:.2f},{r.hi:.2f}]"
            + (f" ({ties:.0%} of its weight tied at 0.5)" if ties >= 0.05 else ""))


def parity(poi: pd.DataFrame, x: str, y: str, bounds: Sequence[float]
           ) -> tuple[bool | str | None, str]:
    """Parity of X with Y within the margin: True (kept), False (lost), UNSURE, None (not
    run), and the text naming the interval and the margin."""
    r = poi_row(poi, x, y)
    if r is None:
        return None, poi_text(r, x, y)
    low, high = bounds
    state = True if r.lo >= low else False if r.hi < low else UNSURE
    word = {True: "kept", False: "lost", UNSURE: "inconclusive"}[state]
    return state, f"{poi_text(r, x, y)} vs margin [{low:.2f},{high:.2f}]: {word}"
