# %% [markdown]
# # 02 · GEMM roofline: how much faster can FP8 be, physically?
#
# **Claims A2 and B2.** The seed articles say FP8 RL training on an H100 is "up to 1.6x faster
# than FP16" (A2) and NVFP4 MaxText training "up to 1.6x faster" (B2). A training step is
# mostly matrix products, so the speedup of one low-precision GEMM over BF16/FP16 *at the same
# shape* is the **ceiling** for the speedup of a training step built from such GEMMs:
# quantization passes, launches and everything that is not a GEMM only take away from it.
#
# **Method.** `repro.experiments.gemm.measure.gemm_sweep` times `A[M,K] x B[N,K]^T` (the TN
# layout cuBLASLt wants for FP8) in FP32 (`Precision.HIGHEST`), TF32, BF16, FP16 and FP8 (E4M3
# operands that are already FP8, fed straight into `dot_general`; on a GPU it asserts that the
# compiled GEMM keeps the f8 operands). Median of `repeats` timed calls after warm-up, random
# normal operands rotated between two sets; spread = interquartile range. Every record carries
# hardware, versions, commit, and `emulated` (FP8 on a CPU is computed by upcasting: never a
# speedup).
#
# The figures and tables show every hardware with committed full-profile records (`results/`)
# against the datasheet peaks of `repro/data/hardware.yaml`; a smoke run records CPU-sized
# shapes on this machine into `build/results/` and draws them into `build/figures/`. Record a
# GPU with `repro record gemm --profile full`.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import Markdown
from matplotlib.lines import Line2D

from repro import hardware, notebook, plotstyle
from repro.experiments.gemm import measure as bench

nb = notebook.start("02_gemm_roofline", "gemm", profile, scratch)
if nb.profile == "smoke":  # full-profile records: `repro record` on a GPU
    nb.record_smoke("gemm")


def latest(df):
    """One record per (hardware, shape, dtype, metric): the last one."""
    df = df.assign(mkn=df.size_M.astype(int).astype(str) + "x" + df.size_K.astype(int)
                   .astype(str) + "x" + df.size_N.astype(int).astype(str))
    return df.sort_values("timestamp").drop_duplicates(["hardware", "mkn", "recipe", "metric"],
                                                       keep="last")


df = latest(nb.records("gemm"))

IN_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
OUT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}  # fp8 GEMM writes bf16


def registry_entry(slug):
    return hardware.lookup(slug) if slug in hardware.registry() else None


def peak(slug, dtype):
    e = registry_entry(slug)
    return None if e is None else e.peak_tflops.get(dtype)


def rates(df):
    """TFLOP/s records with FLOPs, bytes, arithmetic intensity and the datasheet roof."""
    tf = df[df.metric == "tflops"].copy() if len(df) else pd.DataFrame(
        columns=["hardware", "recipe", "value", "emulated", "size_M", "size_K", "size_N"])
    m, k, n = (tf[c].astype(float) for c in ("size_M", "size_K", "size_N"))
    tf["flops"] = 2 * m * k * n
    tf["bytes"] = (m * k + n * k) * tf.recipe.map(IN_BYTES) + m * n * tf.recipe.map(OUT_BYTES)
    tf["intensity"] = tf.flops / tf.bytes  # FLOP per byte of operands + result
    tf["peak"] = [peak(h, r) for h, r in zip(tf.hardware, tf.recipe)]
    tf["fraction_of_peak"] = tf.value / tf.peak.astype(float)
    return tf


def speedups(tf):
    """FP8 over BF16 and FP16 per (hardware, shape), native FP8 records only."""
    if not len(tf):
        return pd.DataFrame(columns=["hardware", "mkn", "flops", "fp8/bf16", "fp8/fp16"])
    wide = tf.pivot_table(index=["hardware", "mkn", "flops"], columns="recipe",
                          values="value").reset_index()
    emu = tf[tf.recipe == "fp8"].set_index(["hardware", "mkn"]).emulated
    wide = wide[[not bool(emu.get((h, s), True)) for h, s in zip(wide.hardware, wide.mkn)]]
    for base in ("bf16", "fp16"):
        wide[f"fp8/{base}"] = wide.get("fp8") / wide.get(base)
    return wide.dropna(subset=["fp8/bf16"]).sort_values(["hardware", "flops"])


tf = rates(df)
sp = speedups(tf)
(tf.pivot_table(index=["hardware", "mkn"], columns="recipe", values="value", sort=False)
 .round(1).reindex(columns=list(bench.GEMM_DTYPES)) if len(tf) else "no committed records")

# %% [markdown]
# Fraction of the datasheet dense peak reached (native records of GPUs in the registry; the
# peaks are vendors' numbers at boost clock):

# %%
real = tf[~tf.emulated & tf.peak.notna()] if len(tf) else tf
(real.pivot_table(index=["hardware", "mkn"], columns="recipe", values="fraction_of_peak",
                  sort=False).round(2).reindex(columns=list(bench.GEMM_DTYPES))
 if len(real) else "no native records")

# %% [markdown]
# ## Roofline per hardware, and the FP8 speedup per shape
#
# Top: measured TFLOP/s against arithmetic intensity, with the datasheet roof min(peak,
# intensity x bandwidth) per dtype (dashed); error bars span the interquartile range of the timed
# repeats. Bottom: FP8 over BF16 and FP16 at the same shape
# (native FP8 only), the ceiling for a training step built from such GEMMs.

# %%
COLORS = plotstyle.palette(bench.GEMM_DTYPES)


def plot_roofline(tf, sp):
    hws = sorted(tf.hardware.unique(), key=lambda h: (peak(h, "bf16") is None, h))
    fig = plt.figure(figsize=(max(12, 4.6 * max(len(hws), 1)), 10))
    gs = fig.add_gridspec(2, max(len(hws), 1), height_ratios=[1.05, 1])
    for j, h in enumerate(hws):
        ax = fig.add_subplot(gs[0, j])
        d, e = tf[tf.hardware == h], registry_entry(h)
        xs = np.logspace(np.log10(max(d.intensity.min() / 2, 0.1)),
                         np.log10(d.intensity.max() * 2), 100)
        for r in bench.GEMM_DTYPES:
            dr = d[d.recipe == r]
            half = dr.spread.fillna(0).astype(float) / 2  # the repeats' interquartile range
            ax.errorbar(dr.intensity, dr.value, yerr=[half, half], fmt="none",
                        ecolor=COLORS[r], elinewidth=1, capsize=2, zorder=2)
            ax.scatter(dr.intensity, dr.value, edgecolors=COLORS[r], s=36, zorder=3,
                       marker=plotstyle.style(r)["marker"],
                       facecolors=["none" if x else COLORS[r] for x in dr.emulated])
            if (p := peak(h, r)) is not None and e.memory_bandwidth_tbs:
                ax.plot(xs, np.minimum(p, xs * e.memory_bandwidth_tbs), color=COLORS[r], lw=1,
                        ls="--", alpha=0.8)
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
               ylabel="throughput (TFLOP/s)", title=h if e is None else e.name)
    handles = [Line2D([], [], marker=plotstyle.style(r)["marker"], ls="", color=COLORS[r],
                      label=r)
               for r in bench.GEMM_DTYPES]
    handles += [Line2D([], [], ls="--", color="grey", label="datasheet roof"),
                Line2D([], [], marker="o", ls="", mfc="none", color="grey",
                       label="emulated (not an FP8 GEMM)")]
    if fig.axes:
        fig.axes[0].legend(handles=handles, loc="upper left")  # above the roof: always empty
    ax = fig.add_subplot(gs[1, :])
    if len(sp):
        long = sp.melt(id_vars=["hardware", "mkn", "flops"], value_vars=["fp8/bf16", "fp8/fp16"],
                       var_name="ratio", value_name="speedup")
        long["label"] = long.hardware + ", " + long.ratio.str.upper()
        hws = list(dict.fromkeys(long.hardware))  # a baseline's colour, lighter per hardware
        colours = {lab: plotstyle.shade(plotstyle.color(r.split("/")[1]), 0.45 * hws.index(h))
                   for lab, h, r in zip(long.label, long.hardware, long.ratio)}
        sns.barplot(data=long, x="mkn", y="speedup", hue="label", ax=ax, palette=colours,
                    order=list(dict.fromkeys(sp.sort_values("flops").mkn)))
        for h in sp.hardware.unique():
            if peak(h, "fp8") and peak(h, "bf16"):
                ax.axhline(peak(h, "fp8") / peak(h, "bf16"), color="black", ls="--", lw=1,
                           label=f"datasheet FP8/BF16 ({h})")
        ax.axhline(1.6, color="crimson", ls=":", lw=1.5, label="claimed 1.6x (A2, B2)")
        ax.tick_params(axis="x", rotation=30)
        ax.legend(ncol=3, loc="upper left")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(ylabel="FP8 GEMM speedup (x)", xlabel="GEMM shape M x K x N (sorted by FLOPs)",
           title="FP8 over BF16 and FP16 at the same shape (native FP8 records only)")
    return fig


nb.save(plot_roofline(tf, sp), "02_gemm_roofline", df)
nb.metrics(**{h: {"fp8_bf16_max": g["fp8/bf16"].max(), "fp8_fp16_max": g["fp8/fp16"].max()}
              for h, g in (sp.groupby("hardware") if len(sp) else [])})
sp[["hardware", "mkn", "bf16", "fp16", "fp8", "fp8/bf16", "fp8/fp16"]].round(2) if len(sp) \
    else "no native FP8 GEMM records"

# %% [markdown]
# ## Relative error of one GEMM against float64
#
# On a 256 x 256 x 256 product of random normal operands: `value` against the float64 product
# of the original operands; `same operands` against the float64 product of the operands as
# rounded (accumulation and output rounding only).

# %%
err = df[df.metric == "rel_error"].copy() if len(df) else df
(err.assign(**{"same operands": err.extra.map(lambda e: e.get("rel_error_same_operands"))})
 .pivot_table(index="recipe", columns="hardware", values=["value", "same operands"])
 .reindex(list(bench.GEMM_DTYPES)) if len(err) else "no error records")

# %% [markdown]
# ## Pipeline check (smoke profile)
#
# A smoke run times CPU-sized shapes on this machine (FP8 emulated) and draws them into
# `build/figures/`: a check that the sweep runs, not a speed.

# %%
if nb.profile == "smoke":
    smoke = latest(nb.smoke_records("gemm"))
    nb.save(plot_roofline(rates(smoke), speedups(rates(smoke))), "02_gemm_roofline", smoke)

# %% [markdown]
# ## Conclusion
#
# The GEMM ceiling of claims A2 (FP8 against FP16, "up to 1.6x") and B2 (NVFP4's 1.6x, whose
# GEMMs need FP4 tensor cores, which no recorded hardware has), computed from the records:

# %%
lines = []
for h, g in sp.groupby("hardware"):
    best = g.loc[g["fp8/fp16"].idxmax()]
    over = g[g["fp8/fp16"] >= 1.6].mkn.tolist()
    lines.append(f"- {h}: the FP8 GEMM reaches up to {g['fp8/bf16'].max():.2f}x BF16 and "
                 f"{g['fp8/fp16'].max():.2f}x FP16 (at {best.mkn}); 1.6x FP16 or more at "
                 f"{len(over)} of {len(g)} shapes ({', '.join(over) or 'none'}).")
fp4 = [h for h in tf.hardware.unique() if (e := registry_entry(h)) and e.has_fp4]
why = "this sweep has no NVFP4 dtype" if fp4 else "no recorded hardware has FP4 tensor cores"
lines.append(f"- NVFP4 GEMMs: no record ({why}); notebook 06 projects them.")
Markdown("\n".join(lines))
