"""The verdict record and its vocabulary."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

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
