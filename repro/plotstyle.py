"""One look for every figure: a colour, marker and line style per precision name.

Every notebook draws the same recipe in the same colour, so a reader who learned that
fp8-delayed is vermillion in one figure can read it in the next without its legend. Colours
come from seaborn's colour-blind-safe palette (``sns.color_palette("colorblind")``); a
recipe family shares a hue and its variants are lighter or darker shades of it with their
own marker (all filled: seaborn refuses to mix filled and line markers in one plot). The references (fp32, tf32, bf16, fp16) are drawn dashed or dotted, the FP8 and
FP4 recipes solid.

Names cover the recipe registry (:data:`repro.precision.recipes.REGISTRY`), the inference
formats (:data:`repro.precision.export.FORMATS`), the GEMM dtypes, the element formats
(E4M3, E5M2, E2M1, MXFP8, NVFP4) and the GRPO arms; an unknown name gets a fixed colour
derived from its text (a variant such as ``fp8-current:margin=1`` a shade of its recipe's)::

    ax.plot(x, y, label=name, **plotstyle.style(name))
    sns.lineplot(..., hue="recipe", palette=plotstyle.palette(df.recipe))

Machines are named the same way everywhere too: a figure that compares hardware draws one
panel per machine (:func:`hardware_order`), titled with its short name and the 8-bit format
it multiplies natively (:func:`hardware_title`: "H200 (8-bit: FP8)", "TPU v5e (8-bit:
INT8)"); a number of a format the machine emulated is drawn hollow and labelled
:data:`EMULATED`, never as a speed.
"""

from __future__ import annotations

import zlib

import seaborn as sns

_CB = dict(zip(["blue", "orange", "green", "vermillion", "pink", "brown", "rose", "grey",
                "yellow", "sky"], sns.color_palette("colorblind").as_hex()))


def shade(hex_colour: str, t: float) -> str:
    """``hex_colour`` mixed toward white (``t`` > 0) or black (``t`` < 0) by ``|t|``."""
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    rgb = [c + (1 - c) * t if t > 0 else c * (1 + t) for c in rgb]
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgb)


# name: (hue, shade, marker, line style). Families share a hue; references are not solid.
_TABLE: dict[str, tuple[str, float, str, str]] = {
    # references
    "fp32": ("grey", -0.45, "s", ":"),
    "tf32": ("grey", 0.0, "D", ":"),
    "bf16": ("blue", 0.0, "o", "--"),
    "fp16": ("sky", 0.0, "^", "--"),
    "bf16w-kahan": ("blue", -0.45, "s", "--"),
    "bf16w-nokahan": ("blue", 0.45, "X", "--"),
    # FP8 recipes: current scaling green, delayed scaling vermillion, end to end pink
    "fp8-current": ("green", 0.0, "o", "-"),
    "fp8-auto": ("green", -0.35, "P", "-"),
    "fp8-lean": ("green", 0.45, "v", "-"),
    "te-fp8-current": ("green", -0.6, "^", "-."),
    "fp8-delayed": ("vermillion", 0.0, "o", "-"),
    "fp8-all-layers": ("vermillion", -0.4, "v", "-"),
    "fp8-noscale": ("vermillion", 0.45, "X", "-"),
    "fp8-e2e": ("pink", 0.0, "o", "-"),
    "fp8-e2e-nokahan": ("pink", -0.4, "X", "-"),
    "fp8-e2e-nogradclip": ("pink", 0.35, "v", "-"),
    "fp8-e2e-noweightclip": ("pink", -0.2, "D", "-"),
    "flax-fp8": ("yellow", -0.45, "s", "-."),
    "mxfp8": ("brown", 0.0, "o", "-"),
    "te-mxfp8": ("brown", -0.45, "^", "-."),
    "fp8-block": ("brown", 0.5, "D", "-"),
    # FP4 recipes: orange
    "nvfp4": ("orange", 0.0, "o", "-"),
    "nvfp4-no-rht": ("orange", -0.55, "X", "-"),
    "nvfp4-no-sr": ("orange", -0.3, "v", "-"),
    "nvfp4-1d-weights": ("orange", 0.3, "D", "-"),
    "nvfp4-all-layers": ("orange", 0.55, "s", "-"),
    "nvfp4-mlp-only": ("rose", -0.2, "P", "-"),
    "jax-nvfp4": ("orange", -0.75, "^", "-."),
    # INT8 recipes: rose (int8 itself is named with the inference formats below)
    "int8-auto": ("rose", 0.45, "P", "-"),
    # GEMM dtypes and inference formats (those not named above)
    "fp8": ("green", -0.45, "o", "-"),
    "fp8-tensor": ("green", 0.4, "s", "-"),
    "fp8-w": ("brown", 0.35, "X", "-"),
    "int8": ("rose", -0.45, "o", "-"),
    "int8-w": ("rose", 0.0, "X", "-"),
    "nvfp4-w": ("orange", -0.15, "X", "-"),
    # element formats
    "e4m3": ("green", 0.0, "o", "-"),
    "e5m2": ("sky", -0.3, "s", "-"),
    "e2m1": ("orange", 0.3, "v", "-"),
    # GRPO arms
    "bf16-e2e": ("blue", 0.0, "o", "--"),
    "fp8-rollout": ("vermillion", 0.0, "s", "-"),
    "fp8-e2e-no-is": ("pink", 0.4, "X", "-"),
    "fp8-e2e-block": ("brown", -0.7, "P", "-"),
}
_FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def _entry(name: str) -> tuple[str, str, str]:
    key = str(name).strip().lower()
    if key in _TABLE:
        hue, t, marker, ls = _TABLE[key]
        return shade(_CB[hue], t), marker, ls
    h = zlib.crc32(key.encode())
    t = ((h >> 8) % 5 - 2) * 0.2  # one of -0.4 .. 0.4
    known = [k for k in _TABLE if key.startswith(k) and not key[len(k):len(k) + 1].isalnum()]
    if known:  # a variant of a known recipe: a shade of its colour, its line style
        hue, base_t, _, ls = _TABLE[max(known, key=len)]
        return (shade(_CB[hue], max(-0.8, min(0.8, base_t + (t or 0.2)))),
                _FALLBACK_MARKERS[h % len(_FALLBACK_MARKERS)], ls)
    hue = list(_CB)[h % len(_CB)]
    return shade(_CB[hue], t), _FALLBACK_MARKERS[(h >> 4) % len(_FALLBACK_MARKERS)], "-"


def color(name: str) -> str:
    """The colour (``#rrggbb``) of a recipe, format or arm ``name``; the same on every call."""
    return _entry(name)[0]


def style(name: str, line: bool = True) -> dict[str, str]:
    """Keyword arguments for ``ax.plot``: ``name``'s colour, marker and (``line``) line style."""
    c, marker, ls = _entry(name)
    return dict(color=c, marker=marker, ls=ls) if line else dict(color=c, marker=marker)


def palette(names) -> dict[str, str]:
    """``{name: colour}`` for the distinct ``names``: a seaborn ``palette=`` argument."""
    return {n: color(n) for n in dict.fromkeys(names)}


def markers(names) -> dict[str, str]:
    """``{name: marker}`` for the distinct ``names``: a seaborn ``markers=`` argument."""
    return {n: _entry(n)[1] for n in dict.fromkeys(names)}


# --- hardware: one panel per machine, named with its 8-bit format --------------------------

#: how a figure names a machine's 8-bit format where it has none (a CPU: products upcast)
NO_EIGHT_BIT = "no 8-bit arithmetic: emulated"
#: the legend words of a number measured where its format was emulated: never a speed
EMULATED = "emulated: not a speed"


def hardware_name(slug: str) -> str:
    """A machine's short name from ``repro/data/hardware.yaml`` (``h200`` -> "H200",
    ``tpu-v5e`` -> "TPU v5e", ``cpu`` -> "CPU"): the vendor's name less its maker and any
    parenthesis; an unknown slug as it is."""
    from repro import hardware

    if slug not in hardware.registry():
        return str(slug)
    name = hardware.lookup(slug).name.split(" (")[0]
    return name.removeprefix("NVIDIA ").removeprefix("Google ")


def eight_bit(slug: str) -> str | None:
    """The 8-bit format a machine trains in natively: "FP8" where it has FP8 arithmetic (an
    H200), else "INT8" where it has INT8 matrix units (a TPU v5e), else None (a CPU, an
    unknown machine: any 8-bit number there is emulated)."""
    from repro import hardware

    if slug not in hardware.registry():
        return None
    info = hardware.lookup(slug)
    return "FP8" if info.has_fp8 else "INT8" if info.has_int8 else None


def hardware_title(slug: str) -> str:
    """A panel's name for a machine with its 8-bit format: "H200 (8-bit: FP8)", "TPU v5e
    (8-bit: INT8)", "CPU (no 8-bit arithmetic: emulated)"; a machine not in the registry
    "(8-bit format unknown)"."""
    from repro import hardware

    fmt = eight_bit(slug)
    what = (f"8-bit: {fmt}" if fmt else NO_EIGHT_BIT if slug in hardware.registry()
            else "8-bit format unknown")
    return f"{hardware_name(slug)} ({what})"


def format_of(name: str) -> str | None:
    """The 8-bit format of a recipe, GEMM dtype or inference format: "FP8" (``fp8-delayed``,
    ``flax-fp8``, ``mxfp8``, ``fp8-w``), "INT8" (``int8``, ``int8-auto``, ``int8-w``), else
    None (a 16- or 32-bit reference, NVFP4)."""
    key = str(name).lower()
    return "FP8" if "fp8" in key else "INT8" if "int8" in key else None


def hardware_order(slugs) -> list[str]:
    """The distinct ``slugs`` in panel order: GPUs, then TPUs, then CPUs and unknown
    machines, each by name."""
    from repro import hardware

    rank = {"gpu": 0, "tpu": 1}
    known = hardware.registry()
    return sorted(dict.fromkeys(slugs), key=lambda s: (
        rank.get(hardware.lookup(s).backend, 2) if s in known else 3, str(s)))


def accelerators(df):
    """The rows of ``df`` not recorded on a CPU: a speed figure's (a CPU's full-profile
    records count for quality only)."""
    from repro import hardware

    if not len(df) or "hardware" not in df:
        return df
    known = hardware.registry()
    cpu = [s for s in df["hardware"].unique()
           if s in known and hardware.lookup(s).backend == "cpu"]
    return df[~df["hardware"].isin(cpu)]


#: the fewest seeds a band is drawn from: with fewer, a t-interval is wider than it says
#: (two seeds: 12.7 standard errors), so the seeds themselves are drawn instead
MIN_BAND_SEEDS = 3


def seed_band(ax, x, runs, color: str, bounds: tuple[float, float] | None = None, **line):
    """Draw the mean over seeds of ``runs`` (one row per seed, NaN where a seed has no value)
    against ``x`` as a line in ``color`` (``line``: more ``ax.plot`` arguments) and the 95%
    t-interval of that mean as a band around it, cut to ``bounds`` (the metric's range, e.g.
    (0, 1) for an accuracy: :func:`bounded` marks the axis). With fewer than
    :data:`MIN_BAND_SEEDS` seeds each seed is drawn as a thin line instead of a band. Returns
    the mean's line."""
    import warnings

    import numpy as np
    from scipy.stats import t as student_t

    runs = np.atleast_2d(np.asarray(runs, float))
    n = np.sum(~np.isnan(runs), axis=0)
    with warnings.catch_warnings():  # a step no seed reached stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(runs, axis=0)
        half = (student_t.ppf(0.975, np.maximum(n - 1, 1)) * np.nanstd(runs, axis=0, ddof=1)
                / np.sqrt(n))
    out, = ax.plot(x, mean, color=color, **line)
    if bounds is not None:
        bounded(ax, "y", *bounds)
    if len(runs) >= MIN_BAND_SEEDS:
        lo, hi = mean - half, mean + half
        if bounds is not None:
            lo, hi = np.clip(lo, *bounds), np.clip(hi, *bounds)
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
    elif len(runs) > 1:
        for run in runs:
            ax.plot(x, run, color=color, lw=0.7, alpha=0.5, ls=line.get("ls", "-"))
    return out


def bounded(ax, axis: str, low: float, high: float) -> None:
    """Mark ``ax``'s ``axis`` ("x" or "y") as a metric bounded to [low, high] (a probability,
    an accuracy): its limits stay inside, and the figure's plotted data says so, for the test
    that no band leaves the metric's range (:func:`plotted`)."""
    pad = 0.02 * (high - low)
    getattr(ax, f"set_{axis}lim")(low - pad, high + pad)
    ax._repro_bounds = {**getattr(ax, "_repro_bounds", {}), axis: [low, high]}


def _round(x: float) -> float | None:
    import math

    return float(f"{x:.4g}") if math.isfinite(x) else None


def _extent(values) -> list | None:
    import numpy as np

    try:
        v = np.asarray(values, float).ravel()
    except (TypeError, ValueError):  # categories (text): no extent
        return None
    v = v[np.isfinite(v)]
    return [_round(v.min()), _round(v.max())] if len(v) else None


def plotted(fig) -> list[dict]:
    """What each axes of ``fig`` draws, in data coordinates: its title, labels, the bounds
    :func:`bounded` declared, and per drawn series its kind (``line``, ``band``, ``points``,
    ``bars``, ``segments``), label, point count and the extent of its x and y values (4
    significant digits). An axes that shows only text (``axis("off")``) says ``"text": true``.
    :meth:`repro.notebook.Notebook.save` writes it into the PNG; tests read it back."""
    from matplotlib.collections import LineCollection, PolyCollection

    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        series = []
        for ln in ax.lines:  # reference lines (axhline...) are not in data coordinates
            if ln.get_transform() is not ax.transData:
                continue
            xy = ln.get_xydata()  # in the axes' units (categories as their positions)
            if len(xy):
                series.append({"kind": "line", "label": ln.get_label(), "n": len(xy),
                               "x": _extent(xy[:, 0]), "y": _extent(xy[:, 1])})
        for c in ax.collections:
            if isinstance(c, PolyCollection):
                pts = [v for p in c.get_paths() for v in p.vertices]
                kind = "band"
            elif isinstance(c, LineCollection):
                pts = [v for seg in c.get_segments() for v in seg]
                kind = "segments"
            else:
                pts = list(c.get_offsets())
                kind = "points"
            if len(pts):
                xs, ys = zip(*[(p[0], p[1]) for p in pts])
                series.append({"kind": kind, "label": c.get_label(), "n": len(pts),
                               "x": _extent(xs), "y": _extent(ys)})
        bars = [p for p in ax.patches if p.get_data_transform() is ax.transData
                and hasattr(p, "get_height")]
        if bars:
            series.append({"kind": "bars", "label": "", "n": len(bars),
                           "x": _extent([b.get_x() for b in bars] + [b.get_x() + b.get_width()
                                                                     for b in bars]),
                           "y": _extent([b.get_y() for b in bars] + [b.get_y() + b.get_height()
                                                                     for b in bars])})
        if ax.images:
            series.append({"kind": "image", "label": "", "n": len(ax.images)})
        out.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(),
                    "ylabel": ax.get_ylabel(), "text": not ax.axison,
                    "bounds": getattr(ax, "_repro_bounds", {}),
                    "series": [x for x in series if x["n"]]})
    return out


def use() -> None:
    """Seaborn's white-grid theme with the colour-blind palette as the default cycle."""
    sns.set_theme(style="whitegrid", palette="colorblind", rc={
        "figure.dpi": 100, "figure.constrained_layout.use": True, "grid.alpha": 0.5,
        "axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8,
        "legend.fontsize": 8, "axes.spines.top": False, "axes.spines.right": False})
