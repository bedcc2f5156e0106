"""What the measurement records say, as the step-time model reads them.

- :class:`RateTable`: one chip's GEMM times per number format, from the ``gemm`` sweep less its
  per-call overhead (or the GEMM kernel's traced device time, from ``kernel_times`` records of
  the ``gemm`` workload), never below the datasheet roofline; off the sweep a shape's rate is
  interpolated in log(flops).
- :func:`step_records`: the measured step times of ``mlp_step`` and ``lm_step``, by shape and
  recipe; :func:`measured_step`: the model's step for one such shape.
- :func:`traced_steps`: the ``kernel_times`` traces of whole steps.

Records are read by experiment name: the model depends on what the studies wrote, never on the
studies' code. Emulated records are never read.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from repro import catalogue
from repro import hardware as hw
from repro import evidence
from repro.perfmodel.cost import (FORMATS, Gemm, Step, lm_shape, lm_step_gemms, mlp_step_gemms,
                                  program_step)

GEMM = "gemm"  # the GEMM sweep's experiment (repro.experiments.gemm.measure)
# the kernel traces' experiment (repro.experiments.kernel_times.measure)
KERNEL_TIMES = "kernel_times"
# experiment -> workload of a step record (the experiments with a step_workload)
WORKLOADS = {e.name: e.step_workload for e in catalogue.EXPERIMENTS if e.step_workload}
STEP_KEY = ["workload", "model", "batch", "seq_len", "width", "depth"]


def _norm_sizes(sizes: dict) -> tuple[int, int, int] | None:
    low = {str(k).lower(): v for k, v in (sizes or {}).items()}
    try:
        return int(low["m"]), int(low["k"]), int(low["n"])
    except (KeyError, TypeError, ValueError):
        return None


def _pool_16bit(points: dict[str, np.ndarray]) -> None:
    """BF16 and FP16 run the same tensor-core instructions at the same datasheet peak, so a
    shape measured in both gets the faster of the two times in both tables (in place). On the
    H200 the sweep's BF16 sample at 65536x2048x2048 ran well below both its FP16 sample and the
    BF16 train step at that width (the gemm and mlp_step records): the slower sample is the
    outlier."""
    a, b = points.get("bf16"), points.get("fp16")
    if a is None or b is None:
        return
    for row in a:
        hit = (b[:, :3] == row[:3]).all(1)
        if hit.any():
            row[3] = b[hit, 3] = min(row[3], float(b[hit][0, 3]))


def roofline_s(g: Gemm, info: hw.HardwareInfo, fmt: str | None = None) -> float:
    """One launch at the datasheet peak, or its bytes at the datasheet bandwidth."""
    peak = (info.peak_tflops or {}).get(fmt or g.fmt)
    t = g.launch_flops / (peak * 1e12) if peak else 0.0
    if info.memory_bandwidth_tbs:
        t = max(t, g.launch_bytes / (info.memory_bandwidth_tbs * 1e12))
    return t


def _traced_gemms(records: pd.DataFrame | None, slug: str
                  ) -> dict[str, dict[tuple[int, int, int], float]]:
    """Median traced GEMM-kernel seconds per call, by format and (m, k, n): ``kernel_times``
    records of the ``gemm`` workload, never emulated."""
    out: dict[str, dict[tuple[int, int, int], list]] = {}
    if records is None or not len(records) or "experiment" not in records:
        return {}
    df = records[(records["experiment"] == KERNEL_TIMES)
                 & (records["metric"] == "gemm_ms_per_step") & (records["hardware"] == slug)
                 & (~records["emulated"].astype(bool))]
    for rec in df.to_dict("records"):
        sizes = rec["sizes"] or {}
        mkn = _norm_sizes(sizes)
        if sizes.get("workload") != "gemm" or mkn is None or rec["recipe"] not in FORMATS:
            continue
        if rec["value"] > 0:
            out.setdefault(rec["recipe"], {}).setdefault(mkn, []).append(rec["value"] * 1e-3)
    return {f: {k: float(np.median(v)) for k, v in d.items()} for f, d in out.items()}


def _sweep_points(records: pd.DataFrame | None, slug: str) -> dict[str, np.ndarray]:
    """(m, k, n, seconds per call) of each non-emulated ``gemm`` record of ``slug``, by format;
    a shape measured several times gets the median time."""
    pts: dict[str, list] = {}
    if records is not None and len(records):
        df = records[(records["experiment"] == GEMM) & (records["metric"] == "tflops")
                     & (records["hardware"] == slug) & (~records["emulated"].astype(bool))]
        for rec in df.to_dict("records"):
            mkn = _norm_sizes(rec["sizes"])
            if mkn is None or rec["recipe"] not in FORMATS or not rec["value"] > 0:
                continue
            t = 2.0 * math.prod(mkn) / (rec["value"] * 1e12)
            pts.setdefault(rec["recipe"], []).append((*mkn, t))
    points = {}
    for fmt, rows in pts.items():
        a = np.asarray(rows, float)
        keys = {tuple(r[:3]) for r in a}
        points[fmt] = np.asarray([(*key, np.median(a[(a[:, :3] == key).all(1), 3]))
                                  for key in sorted(keys)])
    return points


@dataclass
class RateTable:
    """Measured GEMM times of one chip, by format: rows (m, k, n, seconds per call).

    ``overhead_s``: the sweep's per-call overhead per format (host dispatch and
    synchronisation that a GEMM inside a jitted step does not pay), estimated as the smallest
    excess of a measured time over the datasheet roofline of its shape. ``traced``: device
    times of sweep shapes from ``repro.experiments.kernel_times.measure gemm``
    (``kernel_times`` records, GEMM kernels only), by format and shape; where one exists it
    replaces the sweep's time less the overhead (an estimate that a small GEMM's ~60 us call
    overhead on the H200 swamps).
    """

    hardware: str
    points: dict[str, np.ndarray]
    overhead_s: dict[str, float]
    traced: dict[str, dict[tuple[int, int, int], float]] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_records(cls, records: pd.DataFrame, info: hw.HardwareInfo) -> RateTable:
        points = _sweep_points(records, info.slug)
        _pool_16bit(points)
        overhead = {}
        for fmt, a in points.items():
            excess = [t - roofline_s(Gemm(int(m), int(k), int(n), fmt=fmt), info)
                      for m, k, n, t in a]
            overhead[fmt] = max(0.0, float(min(excess)))
        return cls(info.slug, points, overhead, _traced_gemms(records, info.slug))

    def formats(self) -> list[str]:
        return sorted(self.points)

    def _adjusted(self, fmt: str, info: hw.HardwareInfo) -> tuple[np.ndarray, ...]:
        """(flops, seconds, unique log-flops, their mean log-rate) of the measured shapes,
        overhead removed (or the traced time), never below the roofline."""
        key = ("adjusted", fmt, info.slug)
        if key not in self._cache:
            a = self.points[fmt]
            flops = 2.0 * a[:, 0] * a[:, 1] * a[:, 2]
            roof = np.array([roofline_s(Gemm(int(m), int(k), int(n), fmt=fmt), info)
                             for m, k, n in a[:, :3]])
            t = a[:, 3] - self.overhead_s[fmt]
            traced = self.traced.get(fmt, {})
            t = np.array([traced.get((int(m), int(k), int(n)), ti)
                          for (m, k, n), ti in zip(a[:, :3], t)])
            t = np.maximum(t, roof)
            # log-rate against log-flops, shapes of equal flops averaged (for interpolation)
            lf, lr = np.log(flops), np.log(flops / t)
            ulf = np.unique(lf)
            ulr = np.array([lr[lf == x].mean() for x in ulf])
            self._cache[key] = (flops, t, ulf, ulr)
        return self._cache[key]

    def adjusted(self, fmt: str, info: hw.HardwareInfo) -> tuple[np.ndarray, np.ndarray]:
        """(flops, seconds) of each measured shape, overhead removed, never below roofline."""
        return self._adjusted(fmt, info)[:2]

    def measured_time(self, g: Gemm, info: hw.HardwareInfo, fmt: str | None = None,
                      offsweep_eff: float = 1.0) -> tuple[float, bool]:
        """Seconds of one launch of ``g`` (in ``fmt``, default ``g.fmt``) and whether the shape
        was measured exactly. Off-sweep shapes: rate interpolated in log(flops) (clamped at
        the ends) times ``offsweep_eff``; never below the roofline."""
        fmt = fmt or g.fmt
        a = self.points[fmt]
        _, t_adj, ulf, ulr = self._adjusted(fmt, info)
        if g.batch == 1 and g.work == 1.0:
            hit = (a[:, 0] == g.m) & (a[:, 1] == g.k) & (a[:, 2] == g.n)
            if hit.any():
                return float(t_adj[hit][0]), True
        rate = float(np.exp(np.interp(math.log(g.launch_flops), ulf, ulr)))
        t = g.launch_flops / (rate * offsweep_eff)
        return max(t, roofline_s(g, info, fmt)), False

    def measured_rate(self, m: int, k: int, n: int, fmt: str, info: hw.HardwareInfo) -> float:
        """TFLOP/s of the sweep (overhead included) at a measured shape, else interpolated."""
        a = self.points[fmt]
        hit = (a[:, 0] == m) & (a[:, 1] == k) & (a[:, 2] == n)
        if hit.any():
            return 2.0 * m * k * n / a[hit][0, 3] / 1e12
        t, _ = self.measured_time(Gemm(m, k, n, fmt=fmt), info)
        return 2.0 * m * k * n / (t + self.overhead_s[fmt]) / 1e12


# ---------------------------------------------------------------------- measured steps


def measured_records() -> pd.DataFrame:
    """The records the model reads, from ``results/`` and ``build/results/``: ``gemm``, the
    step times (``mlp_step``, ``lm_step``) and the kernel traces (``kernel_times``)."""
    frames = [evidence.load_records(e) for e in (GEMM, *WORKLOADS, KERNEL_TIMES)]
    frames = [f for f in frames if len(f)]
    with warnings.catch_warnings():  # columns all-NA in one experiment (e.g. spread) stay
        warnings.simplefilter("ignore", FutureWarning)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _fact(extra: Any, key: str) -> float:
    v = (extra or {}).get(key) if isinstance(extra, dict) else None
    return float(v) if v is not None else math.nan


def step_records(records: pd.DataFrame | None, slug: str,
                 recipes: Sequence[str] | None = None) -> pd.DataFrame:
    """Median measured step time (ms) per (shape, recipe) of ``mlp_step`` and ``lm_step``, with
    the compiled program's ``hlo_bytes`` and ``hlo_kernels`` where the records carry them
    (NaN otherwise). Emulated records are left out.

    A shape is :data:`STEP_KEY`: ``workload`` ("mlp" or "lm"), ``model`` (the LM preset, ""
    for the MLP), ``batch`` (rows of the MLP, sequences of the LM), ``seq_len`` (0 for the
    MLP), ``width`` and ``depth`` (the MLP's; the LM's d_model and layers, for reading only:
    the LM step is rebuilt from its preset, ``cost.lm_shape``).
    """
    cols = [*STEP_KEY, "recipe", "measured_ms", "hlo_bytes", "hlo_kernels"]
    if records is None or not len(records):
        return pd.DataFrame(columns=cols)
    df = records[records["experiment"].isin(list(WORKLOADS))
                 & (records["metric"] == "step_time_ms") & (records["hardware"] == slug)
                 & (~records["emulated"].astype(bool))]
    if recipes is not None:
        df = df[df["recipe"].isin(list(recipes))]
    rows = []
    for rec in df.to_dict("records"):
        s, e = rec["sizes"] or {}, rec.get("extra")
        try:
            if rec["experiment"] == "lm_step":
                shape = lm_shape(str(s["model"]), int(s["seq_len"]))
                if shape is None:
                    continue  # a preset this checkout does not know
                key = ("lm", str(s["model"]), int(s["batch"]), shape.seq_len, shape.hidden,
                       shape.n_layers)
            else:
                key = ("mlp", "", int(s["batch"]), 0, int(s["width"]), int(s["depth"]))
        except (KeyError, TypeError, ValueError):
            continue
        rows.append((*key, rec["recipe"], float(rec["value"]), _fact(e, "hlo_bytes_accessed"),
                     _fact(e, "hlo_kernels")))
    return pd.DataFrame(rows, columns=cols).groupby([*STEP_KEY, "recipe"], as_index=False).agg(
        measured_ms=("measured_ms", "median"), hlo_bytes=("hlo_bytes", "median"),
        hlo_kernels=("hlo_kernels", "median"))


def measured_step(row, recipe: str | None = None, hlo_bytes=None, hlo_kernels=None) -> Step:
    """The model's step for one row of :func:`step_records` (any object with the
    :data:`STEP_KEY` attributes), under ``recipe`` (default: the row's), with its traffic from
    the compiled program where both facts are given (:func:`program_step`).

    The MLP step is the timed one: XLA drops the first layer's data gradient (nothing consumes
    it). The LM step is ``repro.experiments.lm_step.measure``'s step of the preset (``batch``
    sequences of ``seq_len`` tokens)."""
    recipe = recipe or row.recipe
    if row.workload == "lm":
        shape = lm_shape(row.model, row.seq_len)
        if shape is None:
            raise ValueError(f"unknown LM preset {row.model!r}")
        step = lm_step_gemms(shape, int(row.batch) * int(row.seq_len), recipe)
    else:
        step = mlp_step_gemms(row.batch, row.width, row.depth, recipe, input_grad=False)
    return program_step(step, hlo_bytes, hlo_kernels)


def shape_label(workload: str, model: str, batch: int, width: int, depth: int) -> str:
    """How a measured shape is named in tables: ``65536x4096x3`` (MLP batch x width x depth)
    or ``lm-120m b32`` (LM preset, sequences per step)."""
    if workload == "lm":
        return f"lm-{model} b{int(batch)}"
    return f"{int(batch)}x{int(width)}x{int(depth)}"


def label(r) -> str:
    """:func:`shape_label` of a row with the :data:`STEP_KEY` attributes."""
    return shape_label(r.workload, r.model, r.batch, r.width, r.depth)


def trace_key(r) -> tuple:
    """The key of :func:`traced_steps` for a row with the :data:`STEP_KEY` attributes."""
    return (("lm", r.model, int(r.batch)) if r.workload == "lm"
            else ("mlp", int(r.batch), int(r.width), int(r.depth)))


def traced_steps(records: pd.DataFrame | None, slug: str) -> dict[tuple, dict[str, dict]]:
    """``kernel_times`` traces of whole steps on ``slug`` (never emulated): {shape key:
    {recipe: {metric: value}}}, the key ``("lm", model, batch)`` or ``("mlp", batch, width,
    depth)`` (:func:`trace_key`). Traces of single GEMMs are the :class:`RateTable`'s."""
    if records is None or not len(records) or "experiment" not in records:
        return {}
    kt = records[(records["experiment"] == KERNEL_TIMES) & (records["hardware"] == slug)
                 & (~records["emulated"].astype(bool))]
    by: dict[tuple, dict[str, dict]] = {}
    for rec in kt.to_dict("records"):
        s = rec["sizes"] or {}
        if s.get("workload") == "lm":
            key = ("lm", str(s.get("model")), int(s.get("batch", 0)))
        elif s.get("workload") == "mlp":
            key = ("mlp", int(s.get("batch", 0)), int(s.get("width", 0)), int(s.get("depth", 0)))
        else:
            continue
        by.setdefault(key, {}).setdefault(rec["recipe"], {})[rec["metric"]] = float(rec["value"])
    return by
