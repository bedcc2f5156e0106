# %% [markdown]
# # 09 · PPO speed: against PureJaxRL, and where the update's time goes
#
# **Two benchmark questions** about the PPO of this repository (`repro.models.ppo`), beside
# the claims of notebook 03:
#
# 1. **Is it as fast as the reference implementation?** PureJaxRL's `ppo.py` is the usual
#    JAX PPO. Target: at least **1.2x** its env-steps/s on its own CartPole-v1 configuration,
#    for 1 seed and for 1024 seeds under `vmap`, on the same device, while learning as well,
#    with the default options, and the first result (compile + one run in a fresh process) no
#    later than PureJaxRL's. Where actor and critic share no parameter, our rollout runs the
#    actor alone and the critic values the whole rollout in one batched pass afterwards; the
#    rollout's random numbers are drawn before its loop.
# 2. **How fast can an FP8 update be?** Target: the PPO update of the 4096-wide MLP at least
#    **1.5x** faster in FP8 than in BF16. Kernel traces split the update into GEMM kernels
#    (which FP8 speeds up) and everything else, and Amdahl's law bounds what FP8 can gain.
#
# **Method.** `repro.experiments.rl_purejaxrl.measure` times both programs alternately in one
# process, each cell one option set of ours against PureJaxRL (records under
# `results/<hw>/rl_purejaxrl/`; PureJaxRL is not redistributed: `repro record rl_purejaxrl
# --purejaxrl DIR --profile full` with a checkout of it). Each cell also times both programs'
# first result in a fresh process (compile + one run, no compile caches: what a user waits for
# before one run's numbers). Ours runs with several option sets (`params.yaml`
# `rl_purejaxrl.ours`): `unroll` / `update_unroll` unroll the rollout scan / the epoch and
# minibatch scans (the same arithmetic), `prng` picks another JAX PRNG (other random streams).
# `repro.experiments.kernel_times.measure ppo` traces the compiled update kernel by kernel.
#
# **PureJaxRL's imports.** `ppo.py` imports `distrax` and its `wrappers.py` imports `brax` and
# `navix`; the lock installs none of them (distrax does not import under current JAX). The recorded
# PureJaxRL ran with this repository's stand-ins for them
# (`repro.experiments.rl_purejaxrl.measure`): a `distrax.Categorical` written as distrax writes
# it (`jax.random.categorical`, `log_softmax`), and for `brax` and `navix` empty modules
# (CartPole uses none of their wrappers); gymnax 1.0's steps are seen as gymnax 0.x's. Each
# record lists its adapters (`extra.adapters`), printed below.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import textwrap

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from repro import notebook
from repro.analysis import rl as rl_analysis
from repro.experiments.kernel_times import tables as traces
from repro.experiments.rl_purejaxrl import measure as purejaxrl

nb = notebook.start("09_ppo_speed", None, profile, scratch)
TARGET_VS_PUREJAXRL, TARGET_FP8_UPDATE = 1.2, 1.5
pj_records = nb.records(purejaxrl.EXPERIMENT)
pj = rl_analysis.purejaxrl_speedups(pj_records)
table = rl_analysis.throughput_table(nb.records("rl_throughput"))
kt = nb.records("kernel_times")
kernels = traces.update_kernels(kt)
print(f"{len(pj)} PureJaxRL cells, {len(kernels)} traced updates")
adapters = sorted({a for e in (pj_records["extra"] if len(pj_records) else [])
                   for a in (e.get("adapters") or [] if isinstance(e, dict) else [])})
print("PureJaxRL ran with: " + ("; ".join(adapters) if adapters else "no adapter recorded"))

# %% [markdown]
# ## 1. Against PureJaxRL
#
# One row per cell: `speedup` is the median of the per-repeat ratios' env-steps/s, `min`/`max`
# their range. `best` marks the fastest option set per seed count: picking the best of several
# after timing them is biased upwards by the timing noise, so every row is shown, and a pick
# counts only once a later run confirms it (`--only OPTIONS --again` records a second run).
# `same_returns`: whether an option set that keeps the random streams gave bitwise the
# defaults' returns in the same process. Where it does not (an unrolled loop is fused
# differently, so float sums round in another order), the final returns are the check that it
# learns as well: `return_gap` is ours minus PureJaxRL's mean final return (the episode-weighted
# mean over the last 10% of updates, `ppo.final_return`), with a Welch 95% interval over seeds.

# %%
cols = ["hardware", "seeds", "ours", "run", "speedup", "min", "max", "best", "same_returns",
        "final_return", "purejaxrl final_return", "return_gap", "gap_lo", "gap_hi"]
pj[cols].round(3) if len(pj) else "no PureJaxRL records yet"

# %% [markdown]
# **Time to the first result.** The rates above are of runs after the first; a user of one run
# also waits for its compilation. Cells recorded with first-result timing (the others show no
# row) ran each program once more in a fresh Python process with no compile caches:
# `repro first s` / `purejaxrl first s` is compile + one training run, `first ratio`
# PureJaxRL's over ours (>= 1: ours has its numbers no later). Unrolling speeds up the runs and
# slows down compilation.

# %%
first = rl_analysis.purejaxrl_first_results(pj_records)
(first.drop(columns=["commit"]).round(3) if len(first)
 else "no first-result records yet")

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
ax = axes[0]
if len(pj):
    sets = list(dict.fromkeys(pj.ours))
    for k, (seeds, g) in enumerate(pj.groupby("seeds")):
        y = [sets.index(o) + 0.2 * (k - 0.5) for o in g.ours]
        dots = ax.scatter(g.speedup, y, zorder=3, label=f"{seeds} seed(s)")
        ax.hlines(y, g["min"], g["max"], color=dots.get_facecolor()[0], lw=2, alpha=0.5)
    ax.set_yticks(range(len(sets)), [o.removeprefix("repro[").removesuffix("]") if o != "repro"
                                     else "defaults" for o in sets], fontsize=7)
    ax.legend()
ax.axvline(TARGET_VS_PUREJAXRL, ls="--", color="k", lw=1)
ax.axvline(1.0, color="grey", lw=0.8)
ax.set(xlabel="env-steps/s of ours / PureJaxRL's (x; bars: per-repeat range)",
       ylabel="option set of ours",
       title=f"Against PureJaxRL on CartPole-v1 (dashed: {TARGET_VS_PUREJAXRL}x target)")
ax = axes[1]
if len(kernels):
    k = kernels.reset_index()
    k = k[k.width == k.width.max()]
    labels = [f"{r.recipe}\n{r.hardware}" for r in k.itertuples()]
    ax.bar(labels, k["gemm ms"], label="GEMM kernels")
    ax.bar(labels, k["kernel ms"] - k["gemm ms"], bottom=k["gemm ms"],
           label="other kernels (quantization, elementwise, optimizer)")
    ax.set_title(f"One PPO update, MLP width {int(k.width.iloc[0])}: traced device time")
    ax.legend(fontsize=7)
    ax.set_ylabel("device time per update (ms)")
else:  # no panel without data: it says in words why it has none
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(nb.why_empty(kt), 50), ha="center", va="center",
            color="0.3", transform=ax.transAxes)
    ax.set_title("One PPO update: traced device time")
shown = [d for d in (pj_records, kt) if len(d)]
nb.save(fig, "09_ppo_speed", pd.concat(shown) if shown else None)

# %% [markdown]
# **Which option set to turn on?** One that meets the target at every seed count timed on a
# hardware, in every run, AND learns at least as well as PureJaxRL there: the lower end of its
# return-gap interval above minus 1% of the environment's maximum return (5 for CartPole-v1's
# 500). Such a set is a *candidate* after one run and *recommended* once a second run confirms
# its speed. `repro.models.ppo.PPOConfig`'s defaults are what a user gets without options:
# `unroll` 2 (same arithmetic as 1) and no `update_unroll` or `prng` change; the row `repro`.
# PureJaxRL treats CartPole's 500-step time limit
# as a termination (no bootstrap through truncation, which ours does); that may explain part of
# a return gap, and no run here isolates it.

# %%
rl_analysis.purejaxrl_options(pj, TARGET_VS_PUREJAXRL, tolerance=5.0)

# %% [markdown]
# ## 2. The FP8 update of the 4096-wide MLP
#
# Update speedup over BF16 (same hardware and batch, cells of one GPU call, native FP8 only).
# Besides the two FP8 recipes (first layer and heads in BF16), the variant `fp8-all-layers`
# puts those layers in FP8 too: it counts only if it keeps quality in notebook 04 and is faster
# than `fp8-delayed`.

# %%
sp = rl_analysis.fp8_speedups(table, (*rl_analysis.FP8_RECIPES, "fp8-all-layers"))
wide = (sp[(~sp.emulated) & (sp.baseline == "bf16") & (sp.network == "mlp") & (sp.width == 4096)
           & sp.same_commit] if len(sp) else sp)
if len(wide):
    wide = wide.assign(meets=wide["update"] >= TARGET_FP8_UPDATE)
    display(wide[["hardware", "recipe", "num_envs", "update", "e2e", "meets"]].round(3))
else:
    print("not yet measured on hardware with FP8 tensor cores")
nb.metrics(
    vs_purejaxrl={f"{h}_seeds{s}": g["speedup"].max()
                  for (h, s), g in (pj.groupby(["hardware", "seeds"]) if len(pj) else [])},
    first_result_vs_purejaxrl={f"{h}_seeds{n}_{o}": v for h, n, o, v in zip(
        first.hardware, first.seeds, first.ours, first["first ratio"])},
    fp8_update_w4096={f"{r.hardware}_{r.recipe}_e{int(r.num_envs)}": {"update": r.update,
                                                                      "e2e": r.e2e}
                      for r in wide.itertuples()})

# %% [markdown]
# **Where the time goes.** Per traced update (ms): GEMM kernels, other kernels, and Amdahl's
# law over them (`repro.experiments.kernel_times.tables.headroom`): `gemm x` is how much faster
# FP8 makes the GEMMs, `bound` the update speedup FP8 would reach if it added nothing outside
# the GEMMs, `added ms` the non-GEMM time it adds (amax reductions, converts, FP8 operand
# transposes) and `allowed ms` the non-GEMM time an FP8 update may spend and still be 1.5x
# BF16's. A trace's kernel sum differs a little from the timed update, so the target itself is
# judged on the timings above. The costliest non-GEMM kernels of each FP8 update follow.

# %%
amdahl = traces.amdahl_table(kernels, target=TARGET_FP8_UPDATE)
display(kernels.round(3) if len(kernels) else "no kernel traces of the PPO update yet")
display(amdahl.round(3) if len(amdahl) else "no BF16/FP8 pair of traces yet")
traces.top_other_kernels(kt).round(2)

# %% [markdown]
# ## Conclusion
#
# Each line below is computed from the records above.

# %%
lines = []
for (hw, seeds), g in (pj.groupby(["hardware", "seeds"]) if len(pj) else []):
    b = g.loc[g.speedup.idxmax()]
    met = "meets" if b.speedup >= TARGET_VS_PUREJAXRL else "misses"
    lines.append(f"- {hw}, {seeds} seed(s): fastest option set `{b.ours}` at {b.speedup:.3f}x "
                 f"PureJaxRL's env-steps/s ({met} the {TARGET_VS_PUREJAXRL}x target; best of "
                 f"{g.ours.nunique()} option sets).")
for r in (pj[pj.ours == "repro"].itertuples() if len(pj) else []):
    f = first[(first.hardware == r.hardware) & (first.seeds == r.seeds)
              & (first.ours == r.ours) & (first.run == r.run)]
    when = (f", first result {f['repro first s'].iloc[0]:.1f} s vs PureJaxRL's "
            f"{f['purejaxrl first s'].iloc[0]:.1f} s" if len(f) else "")
    met = "meets" if r.speedup >= TARGET_VS_PUREJAXRL else "misses"
    lines.append(f"- {r.hardware}, {r.seeds} seed(s), defaults (run {r.run}): {r.speedup:.3f}x "
                 f"PureJaxRL's env-steps/s (repeats {r.min:.3f}-{r.max:.3f}; {met} the "
                 f"{TARGET_VS_PUREJAXRL}x target){when}.")
for r in rl_analysis.purejaxrl_options(pj, TARGET_VS_PUREJAXRL).itertuples():
    if r.status != "option":
        lines.append(f"- {r.hardware}: `{r.options}` is {r.status} ({r.why}).")
for r in (wide.itertuples() if len(wide) else []):
    lines.append(f"- {r.hardware}, {r.recipe}, {r.num_envs} envs: the 4096-wide FP8 update is "
                 f"{r.update:.2f}x BF16's ({'meets' if r.meets else 'misses'} the "
                 f"{TARGET_FP8_UPDATE}x target).")
for _, r in (amdahl.iterrows() if len(amdahl) else []):
    lines.append(f"- {r.hardware}, width {r.width}, {r.recipe}: the GEMMs run "
                 f"{r['gemm x']:.2f}x faster; without added non-GEMM time the update could "
                 f"reach {r.bound:.2f}x.")
Markdown("\n".join(lines) or "No records yet.")
