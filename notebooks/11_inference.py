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
# **Method** (`repro/studies/inference.py`, parameters in `params.yaml`, section `inference`).
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
#   (`repro.models.lm_decode`) at several batch sizes. Two configs: the trained `20m` shape
#   and a wide one (`d_model` 4096, speed only). Every speed record carries a **lowering
#   check** of its compiled program: FP8 must become cuBLASLt's FP8 GEMM or an f8 × f8 dot in a
#   fusion, INT8 an `s8 × s8 → s32` product; otherwise (and for NVFP4 on Hopper, and on CPUs)
#   it is `emulated` and left out of the speed verdict.
# * *Memory.* Exact bytes of the exported weights (4-bit elements two to a byte, NVFP4 block
#   scales in E4M3), their bytes as the arrays run, the orbax checkpoint on disk, and the
#   compiled programs' buffer bytes (XLA's memory analysis).
#
# **Profiles.** `smoke` (default; CPU, under a minute): the 0.14M-parameter `tiny` model for a
# few dozen steps, two seeds, every format exported and evaluated, the decoder timed for two
# formats: a pipeline check, not evidence. `full` (an H200, recorded into `results/`): the
# `20m` model trained for 1200 steps, three seeds, and both speed configs.
#
# Regenerate: `dvc repro inference` (or `repro notebook 11_inference --profile smoke`); the GPU
# study: `python3 -m repro.cli record inference --profile full` (resumable; with
# `REPRO_TIME_BUDGET_S` it stops cleanly between cells), then commit `results/`.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook a fresh folder)

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from repro import config, hardware, results, studies
from repro.analysis import inference as A
from repro.claims import ledger as claims
from repro.precision import export as X
from repro.studies import inference as I

P = config.stage_params("inference", profile)
results.use_scratch(scratch)
HW = hardware.detect()
FIG = Path("figures")
FIG.mkdir(exist_ok=True)
sns.set_theme(style="whitegrid", context="notebook")
MARGINS = {k: float(v) for k, v in (P.get("margins") or A.MARGINS).items()}
print(f"profile={P['profile']}  hardware={HW.slug}  formats={P['formats']}")

# %% [markdown]
# ## 1. The formats, and MaxText's names for them
#
# `gemm`: what the quantized products compute in on a GPU with the format's tensor cores
# (`dequant-bf16`: weight-only, dequantized to BF16 before a BF16 GEMM). `MaxText`: the values
# of MaxText's `quantization` flag whose forward pass is the same (from `quantizations.py`:
# `int8` and `fp8`/`fp8_full` are qwix rules with INT8 / E4M3 weights and activations, per
# channel by default; `fp8_gpu` wraps flax's `Fp8DirectDotGeneralOp`, our `flax-fp8`; AQT's
# `int8w` is weight-only INT8). `fp8_full` differs from `fp8` only in its backward pass
# (E5M2 gradients), which inference never runs.

# %%
fmt_table = pd.DataFrame([{"format": f.name, "weights": f.weight or "bf16",
                           "activations": f.act or "bf16", "runs under recipe": f.recipe,
                           "gemm": f.gemm, "Hopper tensor cores": f.hopper,
                           "MaxText": f.maxtext or "-", "what": f.about}
                          for f in X.FORMATS.values() if f.name in P["formats"]])
fmt_table

# %% [markdown]
# ## 2. Record
#
# In the smoke profile this runs the study on this machine into `build/results/`; the full
# profile is recorded on a GPU and committed to `results/` (this notebook does not rerun it).

# %%
if P["profile"] == "smoke":
    written = studies.record("inference", "smoke", progress=False).written
    print(f"wrote {len(written)} cells")
df = results.load_records(I.EXPERIMENT)
print(f"{len(df)} {I.EXPERIMENT} records from {df['hardware'].nunique() if len(df) else 0} "
      "machine(s)")
if len(df):
    display(df.groupby(["hardware", "profile"])["git_commit"].unique()
            .rename("recorded at commit(s)").to_frame())

# %% [markdown]
# ## 3. Accuracy against BF16
#
# The tables list every machine and profile recorded; the figures and the verdict use the best
# evidence (full profile over smoke, a GPU over a CPU: `A.best_evidence`). Which checkpoint each
# seed used (the step of its best held-out loss, out of the run's
# evaluations), then the comparison. `rel_gap`: held-out loss / BF16's − 1, mean over seeds,
# with its 95 % interval; `within_margin`: the interval's upper end is within the format's
# declared margin (`params.yaml`: FP8 0.5 %, INT8 1 %, the B6 targets).

# %%
acc = A.accuracy_table(df, MARGINS)
runs = ["hardware", "profile", "size_seed"]
curves = df[df["metric"] == "heldout_loss"].drop_duplicates(runs) if len(df) else df
if len(curves):
    display(pd.DataFrame([{"hardware": r.hardware, "profile": r.profile,
                           "seed": int(r.size_seed), "best step": r.extra["best_step"],
                           "of steps": int(r.size_steps),
                           "held-out loss by step": r.extra["curve"]}
                          for r in curves.itertuples()]))
show = acc.assign(**{c: (100 * acc[c]).round(3) for c in ("rel_gap", "rel_lo", "rel_hi")})
show.rename(columns={"rel_gap": "gap %", "rel_lo": "lo %", "rel_hi": "hi %"})

# %%
if len(acc):
    plot = A.best_evidence(acc)
    plot = plot[plot["format"] != "bf16"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    y = range(len(plot))
    ax.errorbar(100 * plot["rel_gap"], list(y),
                xerr=[100 * (plot["rel_gap"] - plot["rel_lo"]).fillna(0),
                      100 * (plot["rel_hi"] - plot["rel_gap"]).fillna(0)],
                fmt="o", capsize=3)
    for fmt, m in MARGINS.items():
        ax.axvline(100 * m, ls="--", lw=1, color="grey")
        ax.text(100 * m, 1.01, f"{fmt} margin", fontsize=8, ha="center",
                transform=ax.get_xaxis_transform())
    ax.set_yticks(list(y), plot["format"])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("held-out loss vs BF16 (%), 95% CI over seeds")
    ax.set_title(f"Post-training quantization of the {plot['model'].iloc[0]} LM "
                 f"({plot['profile'].iloc[0]}, {plot['hardware'].iloc[0]})")
    fig.tight_layout()
    fig.savefig(FIG / "11_inference_accuracy.png", dpi=130)

# %% [markdown]
# ## 4. Memory
#
# `ratio_to_bf16`: the whole model's weight bytes (embedding and head stay BF16);
# `ratio_quantized_layers`: over the quantized layers only, the format's own ratio (FP8/INT8
# per-channel: 1 byte per weight plus a BF16 scale per output channel; NVFP4: half a byte plus an
# E4M3 scale per 16 and one FP32 per tensor). `in_memory_bytes`: the arrays as qwix runs them
# (BF16 scales; 4-bit elements take a byte each where the backend stores them so).

# %%
mem = A.bytes_table(df)
mem

# %% [markdown]
# ## 5. Speed beside BF16
#
# Tokens per second of each format and of BF16 timed in the same run, and their ratio.
# `lowering`: how the compiled program ran the quantized products (`cublaslt-f8`,
# `fused-f8-dot`: FP8 tensor cores; `s8-gemm`: INT8 tensor cores; `fused` / `separate`:
# whether a weight-only format's dequantization happened inside the GEMM kernel or before it);
# `emulated` rows measure something else and are not evidence. `program_bytes`: the compiled
# program's buffers (arguments + outputs + temporaries).

# %%
spd = A.speed_table(df)
if len(spd):
    display(spd.assign(speedup=spd["speedup"].round(2),
                       tokens_per_s=spd["tokens_per_s"].round(0),
                       bf16_tokens_per_s=spd["bf16_tokens_per_s"].round(0))
            .drop(columns=["git_commit"]))

# %%
if len(spd):
    plot = A.best_evidence(spd)
    plot = plot.assign(where=plot["phase"] + " b" + plot["batch"].astype(str))
    g = sns.catplot(data=plot, x="where", y="speedup", hue="format", col="config", kind="bar",
                    height=3.2, aspect=1.5, sharex=False)
    for ax in g.axes.flat:
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xlabel("")
    emulated = sorted(plot.loc[plot["emulated"], "format"].unique())
    g.figure.suptitle(f"Tokens/s vs BF16, same run ({plot['profile'].iloc[0]}, "
                      f"{plot['hardware'].iloc[0]}; emulated: {', '.join(emulated) or 'none'})",
                      y=1.03)
    g.figure.savefig(FIG / "11_inference_speed.png", dpi=130, bbox_inches="tight")

# %% [markdown]
# ## 6. Verdict
#
# **B6 rule** (inference half), from full-profile GPU records when there are any: FP8 and INT8
# held-out loss within 0.5 % and 1 % of BF16 (upper end of the 95 % interval, 3 seeds); FP8
# prefill ≥ 1.3× BF16 and weight-only FP8 / INT8 decode at batch 1 ≥ 1.5× at the widest config,
# from records whose products ran on tensor cores; weight-only FP8 / INT8 weights ≤ 0.52× and
# NVFP4 ≤ 0.30× of BF16's bytes. Every part passes: **reproduced**; none: **contradicted**;
# otherwise (a part failed or was not measured, or smoke records only): **partly**.

# %%
b6 = A.b6_verdict(acc, mem, spd, MARGINS)
for part in b6["parts"]:
    print({True: "pass", False: "FAIL", None: "n/a "}[part["ok"]], part["text"])
path = claims.write_verdict("B6", b6["verdict"], b6["key_number"],
                            hardware=b6["hardware"] or HW.slug, source=b6["source"],
                            note=b6["note"], emulated=b6["emulated"])
print(f"B6: {b6['verdict']}\n    {b6['key_number']}\n{path}")
