"""The verdict record and its vocabulary."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

import pandas as pd
import yaml

VERDICTS = ("reproduced", "partly", "contradicted", "inconclusive", "projected",
            "not yet measured")


@dataclass(frozen=True)
class Verdict:
    """One claim's verdict, as the ledger stores it (``verdicts/<claim>.json``)."""

    claim: str
    verdict: str
    key_number: str = ""
    hardware: str = ""
    source: str = ""
    note: str = ""
    emulated: bool = False

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r} for claim {self.claim}; "
                             f"valid: {', '.join(VERDICTS)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _hw(frame: pd.DataFrame, default: str = "none") -> str:
    return ", ".join(sorted(frame["hardware"].unique())) if len(frame) else default


@functools.cache
def definitions() -> dict[str, dict[str, Any]]:
    """The claims as ``repro/data/claims.yaml`` defines them (statement, notebook, margin)."""
    return yaml.safe_load(resources.files("repro").joinpath("data/claims.yaml").read_text())


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
