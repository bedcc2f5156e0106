"""Small measurements several studies record: a learning curve of episode returns.

``_curve`` keeps its name: it is part of the measuring kit of the RL quality programs
(:mod:`repro.program`), whose fingerprint holds the function's source as written.
"""

from __future__ import annotations

import numpy as np


def _curve(x: np.ndarray, points: int = 100) -> list[float | None]:
    """A learning curve thinned to at most ``points`` (means over equal chunks)."""
    chunks = np.array_split(np.asarray(x, np.float64), min(points, len(x)))
    with np.errstate(all="ignore"):
        return [None if not np.isfinite(v) else float(v)
                for v in (np.nanmean(ch) if np.isfinite(ch).any() else np.nan for ch in chunks)]
