"""The verdict record and its vocabulary."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
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
        for f in fields(self):
            v, kind = getattr(self, f.name), bool if f.name == "emulated" else str
            if type(v) is not kind:
                raise ValueError(f"verdict of claim {self.claim}: {f.name} must be "
                                 f"{kind.__name__}, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _hw(frame: pd.DataFrame, default: str = "none") -> str:
    return ", ".join(sorted(frame["hardware"].unique())) if len(frame) else default


@functools.cache
def definitions() -> dict[str, dict[str, Any]]:
    """The claims as ``repro/data/claims.yaml`` defines them (statement, notebook, margin)."""
    return yaml.safe_load(resources.files("repro").joinpath("data/claims.yaml").read_text())


def margin(claim: str) -> tuple[float, float]:
    """The equivalence margin [low, high] of a parity claim, from its definition."""
    m = definitions().get(claim, {}).get("margin")
    if not m:
        have = ", ".join(k for k, v in definitions().items() if v.get("margin"))
        raise ValueError(f"claim {claim!r} has no margin in repro/data/claims.yaml; claims "
                         f"with one: {have}")
    return float(m["bounds"][0]), float(m["bounds"][1])
