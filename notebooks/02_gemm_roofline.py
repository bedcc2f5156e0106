# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · GEMM roofline: how much faster can FP8 be, physically?
#
# **Claims A2 and B2.** The seed articles say FP8 RL training on an H100 is "up to 1.6x faster
# than FP16" (A2) and NVFP4 MaxText training "up to 1.6x faster" (B2). A training step is
# mostly matrix products, so the speedup of one low-precision GEMM over BF16/FP16 *at the same
# shape* is the **ceiling** for the speedup of a training step built from such GEMMs:
# quantization passes, launches and everything that is not a GEMM only take away from it.
#
# **Method.** `repro.studies.gemm.gemm_sweep` times `A[M,K] x B[N,K]^T` (the TN layout cuBLASLt wants
# for FP8) in FP32 (`Precision.HIGHEST`), TF32, BF16, FP16 and FP8 (E4M3 operands that are
# already FP8, fed straight into `dot_general`; on a GPU it asserts that the compiled GEMM keeps
# the f8 operands). Median of `repeats` timed calls after warm-up, random normal operands
# rotated between two sets; spread = interquartile range. Every record carries hardware,
# versions, commit, and `emulated` (FP8 on a CPU is computed by upcasting: never a speedup).
#
# This notebook records this machine's sweep (smoke: CPU-sized shapes into `build/results/`;
# full on a GPU: the study, into `results/`), then plots **all** recorded hardware against the
# datasheet peaks of `repro/data/hardware.yaml`.
#
# Regenerate: `dvc repro gemm_roofline`; record a GPU: `repro record gemm --profile full`.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook a fresh folder)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from repro.studies import gemm as bench
from repro import config, hardware, results, studies

P = config.stage_params("gemm", profile)
results.use_scratch(scratch)
HW = hardware.detect()
sns.set_theme(style="whitegrid", context="notebook")
pd.set_option("display.width", 160)
print(f"profile={P['profile']}  this machine: {HW.slug} ({HW.name})")

# %% [markdown]
# ## Record this machine's sweep
#
# Resumable: finished cells (one per shape) are skipped. A full-profile sweep on a CPU would take
# hours for nothing, so on a CPU only the smoke sweep runs.

# %%
if P["profile"] == "smoke" or HW.backend == "gpu":
    written = studies.record("gemm", P["profile"]).written
    print(f"recorded {len(written)} new cell(s)")
else:
    print("full profile on a CPU: not recording, plotting the committed records only")

# %% [markdown]
# ## All records, every hardware
#
# `results/<hardware>/gemm/` holds committed full-profile sweeps; `build/results/` this machine's
# smoke sweep. Where one hardware has both, the full-profile record of a cell wins.

# %%
df = results.load_records("gemm")
df["mkn"] = (df.size_M.astype(int).astype(str) + "x" + df.size_K.astype(int).astype(str)
               + "x" + df.size_N.astype(int).astype(str))
df["_full"] = df.profile.eq("full")
df = (df.sort_values(["_full", "timestamp"])
      .drop_duplicates(["hardware", "mkn", "recipe", "metric"], keep="last"))

IN_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
OUT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}  # fp8 GEMM writes bf16


def registry_entry(slug):
    return hardware.lookup(slug) if slug in hardware.registry() else None


def peak(slug, dtype):
    e = registry_entry(slug)
    return None if e is None else e.peak_tflops.get(dtype)


tf = df[df.metric == "tflops"].copy()
m, k, n = (tf[c].astype(float) for c in ("size_M", "size_K", "size_N"))
tf["flops"] = 2 * m * k * n
tf["bytes"] = ((m * k + n * k) * tf.recipe.map(IN_BYTES) + m * n * tf.recipe.map(OUT_BYTES))
tf["intensity"] = tf.flops / tf.bytes  # FLOP per byte of operands + result
tf["peak"] = [peak(h, r) for h, r in zip(tf.hardware, tf.recipe)]
tf["bandwidth"] = [getattr(registry_entry(h), "memory_bandwidth_tbs", None) for h in tf.hardware]
tf["roof"] = [np.nan if p is None or b is None else min(p, i * b)
              for p, b, i in zip(tf.peak, tf.bandwidth, tf.intensity)]
tf["fraction_of_peak"] = tf.value / tf.peak.astype(float)
tf["fraction_of_roof"] = tf.value / tf.roof
HARDWARE = sorted(tf.hardware.unique(), key=lambda h: (peak(h, "bf16") is None, h))
print("hardware with gemm records:", ", ".join(
    f"{h} ({', '.join(sorted(tf[tf.hardware == h].profile.dropna().unique()))})" for h in HARDWARE))
(tf.pivot_table(index=["hardware", "mkn"], columns="recipe", values="value", sort=False)
 .round(1).reindex(columns=list(bench.GEMM_DTYPES)))

# %% [markdown]
# Fraction of the datasheet dense peak reached (GPUs in the registry only; emulated records
# excluded). The datasheet peaks are vendors' numbers at boost clock: 70-80% of them is typical
# of a well-fed cuBLAS GEMM.

# %%
real = tf[~tf.emulated & tf.peak.notna()]
(real.pivot_table(index=["hardware", "mkn"], columns="recipe", values="fraction_of_peak",
                  sort=False).round(2).reindex(columns=list(bench.GEMM_DTYPES)))

# %% [markdown]
# ## Speedup of FP8 over BF16 and FP16, shape by shape
#
# Only records where FP8 really ran as an FP8 GEMM (`emulated == False`) give a speedup.

# %%
def speedups(frame):
    wide = frame.pivot_table(index=["hardware", "mkn", "flops"], columns="recipe",
                             values="value").reset_index()
    emu = (frame[frame.recipe == "fp8"].set_index(["hardware", "mkn"]).emulated)
    wide["fp8_emulated"] = [bool(emu.get((h, s), True))
                            for h, s in zip(wide.hardware, wide["mkn"])]
    for base in ("bf16", "fp16"):
        wide[f"fp8/{base}"] = wide.get("fp8") / wide.get(base)
    return wide.sort_values(["hardware", "flops"])


sp = speedups(tf)
sp_real = sp[~sp.fp8_emulated].dropna(subset=["fp8/bf16"])
sp_emulated = sorted(sp[sp.fp8_emulated].hardware.unique())
sp_real[["hardware", "mkn", "bf16", "fp16", "fp8", "fp8/bf16", "fp8/fp16"]].round(2)

# %% [markdown]
# ## Figure: roofline per hardware, and the FP8 speedup ceiling per shape

# %%
COLORS = dict(zip(bench.GEMM_DTYPES, sns.color_palette("tab10", len(bench.GEMM_DTYPES))))
n_hw = len(HARDWARE)
fig = plt.figure(figsize=(max(12, 4.6 * n_hw), 10))
gs = fig.add_gridspec(2, n_hw, height_ratios=[1.05, 1])
for j, h in enumerate(HARDWARE):
    ax = fig.add_subplot(gs[0, j])
    d = tf[tf.hardware == h]
    e = registry_entry(h)
    xs = np.logspace(np.log10(max(d.intensity.min() / 2, 0.1)), np.log10(d.intensity.max() * 2), 100)
    for r in bench.GEMM_DTYPES:
        dr = d[d.recipe == r]
        if dr.empty:
            continue
        native, emulated = dr[~dr.emulated], dr[dr.emulated]
        ax.scatter(native.intensity, native.value, color=COLORS[r], s=36, label=r, zorder=3)
        ax.scatter(emulated.intensity, emulated.value, facecolors="none", edgecolors=COLORS[r],
                   hatch="////", s=90, linewidths=1.2, zorder=3)
        p = peak(h, r)
        if p is not None and e is not None and e.memory_bandwidth_tbs:
            ax.plot(xs, np.minimum(p, xs * e.memory_bandwidth_tbs), color=COLORS[r], lw=1,
                    ls="--", alpha=0.8)
    title = h if e is None else f"{h}: {e.name}"
    if e is None or all(v is None for v in e.peak_tflops.values()):
        title += "\n(no datasheet peaks: measured only)"
    if d.emulated.any():
        title += "\nhatched = emulated (not a native FP8 GEMM)"
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
           ylabel="TFLOP/s" if j == 0 else None, title=title)
    ax.title.set_fontsize(10)
handles = [Line2D([], [], marker="o", ls="", color=COLORS[r], label=r) for r in bench.GEMM_DTYPES]
handles += [Line2D([], [], ls="--", color="grey", label="datasheet roof min(peak, AI x BW)"),
            Patch(facecolor="none", edgecolor="grey", hatch="////", label="emulated")]
# Upper left of a roofline is above the bandwidth roof: always empty, room for the legend.
fig.axes[0].legend(handles=handles, fontsize=8, loc="upper left")

ax = fig.add_subplot(gs[1, :])
if sp_real.empty:
    ax.text(0.5, 0.5, "no native FP8 GEMM records yet: record a GPU with\n"
            "`repro record gemm --profile full`"
            + (f"\n(FP8 emulated, not a speedup: {', '.join(sp_emulated)})" if sp_emulated else ""),
            ha="center", va="center",
            transform=ax.transAxes, fontsize=12)
    ax.set_axis_off()
else:
    long = sp_real.melt(id_vars=["hardware", "mkn", "flops"], value_vars=["fp8/bf16", "fp8/fp16"],
                        var_name="ratio", value_name="speedup")
    long["label"] = long.hardware + "  " + long.ratio
    order = list(dict.fromkeys(sp_real.sort_values("flops")["mkn"]))
    sns.barplot(data=long, x="mkn", y="speedup", hue="label", order=order, ax=ax,
                palette="Paired")
    ceilings = {}
    for h in sp_real.hardware.unique():
        if peak(h, "fp8") and peak(h, "bf16"):
            ceilings.setdefault(peak(h, "fp8") / peak(h, "bf16"), []).append(h)
    for c, hs in ceilings.items():
        ax.axhline(c, color="black", ls="--", lw=1,
                   label=f"datasheet FP8/BF16 = {c:.1f}x ({', '.join(hs)})")
    ax.axhline(1.6, color="crimson", ls=":", lw=1.5, label="claimed 1.6x (A2, B2)")
    ax.axhline(1.0, color="grey", lw=0.8)
    title = "FP8 over BF16 / FP16 at the same shape (native FP8 records only)"
    if sp_emulated:
        title += f"\nnot shown as a speedup (FP8 emulated): {', '.join(sp_emulated)}"
    ax.set(ylabel="GEMM speedup = ceiling for a training step",
           xlabel="GEMM shape M x K x N (sorted by FLOPs)", title=title)
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8, ncol=3, loc="upper left")
fig.tight_layout()
fig.savefig("figures/02_gemm_roofline.png", dpi=120)

# %% [markdown]
# ## Relative error of one GEMM against float64
#
# The price of each dtype, measured on a 256 x 256 x 256 product of random normal operands
# (`value`: against the float64 product of the original operands; `same operands`: against the
# float64 product of the operands as rounded, i.e. accumulation and output rounding only).

# %%
err = df[df.metric == "rel_error"].copy()
err["same operands"] = err.extra.map(lambda e: e.get("rel_error_same_operands"))
(err.pivot_table(index="recipe", columns="hardware", values=["value", "same operands"])
 .reindex(list(bench.GEMM_DTYPES)))

# %% [markdown]
# ## Verdict (computed)
#
# For the GEMM ceiling of claims A2 (FP8 vs FP16, "up to 1.6x") and B2 (the 1.6x of NVFP4,
# whose GEMMs need FP4 tensor cores).

# %%
lines = []
for h, g in sp_real.groupby("hardware"):
    best = g.loc[g["fp8/fp16"].idxmax()]
    over = g[g["fp8/fp16"] >= 1.6]["mkn"].tolist()
    under = g[g["fp8/fp16"] < 1.2]["mkn"].tolist()
    lines.append(
        f"{h}: FP8 GEMM up to {g['fp8/bf16'].max():.2f}x BF16 and {g['fp8/fp16'].max():.2f}x "
        f"FP16 (best {best['mkn']}); >= 1.6x FP16 at {len(over)}/{len(g)} shapes "
        f"({', '.join(over) or 'none'}); < 1.2x at {', '.join(under) or 'none'}")
if lines:
    a2 = ("GEMM ceiling permits 1.6x only for wide GEMMs: a step made of narrower GEMMs "
          "cannot reach it")
else:
    a2 = "not on this hardware: no native FP8 GEMM records (only emulated ones)"
fp4_ratio = {slug: e["peak_tflops"]["fp4"] / e["peak_tflops"]["fp8"]
             for slug, e in hardware.registry().items()
             if e["peak_tflops"].get("fp4") and e["peak_tflops"].get("fp8")}
fp4_hw = [h for h in HARDWARE if h in fp4_ratio]
b2 = ("projection only (datasheet FP4/FP8: "
      + ", ".join(f"{h} {r:.1f}x" for h, r in fp4_ratio.items())
      + "); this sweep has no NVFP4 GEMM"
      + (f"; FP4-capable hardware with FP8 records: {', '.join(fp4_hw)}" if fp4_hw
         else "; no FP4-capable hardware recorded"))
print("A2 (GEMM ceiling):", a2)
for line in lines:
    print("   ", line)
print("B2 (GEMM ceiling):", b2)
