"""The step-time model of one chip, fitted on its measured BF16 steps and checked on its FP8 ones.

Time of a step (:func:`predict`)::

    t_step = max(sum_g t_gemm(g) + sum_p bytes_p / (bandwidth * bw_eff) + gap * n_launches,
                 step_floor)

``t_gemm``: the measured time where the ``gemm`` sweep has the shape (:class:`RateTable`), else
the measured rate interpolated in log(flops) times ``offsweep_gemm_eff``; for a format or chip
without measurements, the datasheet peak times the efficiency the measured chip reaches on the
same shape. ``gap``: idle device time per GEMM launch (``gap_per="gemm"``, the default: kernel
traces show idle time at the GEMMs, while the many small elementwise kernels of an FP8 step run
back to back), or per launch of any kernel (``gap_per="kernel"``).

:func:`calibrate` fits the free parameters on MEASURED BF16 step times only (``mlp_step`` and
``lm_step`` records); ``gap_us`` is measured instead where ``kernel_times`` traces of BF16 steps
exist (:func:`traced_gaps`). :func:`validate` then predicts the FP8 steps, never seen by the fit,
and compares the FP8/BF16 speedup with the measured one. Where step records carry the compiled
program's facts, each program's elementwise traffic comes from them (:func:`program_step`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repro import hardware as hw
from repro.perfmodel.cost import Gemm, Step, check_gap_per
from repro.perfmodel.measured import (STEP_KEY, RateTable, label, measured_step, roofline_s,
                                      step_records, trace_key, traced_steps)

# Where a format has no measured rate, the efficiency of this measured format stands in
# (Hopper has no FP4 tensor cores: FP4 borrows FP8's efficiency, an assumption).
FORMAT_PROXY = {"fp4": "fp8", "fp8": "fp8", "bf16": "bf16", "fp16": "bf16", "tf32": "tf32",
                "fp32": "fp32"}
FALLBACK_PROXY = {"fp16": "bf16", "tf32": "bf16", "fp32": "tf32", "fp4": "bf16", "fp8": "bf16"}
# The measured FP8 recipes the model is validated against (registry entries; their variants
# are ablations of one of them, not further validation data).
VALIDATED = ("fp8-current", "fp8-delayed", "flax-fp8")


@dataclass(frozen=True)
class ModelParams:
    """The free parameters. ``datasheet_gemm_eff`` is used only where no rate is measured
    (fixed, not fitted, unless there are no GEMM records at all). ``gap_us``: idle device
    time per launch of what ``gap_per`` names (``cost.GAP_PER``: a modelling choice, never
    fitted)."""

    offsweep_gemm_eff: float = 1.0
    bw_eff: float = 0.85
    gap_us: float = 10.0
    step_floor_us: float = 100.0
    datasheet_gemm_eff: float = 0.7
    gap_per: str = "gemm"

    FITTED = ("offsweep_gemm_eff", "bw_eff", "gap_us", "step_floor_us")
    BOUNDS = {"offsweep_gemm_eff": (0.5, 1.5), "bw_eff": (0.05, 1.0),
              "gap_us": (0.0, 200.0), "step_floor_us": (0.0, 5000.0),
              "datasheet_gemm_eff": (0.05, 1.0)}


@dataclass
class Calibration:
    """A model for one chip: its registry entry, fitted parameters and measured GEMM rates.
    ``fit``: the BF16 steps fitted, measured and predicted; ``traced``: the
    :func:`traced_gaps` rows behind ``gap_us``."""

    hardware: hw.HardwareInfo
    params: ModelParams
    rates: RateTable | None = None
    calibrated: bool = False
    fit: pd.DataFrame | None = None
    fitted: tuple[str, ...] = ()
    traced: pd.DataFrame | None = None


def datasheet_calibration(info: hw.HardwareInfo | str,
                          params: ModelParams | None = None) -> Calibration:
    """No measurements: datasheet peaks times ``datasheet_gemm_eff``; ``calibrated=False``."""
    info = hw.lookup(info) if isinstance(info, str) else info
    return Calibration(info, params or ModelParams(), None, False)


# ------------------------------------------------------------------------------ the model


def _efficiency(g: Gemm, cal: Calibration) -> float:
    """Fraction of ``cal``'s chip's datasheet peak that ``g`` reaches there (its proxy format
    where ``g.fmt`` is not measured)."""
    src, p, rates = cal.hardware, cal.params, cal.rates
    if rates is not None and rates.points:
        fmt = FORMAT_PROXY.get(g.fmt, g.fmt)
        if fmt not in rates.points:
            fmt = FALLBACK_PROXY.get(g.fmt, "bf16")
        peak = (src.peak_tflops or {}).get(fmt)
        if fmt in rates.points and peak:
            t, _ = rates.measured_time(g, src, fmt, p.offsweep_gemm_eff)
            return min(1.0, g.launch_flops / (t * peak * 1e12))
    return p.datasheet_gemm_eff


def gemm_time(g: Gemm, cal: Calibration, target: hw.HardwareInfo | None = None) -> float:
    """Seconds of all ``g.count`` launches of ``g`` (idle gaps not included).

    On the calibrating chip: the measured rate where there is one (see
    :meth:`RateTable.measured_time`). Elsewhere (another chip, or a format the chip was not
    measured in): the target's datasheet peak for ``g.fmt`` times the efficiency the
    calibrating chip reaches on the same shape; never below the target's roofline.
    """
    tgt = target or cal.hardware
    if g.count == 0:
        return 0.0
    rates = cal.rates
    if tgt.slug == cal.hardware.slug and rates is not None and g.fmt in rates.points:
        t, _ = rates.measured_time(g, tgt, g.fmt, cal.params.offsweep_gemm_eff)
        return t * g.count
    peak = (tgt.peak_tflops or {}).get(g.fmt)
    if not peak:
        raise ValueError(f"{tgt.slug} has no {g.fmt} tensor-core rate in the registry")
    t = g.launch_flops / (peak * 1e12 * _efficiency(g, cal))
    return max(t, roofline_s(g, tgt)) * g.count


def predict(step: Step, cal: Calibration, target: hw.HardwareInfo | str | None = None
            ) -> dict[str, float]:
    """Predicted step time (seconds) on ``target`` (default: the calibrating chip), split
    into GEMM, memory-traffic and idle-gap parts (``gap_s``: ``gap_us`` per launch of what
    ``gap_per`` counts).

    ``total_s = max(device_s, step_floor)``: steps are dispatched asynchronously, so the
    host's per-step dispatch cost hides behind device work unless the device finishes first.
    """
    tgt = hw.lookup(target) if isinstance(target, str) else (target or cal.hardware)
    p = cal.params
    if not tgt.memory_bandwidth_tbs:
        raise ValueError(f"{tgt.slug} has no memory bandwidth in the registry")
    t_gemm = sum(gemm_time(g, cal, tgt) for g in step.gemms)
    t_mem = step.traffic_bytes() / (tgt.memory_bandwidth_tbs * 1e12 * p.bw_eff)
    t_gap = step.launches(p.gap_per) * p.gap_us * 1e-6
    device = t_gemm + t_mem + t_gap
    return {"total_s": max(device, p.step_floor_us * 1e-6), "device_s": device,
            "gemm_s": t_gemm, "traffic_s": t_mem, "gap_s": t_gap, "flops": step.flops}


# ------------------------------------------------------------------------- calibration


def fit_params(steps: Sequence[Step], measured_s: Sequence[float], cal: Calibration,
               names: Sequence[str] = ModelParams.FITTED, prior_weight: float = 0.02
               ) -> ModelParams:
    """Least squares in log(step time) over ``names`` (a weak pull towards the defaults keeps
    an under-determined fit finite)."""
    from scipy.optimize import least_squares

    names, base, default = list(names), cal.params, ModelParams()
    lo = [ModelParams.BOUNDS[n][0] for n in names]
    hi = [ModelParams.BOUNDS[n][1] for n in names]
    scale = np.array([max(abs(getattr(default, n)), 1.0) for n in names])
    y = np.log(np.asarray(measured_s, float))

    def params_of(x):
        return dataclasses.replace(base, **dict(zip(names, map(float, x))))

    def resid(x):
        c = dataclasses.replace(cal, params=params_of(x))
        pred = np.array([predict(s, c)["total_s"] for s in steps])
        prior = prior_weight * (x - np.array([getattr(default, n) for n in names])) / scale
        return np.concatenate([np.log(pred) - y, prior])

    best = None
    for start in (np.array([getattr(base, n) for n in names]),
                  np.array(lo) * 0.5 + np.array(hi) * 0.5):
        sol = least_squares(resid, np.clip(start, lo, hi), bounds=(lo, hi), x_scale=scale,
                            method="trf")
        if best is None or sol.cost < best.cost:
            best = sol
    return params_of(best.x)



def traced_gaps(records: pd.DataFrame | None, slug: str, per: str = "gemm") -> pd.DataFrame:
    """Idle device time per launch, measured on BF16 steps: (untraced step time - device busy
    time) / launches, per shape that has both a ``kernel_times`` record (busy time and kernels
    of the traced step) and an ``mlp_step`` / ``lm_step`` BF16 time. ``per="gemm"``: the
    launches are the step's GEMMs (as the model counts them, attention's products included);
    ``per="kernel"``: every traced kernel.

    The gaps between kernels that step times alone cannot separate from GEMM and memory time.
    BF16 only, never emulated: the FP8 steps are the validation data. Columns: the shape
    (:data:`STEP_KEY`), ``step_ms``, ``busy_ms``, ``kernels`` (traced), ``launches`` (what the
    gap is divided by), ``gap_us`` (gaps below 0, streams overlapping, count as 0).
    """
    check_gap_per(per)
    cols = [*STEP_KEY, "step_ms", "busy_ms", "kernels", "launches", "gap_us"]
    by = traced_steps(records, slug)
    rows = []
    for r in (step_records(records, slug, ["bf16"]).itertuples() if by else []):
        m = by.get(trace_key(r), {}).get("bf16", {})
        busy, n = m.get("kernel_ms_per_step"), m.get("kernels_per_step")
        if busy is None or not n:
            continue
        launches = n if per == "kernel" else measured_step(r, "bf16").gemm_launches
        gap = max(0.0, r.measured_ms - busy) / launches * 1e3
        rows.append((*(getattr(r, k) for k in STEP_KEY), r.measured_ms, busy, n, launches, gap))
    return pd.DataFrame(rows, columns=cols)


def calibrate(measured_records: pd.DataFrame | None, hardware: hw.HardwareInfo | str,
              gap_per: str = "gemm") -> Calibration:
    """Fit the model of ``hardware`` on its MEASURED BF16 step times (``mlp_step`` and, where
    recorded, ``lm_step``).

    ``measured_records``: records of the ``gemm``, ``mlp_step``, ``lm_step`` and
    ``kernel_times`` experiments (other rows are ignored; only this chip's non-emulated rows
    are used). GEMM rates come from the ``gemm`` records; the fit sees only ``recipe ==
    "bf16"`` step times, never an FP8 one. Without BF16 step times the defaults stay
    (``calibrated=False``). Where ``kernel_times`` records exist (:func:`traced_gaps`),
    ``gap_us`` is their median and is not fitted. ``gap_per``: what the gap is charged to.
    """
    info = hw.lookup(hardware) if isinstance(hardware, str) else hardware
    df = measured_records if measured_records is not None else pd.DataFrame()
    rates = RateTable.from_records(df, info) if len(df) else None
    if rates is not None and not rates.points:
        rates = None
    cal = Calibration(info, ModelParams(gap_per=check_gap_per(gap_per)), rates, False)
    bf16 = step_records(df, info.slug, ["bf16"])
    if not len(bf16):
        return cal
    if rates is not None and "bf16" not in rates.points:
        rates = cal.rates = None
    names = list(ModelParams.FITTED) if rates is not None else [
        "datasheet_gemm_eff", "bw_eff", "gap_us", "step_floor_us"]
    traced = traced_gaps(df, info.slug, gap_per)
    if len(traced):
        names.remove("gap_us")
        cal.params = dataclasses.replace(cal.params, gap_us=float(traced["gap_us"].median()))
    # With fewer points than parameters, fit the most important ones only.
    names = names[:max(1, min(len(names), len(bf16)))]
    steps = [measured_step(r, "bf16", r.hlo_bytes, r.hlo_kernels) for r in bf16.itertuples()]
    params = fit_params(steps, bf16["measured_ms"].to_numpy() * 1e-3, cal, names)
    cal = Calibration(info, params, rates, True, fitted=tuple(names),
                      traced=traced if len(traced) else None)
    cal.fit = bf16.assign(predicted_ms=[predict(s, cal)["total_s"] * 1e3 for s in steps])
    return cal


def validate(measured_records: pd.DataFrame, cal: Calibration,
             recipes: Sequence[str] = VALIDATED) -> pd.DataFrame:
    """Predicted vs measured FP8/BF16 step-time speedup at every measured shape, MLP
    (``mlp_step``) and LM (``lm_step``) alike, on ``cal``'s chip (``hardware``).

    One row per (shape, FP8 recipe) that has a BF16 step time of the same shape on the same
    chip (emulated records never count); ``workload`` says "mlp" or "lm", ``model`` the LM
    preset; ``error`` = predicted / measured speedup - 1; ``compiled_traffic``: both programs'
    traffic came from their compiled HLO (:func:`program_step`), not from the assumed passes.
    """
    df = step_records(measured_records, cal.hardware.slug, ["bf16", *recipes])
    cols = ["hardware", *STEP_KEY, "recipe", "measured_ms", "predicted_ms", "bf16_measured_ms",
            "bf16_predicted_ms", "measured_speedup", "predicted_speedup", "error",
            "compiled_traffic"]
    b16 = df[df["recipe"] == "bf16"].set_index(STEP_KEY)
    rows = []
    for r in df[df["recipe"] != "bf16"].itertuples():
        key = tuple(getattr(r, k) for k in STEP_KEY)
        if key not in b16.index:
            continue
        b = b16.loc[key]
        pb = predict(measured_step(r, "bf16", b.hlo_bytes, b.hlo_kernels), cal)["total_s"] * 1e3
        pq = predict(measured_step(r, r.recipe, r.hlo_bytes, r.hlo_kernels),
                     cal)["total_s"] * 1e3
        ms, ps = b.measured_ms / r.measured_ms, pb / pq
        rows.append((cal.hardware.slug, *key, r.recipe, r.measured_ms, pq, b.measured_ms, pb,
                     ms, ps, ps / ms - 1,
                     bool(math.isfinite(r.hlo_bytes) and math.isfinite(b.hlo_bytes))))
    return pd.DataFrame(rows, columns=cols)


# ------------------------------------------------------------------------------ tables


def parameter_table(cal: Calibration) -> pd.DataFrame:
    """The model's numeric parameters on ``cal``'s chip, with where each came from: ``fit``,
    ``kernel traces (N BF16 shapes, per gemm)`` (a measured ``gap_us``) or ``default``."""
    rows = []
    for name, value in dataclasses.asdict(cal.params).items():
        if not isinstance(value, (int, float)):
            continue  # gap_per: a modelling choice, not a number
        source = ("fit" if name in cal.fitted else
                  f"kernel traces ({len(cal.traced)} BF16 shapes, per {cal.params.gap_per})"
                  if name == "gap_us" and cal.traced is not None else "default")
        rows.append((cal.hardware.slug, name, value, "us" if name.endswith("_us") else "1",
                     source))
    return pd.DataFrame(rows, columns=["chip", "parameter", "value", "unit", "source"])


def fit_table(cal: Calibration) -> pd.DataFrame:
    """The BF16 steps the fit saw, measured and predicted (ms), by shape label."""
    cols = ["hardware", "shape", "measured_ms", "predicted_ms", "error"]
    if cal.fit is None or not len(cal.fit):
        return pd.DataFrame(columns=cols)
    f = cal.fit
    return pd.DataFrame({"hardware": cal.hardware.slug,
                         "shape": [label(r) for r in f.itertuples()],
                         "measured_ms": f["measured_ms"], "predicted_ms": f["predicted_ms"],
                         "error": f["predicted_ms"] / f["measured_ms"] - 1})[cols]


def validation_table(val: pd.DataFrame) -> pd.DataFrame:
    """:func:`validate` rows as a table by (chip, workload, shape label, FP8 recipe):
    ``predicted`` and ``measured`` speedup, ``error``, what FP8 adds to the BF16 step in ms,
    measured and predicted, and whether the traffic came from the ``compiled`` program or the
    ``assumed`` passes. Numbers are rounded to 4 decimals: the calibration is a least-squares
    fit whose last bits differ between CPUs, and a figure drawn from the table should not."""
    cols = ["hardware", "workload", "shape", "recipe", "predicted", "measured", "error",
            "fp8_minus_bf16_measured_ms", "fp8_minus_bf16_predicted_ms", "traffic_from"]
    if val is None or not len(val):
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame({
        "hardware": val["hardware"], "workload": val["workload"],
        "shape": [label(r) for r in val.itertuples()], "recipe": val["recipe"],
        "predicted": val["predicted_speedup"], "measured": val["measured_speedup"],
        "error": val["error"],
        "fp8_minus_bf16_measured_ms": val["measured_ms"] - val["bf16_measured_ms"],
        "fp8_minus_bf16_predicted_ms": val["predicted_ms"] - val["bf16_predicted_ms"],
        "traffic_from": np.where(val["compiled_traffic"], "compiled", "assumed")})
    numbers = cols[4:9]
    out[numbers] = out[numbers].astype(float).round(4)
    return out.sort_values(["hardware", "workload", "recipe", "shape"]).reset_index(drop=True)


def significant(x, digits: int = 4):
    """``x`` (a number or an array) rounded to ``digits`` significant digits, through its
    decimal text, so the same on every machine."""
    if np.ndim(x):
        return np.array([significant(v, digits) for v in np.ravel(x)]).reshape(np.shape(x))
    return float(f"{float(x):.{digits}g}")


def draw_validation(ax, val: pd.DataFrame) -> None:
    """Notebook 06's validation figure on ``ax``: predicted against measured FP8/BF16 speedup
    (:func:`validation_table` rows), the diagonal and a +-10% band, log axes.

    Every number handed to matplotlib is the table's (rounded to 4 decimals) or rounded here to
    4 significant digits, and the diagonal and the band, straight on log axes, are drawn from
    their two ends: nothing drawn comes from arithmetic whose last bits depend on the CPU (the
    fit's least squares; ``np.geomspace``'s logarithms), so the PNG is the same on every
    machine."""
    from repro import plotstyle

    if len(val):
        lo = significant(0.8 * min(val["measured"].min(), val["predicted"].min()))
        hi = significant(1.2 * max(val["measured"].max(), val["predicted"].max()))
        xs = np.array([lo, hi])
        ax.fill_between(xs, significant(xs * 0.9), significant(xs * 1.1), color="0.85",
                        label="+-10%")
        ax.plot(xs, xs, color="0.4", lw=1)
        chips = sorted(val["hardware"].unique())  # a recipe's colour, darker per chip
        for (c, workload, recipe), g in val.groupby(["hardware", "workload", "recipe"]):
            ax.scatter(g["measured"], g["predicted"],
                       label=f"{recipe}, {workload.upper()} ({c})", s=40,
                       color=plotstyle.shade(plotstyle.color(recipe), -0.4 * chips.index(c)),
                       marker="s" if workload == "lm" else "o")
            for r in g.itertuples():
                ax.annotate(r.shape, (r.measured, r.predicted), fontsize=6, xytext=(3, -3),
                            textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
        n_ok = int((val["error"].abs() <= 0.10).sum())
        ax.set_title(f"FP8/BF16 step speedup: {n_ok} of {len(val)} within +-10%\n"
                     "(fit on BF16 steps only)")
        ax.legend(fontsize=7)
    ax.set(xlabel="measured FP8/BF16 speedup (x)", ylabel="predicted FP8/BF16 speedup (x)")


def component_table(records: pd.DataFrame | None, cal: Calibration,
                    recipes: Sequence[str] = ("bf16", *VALIDATED)) -> pd.DataFrame:
    """Where a step's time goes, predicted (:func:`predict` under ``cal``) against traced
    (``kernel_times`` records), per measured shape and recipe that has both a step time and a
    trace on ``cal``'s chip. A diagnosis of the model, not an input to it: FP8 rows are shown.

    Columns (ms per step): ``gemm`` (GEMM and attention kernels; the model counts attention's
    products as GEMMs), ``other`` (every other kernel: elementwise, reductions, copies; the
    model's traffic term) and ``gaps`` (device idle between kernels: the untraced step time
    minus the traced busy time; the model's ``gap_us`` x launches), each ``_pred`` and
    ``_traced``; ``kernels_pred`` (the launches the model counts) and ``kernels_traced``.
    """
    cols = ["workload", "shape", "recipe", "measured_ms", "busy_ms", "gemm_pred", "gemm_traced",
            "other_pred", "other_traced", "gaps_pred", "gaps_traced", "kernels_pred",
            "kernels_traced"]
    slug = cal.hardware.slug
    by = traced_steps(records, slug)
    rows = []
    for r in (step_records(records, slug, list(recipes)).itertuples() if by else []):
        m = by.get(trace_key(r), {}).get(r.recipe)
        if not m or "kernel_ms_per_step" not in m:
            continue
        step = measured_step(r, r.recipe, r.hlo_bytes, r.hlo_kernels)
        p = predict(step, cal)
        busy = m["kernel_ms_per_step"]
        gemm = m.get("gemm_ms_per_step", 0.0) + m.get("attention_ms_per_step", 0.0)
        rows.append((r.workload, label(r), r.recipe, r.measured_ms, busy, p["gemm_s"] * 1e3,
                     gemm, p["traffic_s"] * 1e3, busy - gemm, p["gap_s"] * 1e3,
                     r.measured_ms - busy, step.kernels, m.get("kernels_per_step", np.nan)))
    return pd.DataFrame(rows, columns=cols)
