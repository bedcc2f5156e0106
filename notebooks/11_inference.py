# %% [markdown]
# # 11 · Serving the trained LM in FP8 and INT8 (B6)
#
# **Claim B6** (seed article): *"FP4 for training, FP8/INT8 for inference."* The training half
# is claim B4 (notebook 05). This notebook tests the inference half: a decoder LM trained in
# BF16, quantized after training, served with a KV cache.
#
# **How a JAX user quantizes for inference today.** With [qwix](https://github.com/google/qwix)
# (Google's JAX quantization library, version 0.1.8 here): MaxText's quantization docs
# ([`docs/explanations/quantization.md`](https://github.com/AI-Hypercomputer/maxtext)) recommend it
# over AQT, and MaxText's `quantization` names (`int8`, `fp8`, `fp8_full`, `fp8_gpu`) select
# qwix rules in `src/MaxText/layers/quantizations.py`. We use qwix's post-training
# quantization (`qwix.PtqProvider`, `quantize_params`) on our own `Decoder`; section 1 maps
# MaxText's names to the formats here.
#
# **Method** (`repro/experiments/inference/measure.py`, parameters in `params.yaml`, section
# `inference`).
#
# * *Accuracy.* Per seed, a BF16 LM is trained (`repro.models.lm_train`, orbax checkpoints) and
#   the checkpoint with the best held-out loss is kept: the small corpus makes longer runs
#   overfit (notebook 05), so the last step is not always the best. That checkpoint is exported
#   in every format (`repro.precision.export`: the block linear layers QKV, attention output,
#   MLP gate/up and down; embedding, head, attention's QK^T / AV and norms stay BF16), saved
#   and restored through orbax, and compared with BF16 on the same held-out windows: held-out
#   loss (nats per byte) and bits per byte, KL(BF16 ‖ format) of the next-token distributions
#   and how often their most likely next token agrees. Gaps are paired by seed (the same
#   checkpoint) and given with 95 % Student-t intervals over seeds.
# * *Speed* (GPU only; on a CPU every timing is emulated). Each format beside BF16 on the same
#   untrained weights (speed does not depend on training), timed in rounds in one process:
#   prefill tokens/s at a config's training shape, decode tokens/s with the KV cache
#   (`repro.models.lm_decode`) at several batch sizes. Three configs: the trained `20m`
#   shape and two wide ones, speed only: `wide` (`d_model` 4096, every format) and `wide8k`
#   (`d_model` 8192, FP8 weights and activations and the weight-only formats), which shows
#   how a weight-only gain grows as the weights' bytes take more of a decode step. Every speed
#   record carries a **lowering check** of its compiled program: FP8 must become cuBLASLt's
#   FP8 GEMM or an f8 × f8 dot in a fusion, INT8 an `s8 × s8 → s32` product; otherwise (and
#   for NVFP4 on Hopper, and on CPUs) it is `emulated` and left out of the speed verdict.
# * *Memory.* Exact bytes of the exported weights (4-bit elements two to a byte, NVFP4 block
#   scales in E4M3), their bytes as the arrays run, the orbax checkpoint on disk, and the
#   compiled programs' buffer bytes (XLA's memory analysis).
#
# **Profiles.** `smoke` (default; CPU, under a minute): the `tiny` model for a few dozen steps,
# two seeds, every format exported and evaluated, the decoder timed for two formats: a pipeline
# check on this machine, drawn into `build/figures/` only, never evidence. `full` (an H200,
# recorded into `results/`): the `20m` model trained for `train.steps` steps over `seeds`
# (`params.yaml`), and every speed config.
#
# **Decision rule** (`repro.claims.verdicts.b6`), from committed full-profile records only.
# Accuracy is a parity claim with one equivalence margin per format, from B6's definition
# (`repro/data/claims.yaml`): the relative held-out loss gap (format - BF16) / BF16 within
# +-0.5% for FP8 and +-1% for INT8. With its 95% interval [lo, hi] over at least 3 seeds, a
# format keeps BF16's accuracy if hi is within the margin, loses it if lo is beyond it, and is
# undecided if the interval straddles the margin's end. Speed, from records whose products ran
# on tensor cores (not emulated), each format's at the widest config it was timed at: FP8
# prefill >= 1.3x BF16's tokens/s, weight-only FP8 and INT8 decode at batch 1 >= 1.5x. FP8
# weights and activations are judged as `fp8` (scales per channel and token); `fp8-tensor`
# (one per tensor) is timed beside it, not judged (the claim does not say "up to"). The
# thresholds, formats and config are B6's `rule` in `repro/data/claims.yaml`.
# Memory: weight-only FP8 / INT8 weights <= 0.52x and NVFP4 <= 0.30x of BF16's bytes over the
# whole model. Every part passes: **reproduced**; every part fails (or is undecided, one
# failing): **contradicted**; none fails but an accuracy interval is too wide to tell:
# **inconclusive**; otherwise (a part failed or was not measured): **partly**; no committed
# records: **not yet measured**.
#
# **The figures** put the machines side by side, one row or panel per machine, each named with
# the 8-bit format it multiplies natively (FP8 on the H200, INT8 on the TPU v5e): accuracy per
# machine that measured it (a CPU's full-profile records count here), speed per accelerator.
# A number a machine emulated (a format it has no arithmetic for, or whose compiled program
# did not run it natively) is drawn hollow and labelled "emulated": it is no speed.
#
# Regenerate: `dvc repro inference` (or `repro notebook 11_inference --profile smoke`); the GPU
# study: `repro record inference --profile full` (resumable; with `REPRO_TIME_BUDGET_S` it stops
# cleanly between cells), then commit `results/`.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from repro import notebook, plotstyle
from repro.claims import registration, verdicts
from repro.experiments.inference import measure as I
from repro.experiments.inference import rules as inference_rules
from repro.experiments.inference import tables as A
from repro.precision import export as X

nb = notebook.start("11_inference", "inference", profile, scratch)
if nb.profile == "smoke":  # a pipeline check on this machine: scratch records, scratch figures
    nb.record_smoke(I.EXPERIMENT)
df = nb.records(I.EXPERIMENT)  # committed full-profile records: the evidence
MARGINS = inference_rules.b6_margins()
print(f"B6's margins (repro/data/claims.yaml): {MARGINS}; formats {nb.params['formats']}")
print(f"{len(df)} committed full-profile records" if len(df) else
      "no committed full-profile records yet: the tables below are empty and B6 reads "
      "'not yet measured'")

# %% [markdown]
# ## 1. The formats, and MaxText's names for them
#
# `gemm`: what the quantized products compute in on a GPU with the format's tensor cores
# (`dequant-bf16`: weight-only, a BF16 GEMM). `scales`: `channel` is a scale per output channel
# for the weights and per token for the activations; `tensor` one per tensor (`fp8-tensor`: its
# product is an FP8 GEMM times one scalar, the form in which cuBLASLt's FP8 GEMM takes its
# scales, while per-token scales are a vector along the rows that it cannot take); NVFP4 has an
# E4M3 scale per 16 weights along the contraction. `weight-only kernel`: how `fp8-w` / `int8-w`
# multiply at decode: the BF16 GEMM of the stored 1-byte values with the scale on its output, no
# dequantized weight (`repro.precision.dequant_gemm`: `gemv` computes one row with a Pallas
# (Triton) matrix-vector kernel that streams the weight stored transposed once, with the tiling,
# and for INT8 the way its bytes become FP32 (`dequant_gemm.widen`), measured fastest for the
# device and the weight's shape (`dequant_gemm.GEMV_TILES`), and as
# `reduce`, a multiply and a sum that XLA fuses, where it knows no tiling; more rows go through
# `xla`, which lets XLA fuse the convert into its GEMM; `pallas` is a Pallas GEMM kernel that
# does that explicitly); NVFP4 is dequantized by qwix first. `fp8-tensor` and the weight-only
# formats store their weights transposed, `[N, K]`: the layout cuBLASLt's FP8 GEMM reads
# without transposing every weight on every call. `MaxText`: the values of MaxText's `quantization`
# flag whose forward pass is the same (from `quantizations.py`: `int8` and `fp8`/`fp8_full` are
# qwix rules with INT8 / E4M3 weights and activations, per channel by default; `fp8_gpu` wraps
# flax's `Fp8DirectDotGeneralOp`, our `flax-fp8`; AQT's `aqt_fp8_full` quantizes both operands to
# E4M3 with per-tensor dynamic scales, the forward pass of `fp8-tensor`; AQT's `int8w` is
# weight-only INT8). `fp8_full` differs from `fp8` only in its backward pass (E5M2 gradients),
# which inference never runs.

# %%
pd.DataFrame([{"format": f.name, "weights": f.weight or "bf16", "activations": f.act or "bf16",
               "scales": ("1x16 blocks" if f.tile_size else f.granularity) if f.qwix else "-",
               "runs under recipe": f.recipe,
               "gemm": f.gemm, "weight-only kernel": f.kernel or "-",
               "Hopper tensor cores": f.hopper, "MaxText": f.maxtext or "-", "what": f.about}
              for f in X.FORMATS.values() if f.name in nb.params["formats"]])

# %% [markdown]
# ## 2. Accuracy against BF16
#
# Which checkpoint each seed used (the step of its best held-out loss, out of the run's
# evaluations), then the comparison: `rel_gap` is held-out loss / BF16's - 1, mean over seeds,
# with its 95% interval (`rel_lo`, `rel_hi`, in % below); `kl`: KL(BF16 ‖ format) in nats per
# token; `top1`: the share of positions where both pick the same next token. Dashed lines in
# the figure: each format's margin. One panel per machine that measured accuracy, on one
# scale; "(emulated)" and a hollow marker: a format whose products the machine emulated (its
# numerics are the format's; only its speed would not be).

# %%
def checkpoints(df):
    c = df[df["metric"] == "heldout_loss"].drop_duplicates(["hardware", "size_seed"]) \
        if len(df) else df
    return pd.DataFrame([{"hardware": r.hardware, "profile": r.profile, "seed": int(r.size_seed),
                          "best step": r.extra["best_step"], "of steps": int(r.size_steps),
                          "held-out loss by step": r.extra["curve"]} for r in c.itertuples()])


def percent(acc):
    return acc.assign(**{c: (100 * acc[c]).round(3) for c in ("rel_gap", "rel_lo", "rel_hi")}
                      ).rename(columns={"rel_gap": "gap %", "rel_lo": "lo %", "rel_hi": "hi %"})


def plot_accuracy(acc):
    """One panel per machine (its best evidence: full profile where it has one), on one
    scale, each format's gap to BF16 with its interval and the margins."""
    per = {h: A.best_evidence(acc[acc["hardware"] == h])
           for h in plotstyle.hardware_order(acc["hardware"])}
    per = {h: a[a["format"] != "bf16"].reset_index(drop=True) for h, a in per.items()}
    per = {h: a for h, a in per.items() if len(a)}  # a machine with BF16 alone shows nothing
    rows = max([len(a) for a in per.values()] + [1])
    fig, axes = plt.subplots(1, max(len(per), 1), figsize=(7 * max(len(per), 1),
                                                           0.4 * rows + 1.8),
                             sharex=True, squeeze=False)
    for ax, (hw, a) in zip(axes[0], per.items()):
        for i, r in a.iterrows():
            st = plotstyle.style(r["format"])
            ax.errorbar(100 * r["rel_gap"], i,
                        xerr=[[100 * np.nan_to_num(r["rel_gap"] - r["rel_lo"])],
                              [100 * np.nan_to_num(r["rel_hi"] - r["rel_gap"])]],
                        fmt=st["marker"], color=st["color"], capsize=3,
                        mfc="none" if r["emulated"] else st["color"])
        for fmt, (_, high) in MARGINS.items():
            ax.axvline(100 * high, ls="--", lw=1, color="grey")
            ax.text(100 * high, 0.02, f"{fmt} margin ", fontsize=8, ha="right", va="bottom",
                    rotation=90, transform=ax.get_xaxis_transform())
        ax.set_yticks(a.index, [f + (" (emulated)" if e else "")
                                for f, e in zip(a["format"], a["emulated"])])
        ax.axvline(0, color="black", lw=0.8)
        ax.set(xlabel="held-out loss vs BF16 (%), 95% CI over seeds", ylabel="format",
               ylim=(rows - 0.5, -0.5),
               title=f"{plotstyle.hardware_title(hw)}\n{a['model'].iloc[0]} LM, "
                     f"{a['profile'].iloc[0]} profile")
    fig.suptitle("Post-training quantization: held-out loss against BF16, per machine")
    return fig


acc = A.accuracy_table(df)
fig = plot_accuracy(acc) if len(acc) else notebook.empty_figure("Post-training quantization",
                                                                nb.why_empty(df))
nb.save(fig, "11_inference_accuracy", df)
if len(acc):
    display(checkpoints(df))
percent(acc) if len(acc) else "no accuracy records in the committed records"

# %% [markdown]
# ## 3. Memory
#
# `ratio_to_bf16`: the whole model's weight bytes (embedding and head stay BF16);
# `ratio_quantized_layers`: over the quantized layers only, the format's own ratio (FP8/INT8
# per-channel: 1 byte per weight plus a BF16 scale per output channel; `fp8-tensor`: 1 byte per
# weight plus one BF16 scale; NVFP4: half a byte plus an E4M3 scale per 16 and one FP32 per
# tensor). `in_memory_bytes`: the arrays as qwix runs them
# (BF16 scales; 4-bit elements take a byte each where the backend stores them so).

# %%
mem = A.bytes_table(df)
mem if len(mem) else "no memory records in the committed records"

# %% [markdown]
# ## 4. Speed beside BF16
#
# Tokens per second of each format and of BF16 timed in the same run, and their ratio, one row
# of the figure per accelerator, titled with the 8-bit format it multiplies natively (B6 judges
# speed on the machine its accuracy was measured on). A hollow, hatched bar: the record says
# `emulated` (its compiled program did not run the quantized products natively), not a speed.
# `lowering`: how the compiled program ran the quantized products (`cublaslt-f8`,
# `fused-f8-dot`: FP8 tensor cores; `s8-gemm`: INT8 tensor cores; `fused` / `reduce` / `pallas`
# / `separate`: whether a weight-only format's 1-byte weights were widened inside the GEMM
# kernel, inside the one-row reduction (shown wherever one of the program's products is one),
# in a Pallas kernel, or by a kernel before it);
# `emulated` rows measure something else and are not evidence. `program_bytes`: the compiled
# program's buffers (arguments + outputs + temporaries).

# %%
def plot_speed(spd):
    """One row per machine (each its best evidence: full profile where it has one), one panel
    per config that machine timed: no machine shows an empty panel for another's config. An
    emulated bar (the format did not run natively there) is hollow and labelled so."""
    spd = pd.concat([A.best_evidence(g) for _, g in spd.groupby("hardware")])
    spd = spd.assign(where=spd["phase"] + "\nbatch " + spd["batch"].astype(str))
    rows = {h: sorted(spd[spd["hardware"] == h]["config"].unique(), key=str)
            for h in plotstyle.hardware_order(spd["hardware"])}
    ncols = max(len(c) for c in rows.values())
    fig, axes = plt.subplots(len(rows), ncols, figsize=(4.8 * ncols, 3.6 * len(rows)),
                             squeeze=False)
    order = [f for f in X.FORMATS if f in set(spd["format"])] + sorted(
        set(spd["format"]) - set(X.FORMATS))
    for axrow, (hw, configs) in zip(axes, rows.items()):
        for ax, config in zip(axrow, configs):
            d = spd[(spd["hardware"] == hw) & (spd["config"] == config)]
            wheres = list(d.sort_values(["phase", "batch"])["where"].unique())
            fmts = [f for f in order if f in set(d["format"])]
            width = 0.8 / len(fmts)
            for k, fmt in enumerate(fmts):
                for r in d[d["format"] == fmt].itertuples():
                    c = plotstyle.color(fmt)
                    ax.bar(wheres.index(r.where) - 0.4 + (k + 0.5) * width, r.speedup, width,
                           color="none" if r.emulated else c, edgecolor=c,
                           hatch="//" if r.emulated else None,
                           label=fmt + (" (emulated)" if r.emulated else ""))
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xticks(range(len(wheres)), wheres, fontsize=7)
            ax.set(xlabel="phase, batch (sequences)", ylabel="tokens/s vs BF16 (x)",
                   title=f"{plotstyle.hardware_title(hw)}\n{config}")
        # one legend per machine, right of its last panel: the formats of its row
        handles = {lab: hnd for ax in axrow[:len(configs)]
                   for hnd, lab in zip(*ax.get_legend_handles_labels())}
        axrow[len(configs) - 1].legend(handles.values(), handles.keys(), fontsize=7,
                                       loc="upper left", bbox_to_anchor=(1.02, 1))
        for ax in axrow[len(configs):]:
            ax.set_visible(False)  # this machine timed fewer configs
    fig.suptitle("Tokens/s vs BF16 timed in the same run, per machine (hollow, hatched: "
                 "emulated there, not a speed)")
    return fig


def rounded(spd):
    return spd.assign(speedup=spd["speedup"].round(2), tokens_per_s=spd["tokens_per_s"].round(0),
                      bf16_tokens_per_s=spd["bf16_tokens_per_s"].round(0)
                      ).drop(columns=["git_commit"])


spd = A.speed_table(df)
fast = plotstyle.accelerators(spd)  # speed: a CPU's records left out
fig = plot_speed(fast) if len(fast) else notebook.empty_figure("Tokens/s vs BF16",
                                                               nb.why_empty(df))
nb.save(fig, "11_inference_speed", df)
rounded(spd) if len(spd) else "no speed records in the committed records"

# %% [markdown]
# ## Pipeline check (smoke profile)
#
# On a smoke run the records made above (the tiny model, two seeds, on this machine) go through
# the same tables into `build/figures/`: they show that the pipeline runs, not how the formats
# serve.

# %%
if nb.profile == "smoke":
    smoke = nb.smoke_records(I.EXPERIMENT)
    s_acc, s_spd = A.accuracy_table(smoke), A.speed_table(smoke)
    if len(s_acc):
        nb.save(plot_accuracy(s_acc), "11_inference_accuracy", smoke)
        display(percent(s_acc))
    if len(s_spd):
        nb.save(plot_speed(s_spd), "11_inference_speed", smoke)
        display(rounded(s_spd))
    display(A.bytes_table(smoke))

# %% [markdown]
# ## Conclusion
#
# What the committed records say (filled in from the computed verdict; its numbers, per
# format the accuracy gap and its interval's upper end, the weight bytes over BF16's and the
# speedups at its widest config timed, with that config's `d_model`, also go to
# `metrics/11_inference.json`):

# %%
# B6's rule changed after its first records: the key number says when, and gives the verdict
# under the rule as first registered (fp8 at d_model 4096) from the same tables. Speed records
# left out as stale make the speed part say "stale", not "not measured".
# Its tables come from its ledger set alone (the tables above draw every fresh cell).
left = nb.ledger(pd.concat(nb.left_out, ignore_index=True) if nb.left_out else pd.DataFrame(),
                 "B6")
stale_speed = int(left["metric"].isin(["prefill_tokens_per_s", "decode_tokens_per_s"]).sum()) \
    if len(left) else 0
b6_cells = nb.ledger(df, "B6")
b6_tables = (A.accuracy_table(b6_cells), A.bytes_table(b6_cells), A.speed_table(b6_cells))
v = registration.judged(verdicts.b6, "B6", *b6_tables, records=df, stale_speed=stale_speed)
nb.conclusion(dataclasses.replace(v, numbers={**A.key_numbers(*b6_tables),
                                              "registration": v.numbers["registration"]}))
