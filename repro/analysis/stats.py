from __future__ import annotations

import contextlib
import math
import warnings
from typing import Iterable, Mapping

import numpy as np
import pandas as pd


def ratio(num, den, what: str) -> float:
    """``num / den`` of two measurements (a speedup, an efficiency). NaN where either is
    missing (NaN: no such cell); a one-line ``ValueError`` naming ``what`` where either is
    infinite or the denominator is not > 0, instead of an inf or a sign flip that would move
    a verdict. (``repro.evidence.load_records`` refuses such records; this guards derived
    values too.)"""
    num, den = float(num), float(den)
    if math.isnan(num) or math.isnan(den):
        return math.nan
    if math.isinf(num) or math.isinf(den) or den <= 0:
        raise ValueError(f"{what}: cannot divide {num!r} by {den!r} (a measurement must be a "
                         "finite number and a denominator > 0)")
    return num / den


def _iqm(x: np.ndarray) -> float:
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(x).ravel(), 0.25))


def _stratified_bootstrap(scores: np.ndarray, fn, reps: int, rng) -> np.ndarray:
    runs, tasks = scores.shape
    out = np.empty(reps)
    for i in range(reps):
        idx = rng.integers(0, runs, size=(runs, tasks))
        out[i] = fn(np.take_along_axis(scores, idx, axis=0))
    return out


@contextlib.contextmanager
def _global_numpy_seed(seed: int):
    """rliable's StratifiedBootstrap draws its indices from NumPy's GLOBAL generator
    (``np.random.choice`` in ``update_indices``), ignoring the ``random_state`` it is given, so
    its intervals changed from run to run. Seed the global generator for the call, then put
    its state back."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def aggregate(scores: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0
              ) -> pd.DataFrame:
    """IQM (and mean) of normalised scores per variant with 95% stratified-bootstrap CIs."""
    rows = []
    try:
        from rliable import library as rly
        from rliable import metrics as rm

        fn = lambda x: np.array([rm.aggregate_iqm(x), rm.aggregate_mean(x)])  # noqa: E731
        with warnings.catch_warnings(), _global_numpy_seed(seed):
            warnings.simplefilter("ignore", FutureWarning)  # arch: "random_state is deprecated"
            pt, ci = rly.get_interval_estimates(dict(scores), fn, reps=reps,
                                                random_state=np.random.RandomState(seed))
        for v in scores:
            rows.append({"variant": v, "iqm": pt[v][0], "iqm_lo": ci[v][0, 0],
                         "iqm_hi": ci[v][1, 0], "mean": pt[v][1], "mean_lo": ci[v][0, 1],
                         "mean_hi": ci[v][1, 1], "backend": "rliable"})
    except ImportError:
        rng = np.random.default_rng(seed)
        for v, s in scores.items():
            b_iqm = _stratified_bootstrap(s, _iqm, reps, rng)
            b_mean = _stratified_bootstrap(s, np.mean, reps, rng)
            rows.append({"variant": v, "iqm": _iqm(s), "iqm_lo": np.percentile(b_iqm, 2.5),
                         "iqm_hi": np.percentile(b_iqm, 97.5), "mean": float(np.mean(s)),
                         "mean_lo": np.percentile(b_mean, 2.5),
                         "mean_hi": np.percentile(b_mean, 97.5), "backend": "numpy"})
    return pd.DataFrame(rows)


def _poi(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y), averaged over tasks (columns)."""
    vals = []
    for j in range(x.shape[1]):
        a, b = x[:, j][:, None], y[:, j][None, :]
        vals.append(float(np.mean((a > b) + 0.5 * (a == b))))
    return float(np.mean(vals))


def _ties(x: np.ndarray, y: np.ndarray) -> float:
    """The share of P(X > Y)'s weight that equal scores fix at 0.5: P(X = Y), averaged over
    tasks (a task where every run reaches a capped return, as CartPole-v1's 500, ties all)."""
    return float(np.mean([np.mean(x[:, j][:, None] == y[:, j][None, :])
                          for j in range(x.shape[1])]))


def probability_of_improvement(scores: Mapping[str, np.ndarray],
                               pairs: Iterable[tuple[str, str]], reps: int = 2000,
                               seed: int = 0) -> pd.DataFrame:
    """P(variant X scores above variant Y on a random env) with a 95% stratified bootstrap CI;
    ``ties``: the share of it that equal scores fix at 0.5 (:func:`_ties`)."""
    pairs = [(x, y) for x, y in pairs if x in scores and y in scores]
    rows = []
    try:
        from rliable import library as rly
        from rliable import metrics as rm

        d = {f"{x},{y}": (scores[x], scores[y]) for x, y in pairs}
        if d:
            with warnings.catch_warnings(), _global_numpy_seed(seed):
                warnings.simplefilter("ignore", FutureWarning)
                pt, ci = rly.get_interval_estimates(d, rm.probability_of_improvement, reps=reps,
                                                    random_state=np.random.RandomState(seed))
            for x, y in pairs:
                k = f"{x},{y}"
                rows.append({"x": x, "y": y, "p": float(np.ravel(pt[k])[0]),
                             "lo": float(np.ravel(ci[k][0])[0]),
                             "hi": float(np.ravel(ci[k][1])[0]),
                             "ties": _ties(scores[x], scores[y]), "backend": "rliable"})
    except ImportError:
        rng = np.random.default_rng(seed)
        for x, y in pairs:
            sx, sy = scores[x], scores[y]
            boot = []
            for _ in range(reps):
                ix = rng.integers(0, sx.shape[0], size=sx.shape)
                iy = rng.integers(0, sy.shape[0], size=sy.shape)
                boot.append(_poi(np.take_along_axis(sx, ix, 0), np.take_along_axis(sy, iy, 0)))
            rows.append({"x": x, "y": y, "p": _poi(sx, sy), "lo": np.percentile(boot, 2.5),
                         "hi": np.percentile(boot, 97.5), "ties": _ties(sx, sy),
                         "backend": "numpy"})
    return pd.DataFrame(rows, columns=["x", "y", "p", "lo", "hi", "ties", "backend"])


def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t confidence interval of the mean (NaNs for n < 2)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], float)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if v.size < 2:
        return m, math.nan, math.nan
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1)
                 / math.sqrt(v.size))
    return m, m - half, m + half


def welch_interval(m1: float, s1: float, n1: int, m2: float, s2: float, n2: int,
                   confidence: float = 0.95) -> tuple[float, float, float]:
    """``m1 - m2`` and its Welch t-interval from two samples' means, SDs and sizes."""
    from scipy import stats

    v1, v2 = s1 * s1 / n1, s2 * s2 / n2
    se = np.sqrt(v1 + v2)
    if se == 0:
        return m1 - m2, m1 - m2, m1 - m2
    dof = (v1 + v2) ** 2 / (v1 * v1 / (n1 - 1) + v2 * v2 / (n2 - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, dof) * se)
    return m1 - m2, m1 - m2 - half, m1 - m2 + half


def round_range(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` with ``lo`` and ``hi``: the range of each record's ``value`` over its timed
    rounds (``extra.samples_s`` or ``extra.samples_ms``), for error bars. A time (unit ``s`` or
    ``ms``) scales with its round's time, a rate (anything else) inversely, both relative to
    the rounds' median; a record without rounds or without a ``spread`` (memory, compile
    time) gets its value for both."""
    def one(r) -> tuple[float, float]:
        extra = r.get("extra") if isinstance(r.get("extra"), dict) else {}
        s = np.asarray(extra.get("samples_s") or extra.get("samples_ms") or [], float)
        spread = r.get("spread")
        if len(s) < 2 or spread is None or (isinstance(spread, float) and math.isnan(spread)):
            return r["value"], r["value"]
        rel = s / np.median(s) if r.get("unit") in ("s", "ms") else np.median(s) / s
        return float(r["value"] * rel.min()), float(r["value"] * rel.max())

    out = records.copy()
    lohi = [one(r) for r in records.to_dict("records")]
    out["lo"] = [a for a, _ in lohi]
    out["hi"] = [b for _, b in lohi]
    return out


def round_ratio_range(num_samples, den_samples) -> tuple[float, float]:
    """(min, max) over rounds of ``num_samples[k] / den_samples[k]``: the range of a ratio of
    two timings taken in the same rounds (A, B, A, B, ...), where round k of one is beside
    round k of the other; NaNs when either has no rounds or they differ in number."""
    a, b = np.asarray(num_samples or [], float), np.asarray(den_samples or [], float)
    if len(a) < 1 or len(a) != len(b):
        return math.nan, math.nan
    r = a / b
    return float(r.min()), float(r.max())
