# %% [markdown]
# # 02 · GEMM roofline: how much faster can 8-bit be, physically?
#
# **Claims A2 and B2.** The seed articles say FP8 RL training on an H100 is "up to 1.6x faster
# than FP16" (A2) and NVFP4 MaxText training "up to 1.6x faster" (B2). A training step is
# mostly matrix products, so the speedup of one low-precision GEMM over BF16/FP16 *at the same
# shape* is the **ceiling** for the speedup of a training step built from such GEMMs:
# quantization passes, launches and everything that is not a GEMM only take away from it.
# Each machine is judged in the 8-bit format it multiplies natively: **FP8 on the H200**,
# **INT8 on the TPU v5e** (which has no FP8 arithmetic; its INT8 datasheet rate is twice its
# BF16 rate), the ceiling of claim C1's INT8 training (notebook 03).
#
# **Method.** `repro.experiments.gemm.measure.gemm_sweep` times `A[M,K] x B[N,K]^T` (the TN
# layout cuBLASLt wants for FP8) in FP32 (`Precision.HIGHEST`), TF32, BF16, FP16, FP8 (E4M3
# operands that are already FP8, fed straight into `dot_general`; on a GPU it asserts that the
# compiled GEMM keeps the f8 operands) and INT8 (symmetric INT8 operands, an `s8 x s8 -> s32`
# product). Median of `repeats` timed calls after warm-up, random normal operands rotated
# between two sets; spread = interquartile range. Every record carries hardware, versions,
# commit, and `emulated`: an 8-bit product the machine has no arithmetic for (FP8 on a TPU v5e
# or a CPU, computed by upcasting) is drawn hollow, labelled "emulated", and never counted as
# a speedup.
#
# The figures and tables show every accelerator with committed full-profile records
# (`results/`), one column per machine, against the datasheet peaks of
# `repro/data/hardware.yaml`; a smoke run records CPU-sized shapes on this machine into
# `build/results/` and draws them into `build/figures/`. Record a GPU with `repro record gemm
# --profile full`.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
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


df = latest(plotstyle.accelerators(nb.records("gemm")))  # speed: a CPU's records left out

IN_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
OUT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2, "int8": 2}  # 8-bit: bf16 out


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


SPEEDUP_COLUMNS = ["hardware", "format", "mkn", "flops", "bf16", "fp16", "8-bit", "over bf16",
                   "over fp16"]


def speedups(tf):
    """Per (hardware, shape): the GEMM of the hardware's own 8-bit format
    (`plotstyle.eight_bit`: FP8 on an H200, INT8 on a TPU v5e) over BF16 and FP16, native
    records of that format only (an emulated one is no speedup)."""
    rows = []
    for h, d in (tf.groupby("hardware") if len(tf) else []):
        fmt = plotstyle.eight_bit(h)
        eight = d[(d.recipe == (fmt or "").lower()) & ~d.emulated.astype(bool)]
        base = d.pivot_table(index="mkn", columns="recipe", values="value")
        for r in eight.itertuples():
            bf16, fp16 = (base[b].get(r.mkn, np.nan) if b in base else np.nan
                          for b in ("bf16", "fp16"))
            rows.append({"hardware": h, "format": fmt, "mkn": r.mkn, "flops": r.flops,
                         "bf16": bf16, "fp16": fp16, "8-bit": r.value,
                         "over bf16": r.value / bf16, "over fp16": r.value / fp16})
    out = pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)
    return out.dropna(subset=["over bf16"]).sort_values(["hardware", "flops"])


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
# ## Roofline per hardware, and the 8-bit speedup per shape
#
# One column per machine, titled with the 8-bit format it multiplies natively. Top: measured
# TFLOP/s against arithmetic intensity, with the datasheet roof min(peak, intensity x
# bandwidth) per dtype (dashed); error bars span the interquartile range of the timed repeats;
# hollow: an emulated product (no such arithmetic on that machine), not a speed. Bottom: that
# machine's 8-bit GEMM (FP8 on the H200, INT8 on the TPU v5e) over BF16 and FP16 at the same
# shape, native records only: the ceiling for a training step built from such GEMMs. A
# machine with no native 8-bit record says so in words instead of a bar.

# %%
COLORS = plotstyle.palette(bench.GEMM_DTYPES)


def plot_roofline(tf, sp):
    hws = plotstyle.hardware_order(tf.hardware) if len(tf) else []
    fig = plt.figure(figsize=(max(12, 6.5 * max(len(hws), 1)), 10))
    gs = fig.add_gridspec(2, 1, height_ratios=[1.05, 1])
    roofs = gs[0].subgridspec(1, max(len(hws), 1))
    # a bar panel's width follows its number of shapes: one machine's few cells stay readable
    widths = [max(len(sp[sp.hardware == h]) if len(sp) else 0, 3) for h in hws] or [1]
    bars = gs[1].subgridspec(1, max(len(hws), 1), width_ratios=widths)
    for j, h in enumerate(hws):
        ax = fig.add_subplot(roofs[0, j])
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
               ylabel="throughput (TFLOP/s)", title=plotstyle.hardware_title(h))
        drawn = [r for r in bench.GEMM_DTYPES if (d.recipe == r).any()]
        handles = [Line2D([], [], marker=plotstyle.style(r)["marker"], ls="", color=COLORS[r],
                          mfc="none" if d[d.recipe == r].emulated.all() else COLORS[r],
                          label=r + (f" ({plotstyle.EMULATED})"
                                     if d[d.recipe == r].emulated.all() else ""))
                   for r in drawn]
        handles += [Line2D([], [], ls="--", color=COLORS[r], label=f"{r}: datasheet roof only")
                    for r in bench.GEMM_DTYPES if r not in drawn and peak(h, r)]
        handles.append(Line2D([], [], ls="--", color="grey", label="datasheet roof"))
        ax.legend(handles=handles, loc="upper left", fontsize=7)  # above the roof: empty
        ax = fig.add_subplot(bars[0, j])
        g = sp[sp.hardware == h] if len(sp) else sp
        fmt = plotstyle.eight_bit(h)
        if not len(g):  # no native 8-bit GEMM here: said in words, never a blank axis
            emulated = sorted(d[d.emulated].recipe.str.upper().unique())
            ax.axis("off")
            ax.text(0.5, 0.5, f"{plotstyle.hardware_name(h)}: no native "
                    f"{fmt or '8-bit'} GEMM record"
                    + (f"\n({', '.join(emulated)} there is emulated: not a speed)"
                       if emulated else ""), ha="center", va="center", color="0.3",
                    transform=ax.transAxes)
            ax.set_title(f"{plotstyle.hardware_title(h)}\n8-bit GEMM over BF16 and FP16")
            continue
        x = np.arange(len(g))
        for k, base in enumerate(("bf16", "fp16")):
            ax.bar(x + (k - 0.5) * 0.4, g[f"over {base}"], width=0.4,
                   color=plotstyle.color(base), label=f"{fmt}/{base.upper()}")
        if (p8 := peak(h, fmt.lower())) and peak(h, "bf16"):
            ax.axhline(p8 / peak(h, "bf16"), color="black", ls="--", lw=1,
                       label=f"datasheet {fmt}/BF16")
        if fmt == "FP8":
            ax.axhline(1.6, color="crimson", ls=":", lw=1.5, label="claimed 1.6x (A2, B2)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(x, g.mkn, rotation=30, ha="right")
        ax.set(ylabel=f"{fmt} GEMM speedup (x)", xlabel="GEMM shape M x K x N (by FLOPs)",
               title=f"{plotstyle.hardware_title(h)}\n{fmt} over BF16 and FP16, same shape")
        ax.legend(ncol=2, loc="upper left", fontsize=7)
    return fig


nb.save(plot_roofline(tf, sp), "02_gemm_roofline", df)
nb.metrics(**{h: {f"{g.format.iloc[0].lower()}_bf16_max": g["over bf16"].max(),
                  f"{g.format.iloc[0].lower()}_fp16_max": g["over fp16"].max()}
              for h, g in (sp.groupby("hardware") if len(sp) else [])})
sp.drop(columns="flops").round(2) if len(sp) else "no native 8-bit GEMM records"

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
# GEMMs need FP4 tensor cores, which no recorded hardware has), and on a machine whose 8-bit
# arithmetic is INT8 the ceiling of claim C1's INT8 training, computed from the records:

# %%
lines = []
for h in (plotstyle.hardware_order(tf.hardware) if len(tf) else []):
    g, fmt = sp[sp.hardware == h] if len(sp) else sp, plotstyle.eight_bit(h)
    name = plotstyle.hardware_name(h)
    if not len(g):
        emulated = sorted(tf[(tf.hardware == h) & tf.emulated].recipe.str.upper().unique())
        lines.append(f"- {name}: no native {fmt or '8-bit'} GEMM record"
                     + (f" ({', '.join(emulated)} there is emulated: no speedup)"
                        if emulated else "") + ".")
        continue
    best = g.loc[g["over bf16"].idxmax()]
    text = (f"- {name}: the {fmt} GEMM reaches up to {g['over bf16'].max():.2f}x BF16 "
            f"(at {best.mkn})")
    if g["over fp16"].notna().any():
        text += f" and {g['over fp16'].max():.2f}x FP16"
    if fmt == "FP8" and g["over fp16"].notna().any():  # the claims' 1.6x is FP8's
        over = g[g["over fp16"] >= 1.6].mkn.tolist()
        text += (f"; 1.6x FP16 or more at {len(over)} of {len(g)} shapes "
                 f"({', '.join(over) or 'none'})")
    if (p8 := peak(h, fmt.lower())) and peak(h, "bf16"):
        text += f"; its datasheet {fmt}/BF16 ratio is {p8 / peak(h, 'bf16'):.2f}x"
    lines.append(text + ".")
fp4 = [h for h in tf.hardware.unique() if (e := registry_entry(h)) and e.has_fp4]
why = "this sweep has no NVFP4 dtype" if fp4 else "no recorded hardware has FP4 tensor cores"
lines.append(f"- NVFP4 GEMMs: no record ({why}); notebook 06 projects them.")
Markdown("\n".join(lines))
