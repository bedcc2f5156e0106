# %% [markdown]
# # 03 · FP8 RL training: speed and memory (claims A1-A4, A9; C1)
#
# **The claims** (seed article on end-to-end FP8 reinforcement learning; `docs/CLAIMS.md`):
# **A2** FP8 RL training is up to 1.6x faster than FP16 on an H100; **A3** up to 2.8x faster
# than an A100 in FP16; **A1** parameters, activations, gradients and optimizer updates are all
# FP8; **A4** memory drops, so larger models fit; **A9** it works for MLPs and CNNs (the speed
# side here, the quality side in notebook 04). NVIDIA's primary source (NeMo RL, GRPO on LLMs)
# reports +15-25% from FP8 linear layers; the 1.6x-vs-FP16 figure does not appear there.
#
# **Method.** PPO (`repro.models.ppo`: the whole run is one jitted function) on a gymnax task,
# the actor-critic network under each precision recipe (`repro.precision.recipes`): fp32, tf32,
# bf16, fp16 (dynamic loss scaling), fp8-current and fp8-delayed (all three GEMMs of each hidden
# layer in FP8; first and last layers BF16). For each network (MLPs of width 64 to 4096, the
# MinAtar CNN, a Nature-DQN stack on 80x80 inputs), number of parallel environments and recipe,
# `repro.experiments.rl_throughput.measure` times the **whole PPO loop** (env-steps/s), the
# **update alone** (the part FP8 can speed up), and records the compiled update's **memory**.
#
# **Decision rules** (each claim's `rule` in `repro/data/claims.yaml`, read by
# `repro.claims.verdicts`; only ratios of native-FP8 cells recorded in one GPU call count):
# **A2** ("up to") reproduced if the whole loop of any FP8 recipe reaches 1.6x over FP16
# somewhere, partly if only the update does or the loop is at least 1.1x faster, contradicted
# otherwise; the default `fp8-delayed`'s ratio is named too. **A9** reproduced if
# `fp8-delayed`'s best FP8/BF16 loop ratio is at least 1 for the MLPs and for the CNNs, partly
# if for one. **A1** reproduced if all four stores of `fp8-e2e` are FP8, partly for two or
# three. **A4** reproduced if the update's memory under `fp8-delayed` is at most 0.9 of
# FP16's (BF16's where FP16 has no record: the same bytes) at the widest MLP, partly if below
# 1; `fp8-lean` is named beside it, not judged (the claim does not say "up to"); the figure is
# XLA's compile-time buffer assignment, not a measured device peak. **A3** is a projection (no
# A100 was measured).
#
# An FP8 record made where no FP8 GEMM ran (a CPU, a TPU v5e, which has no FP8 arithmetic; an
# FP8 CNN, whose convolution backward is emulated through BF16) is **emulated**: drawn hollow,
# labelled "emulated", and never counted as a speedup.
#
# **C1** asks the same of hardware whose 8-bit arithmetic is INT8 (a TPU v5e): reproduced if
# the PPO update at width 4096 under `int8` (INT8 in all three GEMMs of each hidden layer) is
# at least 1.3x BF16's, in a paired cell of that TPU, partly if INT8 is faster but short of it.
#
# **The figures** put the machines side by side, one panel (or column) per machine, each titled
# with the 8-bit format it multiplies natively: FP8 on the H200, INT8 on the TPU v5e. Each
# verdict is computed from its claim's ledger set alone; the figures draw every fresh cell of
# an accelerator (a CPU's records are no speed).

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro import hardware, notebook, plotstyle
from repro.analysis import rl as rl_analysis
from repro.analysis import stats
from repro.claims import registration, verdicts
from repro.precision.recipes import REGISTRY

nb = notebook.start("03_rl_throughput", "rl_throughput", profile, scratch)
if nb.profile == "smoke":  # a pipeline check on this machine: scratch records, scratch figure
    nb.record_smoke("rl_throughput")
df = nb.records("rl_throughput")
table = rl_analysis.throughput_table(df)
sp = rl_analysis.fp8_speedups(table, records=df)  # with the paired cells' ratios


def speedups_of(records):
    """The FP8 speedups of ``records`` (paired cells' ratios included): a verdict's table from
    the records of its ledger set (`nb.ledger`); the figures draw from every fresh cell."""
    return rl_analysis.fp8_speedups(rl_analysis.throughput_table(records), records=records)


# the stale cells, left out of every verdict, drawn hollow and grey so the sweep stays visible
old = nb.stale_rows("rl_throughput")
old_table = rl_analysis.throughput_table(old) if len(old) else table.iloc[:0]
old_sp = rl_analysis.fp8_speedups(old_table, records=old) if len(old_table) else sp.iloc[:0]
print(f"committed records from: {sorted(table.hardware.unique()) if len(table) else 'none'}")

# %% [markdown]
# ## Throughput per recipe
#
# Env-steps per second of the whole PPO loop (one seed) against MLP width, one panel per
# machine (titled with its 8-bit format) and number of parallel environments. Hollow markers
# without a line: a recipe the machine emulated (FP8 on a TPU v5e), not a speed.

# %%
ORDER = ["fp32", "tf32", "bf16", "fp16", "fp8-current", "fp8-delayed", "fp8-all-layers",
         "fp8-lean"]
KEYS = ["hardware", "network", "width", "num_envs", "recipe"]


def round_ranges(df, metric="env_steps_per_s"):
    """Per (hardware, network, width, num_envs, recipe): the range of ``metric`` over the
    timed rounds of its records (error bars)."""
    d = df[df.metric == metric] if len(df) else df
    d = d[~d["extra"].map(rl_analysis.is_paired)] if len(d) else d
    if not len(d):
        return pd.DataFrame(columns=KEYS + ["lo", "hi"])
    d = stats.round_range(d)
    for k in ("network", "width", "num_envs"):
        d[k] = d["sizes"].map(lambda s, k=k: s.get(k))
    return d.groupby(KEYS, as_index=False).agg(lo=("lo", "min"), hi=("hi", "max"))


def ratio_ranges(sep, df):
    """``sep`` (separately timed FP8/baseline ratios) with ``{e2e,update}_{lo,hi}``: the
    ratio's range when the two cells' timed rounds are paired worst with best."""
    out = sep.copy()
    cells = list(zip(sep.hardware, sep.network, sep.width, sep.num_envs))
    for kind, metric, rate in (("e2e", "env_steps_per_s", True),
                               ("update", "update_time_ms", False)):
        r = round_ranges(df, metric).set_index(KEYS)

        def get(recipes, col, r=r):
            return np.array([r[col].get((*c, x), np.nan) for c, x in zip(cells, recipes)], float)

        lo, hi = get(sep.recipe, "lo"), get(sep.recipe, "hi")
        blo, bhi = get(sep.baseline, "lo"), get(sep.baseline, "hi")
        out[f"{kind}_lo"], out[f"{kind}_hi"] = ((lo / bhi, hi / blo) if rate
                                                else (blo / hi, bhi / lo))
    return out


def plot_throughput(table, ranges, earlier=None, label=""):
    mlp = table[table.network == "mlp"] if len(table) else table
    mlp = mlp.merge(ranges, on=KEYS, how="left") if len(mlp) else mlp
    gone = earlier[earlier.network == "mlp"] if earlier is not None and len(earlier) else None
    panels = sorted({(h, n) for d in (mlp, gone) if d is not None and len(d)
                     for h, n in zip(d.hardware, d.num_envs)})
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5 * max(len(panels), 1), 4),
                             squeeze=False)
    for ax, (h, n) in zip(axes[0], panels):
        g = mlp[(mlp.hardware == h) & (mlp.num_envs == n)] if len(mlp) else mlp
        for r, gr in (g.groupby("recipe") if len(g) else []):  # only stale cells: none
            gr = gr.sort_values("width")
            st = plotstyle.style(r)
            emu, gr = gr[gr.emulated.astype(bool)], gr[~gr.emulated.astype(bool)]
            if len(emu):  # emulated: hollow markers, no line or bars (not a speed)
                ax.scatter(emu.width, emu.env_steps_per_s, marker=st["marker"], zorder=3,
                           facecolors="none", edgecolors=st["color"],
                           label=f"{r} ({plotstyle.EMULATED})")
            if not len(gr):
                continue
            ax.errorbar(gr.width, gr.env_steps_per_s, yerr=np.vstack([gr.env_steps_per_s - gr.lo,
                                                                      gr.hi - gr.env_steps_per_s]),
                        color=st["color"], ls=st["ls"], capsize=3, label=r)
            ax.scatter(gr.width, gr.env_steps_per_s, color=st["color"], zorder=3,
                       marker=st["marker"])
        if gone is not None:
            o = gone[(gone.hardware == h) & (gone.num_envs == n)]
            if len(o):
                ax.scatter(o.width, o.env_steps_per_s, label=label, **notebook.EARLIER)
        ax.set(xscale="log", yscale="log", xlabel="MLP width (units per hidden layer)",
               ylabel="throughput (env-steps/s)",
               title=f"{plotstyle.hardware_title(h)}\n{n} parallel environments")
        ax.legend(ncol=2, fontsize=7)
    fig.suptitle("Whole PPO loop throughput per machine (bars: range over timed rounds; "
                 "hollow: emulated, not a speed;\nhollow grey: stale cells of an earlier "
                 "program, no verdict uses them)")
    return fig


SPEED = plotstyle.accelerators(df)  # the figures' records: a CPU's are no speed
nb.save(plot_throughput(rl_analysis.throughput_table(SPEED), round_ranges(SPEED), old_table,
                        notebook.earlier(old)), "03_rl_throughput", SPEED)

# %% [markdown]
# ## A2 and C1: 8-bit over FP16 and BF16, per machine
#
# Ratios of two timings of one hardware and configuration: the whole loop (env-steps/s, top)
# and the update alone (time, bottom), one column per machine and 16-bit baseline it recorded:
# on the H200 its FP8 recipes over FP16 and BF16, on the TPU v5e its INT8 recipes over BF16
# (hollow, labelled "emulated": FP8 there, which that chip has no arithmetic for; not a
# speed). Dashed: the claimed 1.6x (A2) on a machine whose 8-bit format is FP8; on one whose
# 8-bit format is INT8, C1's target for the update. A cross marks a ratio whose two cells
# come from different device calls: shown, not counted. The bars of a separately timed ratio
# pair the slowest round of one cell with the fastest of the other (its widest range). A
# diamond is a paired cell: the recipes compiled together and timed in rounds (A, B, A, B,
# ...), the median of the per-round ratios with their range; where a hardware has paired
# cells, A2 and C1 are judged from them alone. Hollow grey marks: the cells whose program has
# changed since they were recorded (stale), drawn as what an earlier program measured so the
# sweep stays visible; no verdict uses them.

# %%
# the figure's 8-bit recipes: the FP8 recipes of the study and every INT8 recipe
EIGHT_BIT = (*rl_analysis.FP8_RECIPES, *(r for r in REGISTRY if plotstyle.format_of(r) == "INT8"))
sp8 = plotstyle.accelerators(rl_analysis.fp8_speedups(
    rl_analysis.throughput_table(SPEED), EIGHT_BIT, records=SPEED)) if len(SPEED) else sp
sp8 = sp8[sp8.network == "mlp"] if len(sp8) else sp8
old8 = old_sp[old_sp.network == "mlp"] if len(old_sp) else old_sp
TARGET = {"FP8": (verdicts.rule("A2")["target"], "claimed {}x (A2)", ("e2e", "update")),
          "INT8": (verdicts.rule("C1")["target"], "C1's target {}x (update)", ("update",))}
columns = [(h, b) for h in plotstyle.hardware_order([*sp8.get("hardware", []),
                                                     *old8.get("hardware", [])])
           for b in ("fp16", "bf16")
           if any(len(d) and ((d.hardware == h) & (d.baseline == b)).any() for d in (sp8, old8))]
fig, axes = plt.subplots(2, max(len(columns), 1), figsize=(4.6 * max(len(columns), 2), 7.5),
                         sharex=True, squeeze=False)
widths = pd.concat([d.width for d in (sp8, old8) if len(d)]) if len(sp8) or len(old8) else []
for j, (h, base) in enumerate(columns):
    fmt = plotstyle.eight_bit(h) or "8-bit"
    for i, (kind, what) in enumerate((("e2e", "whole loop"), ("update", "update only"))):
        ax = axes[i, j]
        g = sp8[(sp8.hardware == h) & (sp8.baseline == base)] if len(sp8) else sp8
        for (n, r), gg in (g[g.timing == "paired"].groupby(["num_envs", "recipe"])
                           if len(g) and "timing" in g else []):
            real = gg[~gg.emulated.astype(bool)]
            ax.errorbar(real.width, real[kind], yerr=[real[kind] - real[f"{kind}_lo"],
                                                      real[f"{kind}_hi"] - real[kind]],
                        fmt="D", ms=6, capsize=3, zorder=4, color=plotstyle.color(r),
                        label=f"{r}, {n} envs, paired ({int(gg.rounds.max())} rounds)")
            if len(emu := gg[gg.emulated.astype(bool)]):  # hollow, no bars: not a speed
                ax.scatter(emu.width, emu[kind], marker="D", facecolors="none", zorder=4,
                           edgecolors=plotstyle.color(r),
                           label=f"{r}, {n} envs, paired ({plotstyle.EMULATED})")
        g = ratio_ranges(rl_analysis.separate(g), SPEED) if len(g) else g
        for (n, r), gg in (g.groupby(["num_envs", "recipe"]) if len(g) else []):
            gg = gg.sort_values("width")
            st = plotstyle.style(r)
            c = st["color"]
            emu, gg = gg[gg.emulated.astype(bool)], gg[~gg.emulated.astype(bool)]
            if len(emu):  # emulated: hollow markers, no line or bars (not a speed)
                ax.scatter(emu.width, emu[kind], zorder=3, marker="o", facecolors="none",
                           edgecolors=c, label=f"{r}, {n} envs ({plotstyle.EMULATED})")
            if not len(gg):
                continue
            ax.errorbar(gg.width, gg[kind], fmt="none", ecolor=c, capsize=3,
                        yerr=np.vstack([(gg[kind] - gg[f"{kind}_lo"]).fillna(0),
                                        (gg[f"{kind}_hi"] - gg[kind]).fillna(0)]))
            ax.plot(gg.width, gg[kind], ls=st["ls"], color=c, label=f"{r}, {n} envs")
            for mask, style in ((gg.same_commit, dict(marker="o", color=c)),
                                (~gg.same_commit, dict(marker="x", s=50, color=c))):
                ax.scatter(gg.width[mask], gg[kind][mask], zorder=3, **style)
        o = old8[(old8.hardware == h) & (old8.baseline == base)] if len(old8) else old8
        if len(o):  # stale cells: what an earlier program measured, in no verdict
            ax.scatter(o.width, o[kind], label=notebook.earlier(old), **notebook.EARLIER)
        if fmt in TARGET and kind in TARGET[fmt][2]:
            ax.axhline(TARGET[fmt][0], ls="--", color="k", lw=1,
                       label=TARGET[fmt][1].format(TARGET[fmt][0]))
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", ylabel=f"{fmt} / {base.upper()} speedup (x)",
               title=f"{plotstyle.hardware_title(h)}\n{what}, over {base.upper()}")
        if len(w := widths):
            # a decade around the widths (error bars at one width collapse the autoscale)
            ax.set_xlim(w.min() / 2 ** 1.5, w.max() * 2 ** 1.5)
        if i == 1:
            ax.set_xlabel("MLP width (units per hidden layer)")
    # one legend per column, under it: what both of its panels draw
    legend = {lab: hnd for a in axes[:, j] for hnd, lab in zip(*a.get_legend_handles_labels())}
    axes[1, j].legend(legend.values(), legend.keys(), fontsize=6.5, loc="upper center",
                      bbox_to_anchor=(0.5, -0.2))
fig.suptitle("8-bit speedup per machine (dashed: the claim's target; x: cells of different "
             "device calls; bars: range over timed rounds;\nhollow: emulated, not a speed; "
             "hollow grey: stale cells of an earlier program, in no verdict)")
nb.save(fig, "03_rl_speedup", SPEED)
# the headline series (whole loop, FP8 over FP16, MLP) as data: `dvc plots diff` overlays commits
head = rl_analysis.separate(sp[(sp.baseline == "fp16") & (sp.network == "mlp")]) if len(sp) \
    else sp
if len(head):
    nb.plot_data("03_rl_speedup", head.assign(
        series=head.hardware + " " + head.recipe + " " + head.num_envs.astype(str) + " envs")
        .pivot_table(index="width", columns="series", values="e2e", aggfunc="median"), df)
a2 = registration.judged(verdicts.a2, "A2", speedups_of(nb.ledger(df, "A2")), records=df)
print(f"A2: {a2.verdict} | {a2.key_number}")
(sp.round(3) if len(sp) else sp)

# %% [markdown]
# ## A9: CNNs
#
# The same ratios for the MinAtar CNN and the Nature-DQN stack. FP8 convolutions run FP8
# forward but their backward pass goes through BF16 transposed convolutions
# (`repro.precision.ops.fp8_conv`), so an FP8 CNN cell is emulated: only its BF16/FP16 cells are
# speed measurements, and the CNN side of A9 stays unmeasured until FP8 convolutions run
# natively in both directions.

# %%
a9 = registration.judged(verdicts.a9, "A9", speedups_of(nb.ledger(df, "A9")), records=df)
print(f"A9 (speed): {a9.verdict} | {a9.key_number}")
cnn = sp[sp.network != "mlp"] if len(sp) else sp
(cnn.round(3) if len(cnn) else cnn)

# %% [markdown]
# ## C1: INT8 where the 8-bit arithmetic is INT8
#
# The paired cells of C1's rule (its hardware, width and baseline; INT8 read as native from the
# compiled program): the median of the per-round BF16/INT8 update-time ratios, with their range.

# %%
C1 = verdicts.rule("C1")
c1_sp = rl_analysis.paired_speedups(nb.ledger(df, "C1"), C1["recipes"],
                                    [C1["cells"]["baseline"]])
c1_used = df[(df.hardware == C1["cells"]["hardware"]) & df.recipe.isin(C1["recipes"])] \
    if len(df) else df
c1 = registration.judged(verdicts.c1, "C1", c1_sp, records=c1_used)
print(f"C1: {c1.verdict} | {c1.key_number}")
(c1_sp.round(3) if len(c1_sp) else "no paired INT8 cell recorded")

# %% [markdown]
# ## A1: which values are FP8
#
# The precision policy of every recipe and quality variant
# (`repro.precision.recipes.value_formats`). A1's four stores are the stored parameters, the
# activations and gradients entering GEMMs, and the optimizer update. Adam's moments and the
# update arithmetic stay FP32 in every recipe here (as in Transformer Engine, DeepSeek-V3 and
# NVIDIA's NVFP4 recipe); FP8-stored weights (`master_weights: fp8`) sit in a BF16 container
# (`repro.precision.optim`), so their saving is counted from the format, not measured.

# %%
stores = rl_analysis.fp8_stores(nb.ledger(df, "A1"))
a1 = registration.judged(verdicts.a1, "A1", stores, records=df)
print(f"A1: {a1.verdict} | {a1.key_number}")
pd.DataFrame(dict(zip(stores.variant, stores.policy)))

# %% [markdown]
# ## A4: the memory of one update
#
# Device memory of the compiled PPO update (XLA's buffer assignment) for every recipe of the
# widest MLP at its most environments, one panel per machine (titled with its 8-bit format);
# hatched: an emulated 8-bit recipe (FP8 on a TPU v5e). At this size a
# quantized recipe's update differentiates the critic and then the actor
# (`repro.models.ppo.sequential_towers`): left to itself, XLA interleaved the two FP8 towers and
# kept both towers' activation-sized buffers alive at once. `fp8-lean` is `fp8-delayed` with
# the output gradient quantized in two passes (`Recipe.fp8_grad_cast`): its backward pass never
# holds the gradient and both of its FP8 copies at once, for one more read of the gradient.

# %%
mem = table.dropna(subset=["update_memory_bytes"]) if "update_memory_bytes" in table else table


def plot_memory(mem):
    order = ORDER
    big = plotstyle.accelerators(mem[mem.network == "mlp"]) if len(mem) else mem
    hws = plotstyle.hardware_order(big.hardware) if len(big) else []
    fig, axes = plt.subplots(1, max(len(hws), 1), figsize=(4.2 * max(len(hws), 2), 3.8),
                             squeeze=False)
    for ax, h in zip(axes[0], hws):
        g = big[big.hardware == h]
        w, n = g.sort_values(["width", "num_envs"])[["width", "num_envs"]].iloc[-1]
        g = g[(g.width == w) & (g.num_envs == n)]
        g = g.assign(o=g.recipe.map(lambda r: order.index(r) if r in order
                                    else len(order))).sort_values(["o", "recipe"])
        ax.bar(range(len(g)), g.update_memory_bytes / 2**20,
               color=[plotstyle.color(r) for r in g.recipe],
               hatch=["//" if e else "" for e in g.emulated])
        ax.set_xticks(range(len(g)), [r + (" (emulated)" if e else "")
                                      for r, e in zip(g.recipe, g.emulated)],
                      rotation=30, ha="right", fontsize=7)
        ax.set(ylabel="compiled update buffers (MiB)",
               title=f"{plotstyle.hardware_title(h)}\nMLP width {int(w)}, {int(n)} environments")
    fig.suptitle("Memory of one PPO update (hatched: emulated 8-bit recipe)")
    return fig


nb.save(plot_memory(mem), "03_rl_memory", plotstyle.accelerators(df))
# A4's rule changed after its first records: the key number says when, and gives the verdict
# under the rule as first registered (fp8-delayed over FP16 alone) from the same table
led = rl_analysis.throughput_table(nb.ledger(df, "A4"))  # A4's cells (a paired one's memory)
a4 = registration.judged(verdicts.a4, "A4", led.dropna(subset=["update_memory_bytes"])
                         if "update_memory_bytes" in led else led, records=df)
print(f"A4: {a4.verdict} | {a4.key_number}")

# %% [markdown]
# **The widest MLP that fits an H100's 80 GiB**, from a quadratic in the width fitted to the
# measured update memory per recipe (`repro.analysis.rl.widest_fitting`): `extrapolated` marks
# answers beyond the widest measured width (projections), `max_rel_residual` how far the fit
# misses the measured points.

# %%
fits = rl_analysis.widest_fitting(mem, 80 * 2**30)
fits.round({"widest_width": 0, "max_rel_residual": 4}) if len(fits) else fits

# %% [markdown]
# ## A3: a projection to H100 FP8 against A100 FP16
#
# The measured FP8/FP16 ratio on a Hopper GPU times how much faster an H100 runs FP16 than an
# A100, bounded by the datasheets (`repro.hardware.lookup`): by memory bandwidth (a memory-bound
# loop, the lower bound) and by dense FP16 tensor-core rate (a GEMM-bound loop, the upper).
# An A100 owner can replace it with a measurement: `repro record rl_throughput --profile full
# --recipe fp16` there.

# %%
a100, h100 = hardware.lookup("a100-sxm"), hardware.lookup("h100-sxm")
bw = h100.memory_bandwidth_tbs / a100.memory_bandwidth_tbs
fl = h100.peak_tflops["fp16"] / a100.peak_tflops["fp16"]
ceiling = h100.peak_tflops["fp8"] / a100.peak_tflops["fp16"]
proj = rl_analysis.a3_projection(rl_analysis.separate(sp), bw, fl)
fig, ax = plt.subplots(figsize=(7, 4))
for k, ((h, n, r), g) in enumerate(proj.groupby(["hardware", "num_envs", "recipe"])
                                  if len(proj) else []):
    g = g.sort_values("width")
    c = plotstyle.color(r)
    if len(g) > 1:
        ax.fill_between(g.width, g.lo, g.hi, alpha=0.2, color=c)
    # the range at each measured width, side by side (a band of one width has no area)
    ax.vlines(g.width * 1.04 ** k, g.lo, g.hi, lw=8, alpha=0.6, color=c,
              label=f"{r}, from {h}, {n} envs")
ax.axhline(2.8, ls="--", color="k", lw=1, label="claimed 2.8x")
ax.set(xscale="log" if len(proj) else "linear", xlabel="MLP width (units per hidden layer)",
       ylabel="H100 FP8 / A100 FP16 (projected, x)",
       title="A3 projection (datasheet ratios x measured FP8/FP16), not a measurement")
if len(proj):
    ax.set_xlim(proj.width.min() / 2 ** 1.5, proj.width.max() * 2 ** 1.5)
ax.legend(loc="upper left")
nb.save(fig, "03_rl_projection", df)
# A3 projects A2's measured ratio: its ledger's paired cells (where a hardware has them)
a3_proj = rl_analysis.a3_projection(rl_analysis.paired_first(speedups_of(nb.ledger(df, "A3"))),
                                    bw, fl)
a3 = registration.judged(verdicts.a3, "A3", a3_proj, bw, fl, ceiling, records=df)
print(f"A3: {a3.verdict} | {a3.key_number}")

# %% [markdown]
# ## Pipeline check (smoke profile)
#
# On a smoke run the tiny cells recorded above are drawn into `build/figures/` (never into
# `figures/`): they show that recording and analysis run, not how fast FP8 is.

# %%
if nb.profile == "smoke":
    smoke = nb.smoke_records("rl_throughput")
    nb.save(plot_throughput(rl_analysis.throughput_table(smoke), round_ranges(smoke)),
            "03_rl_throughput", smoke)

# %% [markdown]
# ## Conclusion
#
# What the committed records say, claim by claim (each paragraph is filled in from the verdict
# computed above):

# %%
nb.conclusion(a2, a3, a9, a1, a4, c1)
