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
# # 10 · Claim A11: does FP8 matter for legged-robot RL on GPU physics?
#
# **The claim** (seed article on end-to-end FP8 RL): FP8 "matters for compute-heavy RL such as
# legged-robot training (Isaac Lab)". Isaac Lab is Isaac Sim with PyTorch and does not run
# here; the JAX world has the same workload: MuJoCo MJX physics, brax's environments and MuJoCo
# Playground's locomotion suite, trained with PPO entirely on the GPU. The question is where
# FP8 pays when every environment step also costs a physics step that no precision recipe
# touches.
#
# **Method.** Continuous-action PPO (`repro.models.ppo_continuous`: Gaussian policy with a
# learned log standard deviation, running observation normalisation, reward scaling, the clipped
# loss, GAE and truncation bootstrap of `repro.models.ppo`) on brax's ant with MJX physics
# (`repro.models.envs`). The study (`repro.studies.legged`, `repro record legged`) measures:
#
# * **physics alone**: env-steps/s of a scanned rollout with random actions, per number of
#   environments and per matmul precision of the physics (JAX's default, i.e. TF32 on NVIDIA
#   GPUs, vs "highest"); and of the step called from Python, with its first two calls;
# * **speed**: the whole PPO loop (one seed) per policy size and recipe, and its parts per
#   update timed as separate programs: physics (from the physics cells), the policy's rollout
#   work, the update, and the rest;
# * **quality**: final return per seed (mean return over the last 10% of training), seeds under
#   `jax.vmap`, FP32 / BF16 / FP8 at brax's ant sizes (4 x 32 policy, 5 x 256 value) and at a
#   wide size, scored as in notebook 04: normalised to (random, FP32) and compared by the
#   probability of improvement with a 95% stratified-bootstrap interval (rliable);
# * **a peer**: brax's own PPO trainer against ours at equal settings in one process.
#
# Regenerate: `dvc repro legged` (or `repro notebook 10_legged --profile smoke`); H200 records:
# `repro record legged --profile full`. The smoke profile is a CPU pipeline check, never evidence.

# %% tags=["parameters"]
profile = "smoke"

# %%
import importlib.util
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro import results, studies
from repro.analysis import legged as A
from repro.claims import ledger as claims
from repro.config import resolve_profile, stage_params

profile = resolve_profile(profile)
P = stage_params("legged", profile)
HAVE_PHYSICS = all(importlib.util.find_spec(m) for m in ("brax", "mujoco"))
if profile == "smoke" and HAVE_PHYSICS:  # full-profile records are made on the GPU
    from repro.studies import legged as study

    written = studies.record("legged", "smoke").written
    print(f"smoke: wrote {len(written)} cell(s) under {results.record_root('smoke')}")
elif not HAVE_PHYSICS:
    print("brax / mujoco are not installed (pip install 'repro[legged]'): committed records only")
df = results.load_records("legged")
ev = A.evidence(df)
shown = ev if len(ev) else df  # figures: the GPU evidence where it exists, else the smoke
what = "full profile, GPU" if len(ev) else "CPU smoke: a pipeline check, not evidence"
FIG = Path("figures")
FIG.mkdir(exist_ok=True)
print(f"{len(df)} records; {len(ev)} of them evidence (full profile, GPU)")

# %% [markdown]
# ## Physics alone
#
# `physics_env_steps_per_s`: a jitted `lax.scan` of steps with random actions, as training runs
# them. `loop_env_steps_per_s`: the jitted batched step called from Python, after two timed
# calls. A `second_call_s` close to `first_call_s` means the second call compiled again: brax's
# reset state and its step state differ in weak types (`done` and two metrics), so a loop that
# warms up with one call and then times a few calls divides a compilation by the number of
# steps. `physics_dots`: the precisions of the physics' matrix products in the lowered step.

# %%
phys = A.physics_table(df)
phys

# %% [markdown]
# ## Speed: where the PPO loop's time goes, and what FP8 changes
#
# Per update (ms): physics (the physics cell's rate at the same number of environments),
# the policy's rollout work, the update (4 epochs of minibatches), and the rest. FP8/BF16:
# ratio of env-steps/s for the whole loop and of times for the update alone; only cells
# recorded in one call (`same_commit`) and not emulated count for the verdict.

# %%
speed = A.speed_table(shown)
ups = A.speedups(speed)
cols = ["hardware", "size", "width", "recipe", "env_steps_per_s", "loop_ms_per_update",
        "physics_ms", "policy_ms_per_update", "update_ms", "other_ms", "physics_share",
        "emulated"]
display(speed.reindex(columns=cols).round(2) if len(speed) else "no speed records")
ups.round(3) if len(ups) else "no FP8/BF16 pairs"

# %%
fig, ax = plt.subplots(1, 2, figsize=(11, 4))
if len(speed):
    parts = ["physics_ms", "policy_ms_per_update", "update_ms"]
    names = ["physics", "policy (rollout)", "update"]
    lab = [f"{r.size}\n{r.recipe}" for r in speed.itertuples()]
    bottom = np.zeros(len(speed))
    for col, name in zip(parts, names):
        v = speed[col].fillna(0).to_numpy()
        ax[0].bar(lab, v, bottom=bottom, label=name)
        bottom += v
    ax[0].plot(lab, speed.loop_ms_per_update, "k_", ms=18, label="whole loop (measured)")
    ax[0].set(ylabel="ms per PPO update", title="Where an update's time goes")
    ax[0].tick_params(axis="x", labelsize=7)
    ax[0].legend(fontsize=8)
if len(ups):
    for r, g in ups.groupby("recipe"):
        g = g.sort_values("width")
        ax[1].plot(g.width, g.e2e, "o-", label=f"{r}: whole loop")
        ax[1].plot(g.width, g["update"], "s--", label=f"{r}: update alone")
    ax[1].axhline(A.PAYS, color="grey", lw=0.8, ls=":")
    ax[1].axhline(1.0, color="grey", lw=0.8)
    ax[1].set_xscale("log", base=2)
    ax[1].legend(fontsize=8)
ax[1].set(xlabel="widest hidden layer", ylabel="speedup over BF16 (x)", title="FP8 / BF16")
fig.suptitle(f"PPO on ant (MJX physics) -- {what}", fontsize=10)
fig.tight_layout()
fig.savefig(FIG / "10_legged_speed.png", dpi=130)

# %% [markdown]
# ## Quality: FP8 and BF16 against FP32
#
# Per policy size: seeds, mean final return, mean normalised score ((return - random) /
# (FP32 mean - random)) and P(recipe > FP32) with its 95% interval. "Not worse" (the rule of
# the other RL quality claims): the interval's upper end reaches 0.5.

# %%
qual = A.quality_table(shown)
display(qual.round(3) if len(qual) else "no quality records")
curves = shown[shown.metric == "final_return"] if len(shown) else shown
fig, ax = plt.subplots(figsize=(7, 4))
for (size, v), g in (curves.groupby([curves.sizes.map(lambda s: s.get("size")),
                                     curves.extra.map(lambda e: e["variant"])])
                     if len(curves) else []):
    c = np.nanmean(np.array([[np.nan if x is None else x for x in e["curve"]]
                             for e in g.extra], float), axis=0)
    ax.plot(np.linspace(0, 1, len(c)), c, label=f"{size}, {v} ({len(g)} seeds)")
ax.set(xlabel="fraction of training", ylabel="mean episode return",
       title=f"Learning curves, ant (MJX) -- {what}")
if len(curves):
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIG / "10_legged_quality.png", dpi=130)

# %% [markdown]
# ## brax's PPO trainer as a peer
#
# brax's `ppo.train` and ours at equal settings (one rollout of every environment per update,
# the same sizes and PPO constants, a Gaussian policy with a learned state-independent standard
# deviation, the value loss clipped, actions clipped to [-1, 1] at the environment, float32
# products at JAX's default precision: recipe `tf32`), one after the other in one process:
# env-steps/s (brax: its epochs after the first two, which compile; ours: a run after compiling)
# and the evaluation return (one episode per environment, stochastic policy). Differences that
# remain: brax folds each rollout into its observation statistics before the update's
# gradient steps, ours after them (the update then sees what the policy saw); at a time-limit
# end brax zeroes that step's TD error, ours bootstraps from the final observation. Target:
# ours at least as fast, with an equal or better return.

# %%
peer = shown[shown.sizes.map(lambda s: "impl" in s)] if len(shown) else shown
if len(peer):
    peer = peer.assign(impl=peer.sizes.map(lambda s: s["impl"]),
                       seed=peer.sizes.map(lambda s: s["seed"]))
    display(peer.pivot_table(index=["hardware", "seed"], columns=["metric", "impl"],
                             values="value").round(1))
else:
    print("no peer records (the smoke profile skips brax's trainer)")

# %% [markdown]
# ## Verdict A11 (computed)
#
# From GPU records of the full profile only (a CPU smoke run gives "not yet measured"). FP8
# *pays* at a policy size when its whole PPO loop reaches >= 1.1x BF16's env-steps/s (the
# threshold notebook 03 uses for "faster"), in cells recorded in one call and not emulated;
# FP8's quality *holds* at a size when it is not worse than FP32 over >= 8 seeds. The
# crossover is the smallest measured width from which FP8 pays at every wider size.
# **reproduced**: FP8 pays at the standard (narrowest) size and its quality holds;
# **partly**: it pays only from a wider crossover on, or its quality does not hold;
# **contradicted**: it pays at no measured size.

# %%
ev_speed = A.speedups(A.speed_table(ev)) if len(ev) else A.speedups(pd.DataFrame())
v = A.a11_verdict(ev_speed, A.quality_table(ev))
print(f"A11: {v['verdict']} | {v['key_number']}")
claims.write_verdict("A11", v["verdict"], v["key_number"], v["hardware"], v["source"],
                     note=v["note"] + f"; {profile} profile")

# %% [markdown]
# ## Conclusion
#
# The verdict above is computed from the records; its key number names, per policy size, the
# FP8/BF16 speedup of the whole loop and of the update alone, the physics' share of the BF16
# loop, the crossover width (or that none was reached) and whether FP8's return held against
# FP32.
