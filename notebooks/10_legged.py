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
# loss, GAE and truncation bootstrap of `repro.models.ppo`) on brax's ant and MuJoCo
# Playground's Go1 joystick task (`Go1JoystickFlatTerrain`, MJX's JAX implementation, with
# Playground's 512-256-128 networks and reward scale), both with MJX physics
# (`repro.models.envs`). The study (`repro.experiments.legged.measure`, `repro record legged`)
# measures:
#
# * **physics alone**: env-steps/s of a scanned rollout with random actions, per number of
#   environments and per matmul precision of the physics (JAX's default, i.e. TF32 on NVIDIA
#   GPUs, vs "highest"); and of the step called from Python, with its first two calls;
# * **speed**: the whole PPO loop (one seed) per policy size and recipe, and its parts per
#   update timed as separate programs: physics (from the physics cells), the policy's rollout
#   work, the update, and the rest;
# * **quality**: final return per seed (mean return over the last `last_fraction` of training,
#   `params.yaml`), FP32 / BF16 / FP8 at brax's ant sizes, at a wide ant size and at
#   Playground's Go1 size, scored as in
#   notebook 04: normalised to (random, FP32) and compared by the probability of improvement
#   `P(FP8 > FP32)` with a 95% stratified-bootstrap interval (rliable);
# * **a peer**: brax's own PPO trainer against ours at equal settings in one process.
#
# **Decision rule** (`repro.claims.verdicts.a11`), from committed full-profile GPU records
# only. FP8 (`fp8-delayed`) *pays* at a policy size when its whole PPO loop, physics included,
# reaches at least 1.1x BF16's env-steps/s (the threshold of "faster" in notebook 03), counting
# only pairs of cells recorded in one call and not emulated. Its quality is a parity claim, as
# A5, A6 and A10: per environment at a size with at least 8 seeds (judged at the longest
# training recorded for that width, each recipe against FP32 trained as long; not judged where
# FP32 did not beat the random policy, since then nothing learned) it is *kept* if the 95% interval
# of `P(FP8 > FP32)` lies at or above the low end of A11's equivalence margin [0.4, 0.6]
# (`repro/data/claims.yaml`), *lost* if it lies below, undecided if it straddles it. The
# *crossover* is the smallest measured width from which FP8 pays at every wider one.
# **reproduced**: FP8 pays at the narrowest (standard) size and its quality is kept wherever
# measured; **inconclusive**: it pays there, nothing lost, an interval too wide to tell;
# **partly**: it pays only from a wider crossover on, or its quality is lost or unmeasured;
# **contradicted**: it pays at no measured size; **not yet measured**: no such records.
#
# Regenerate: `dvc repro legged` (or `repro notebook 10_legged --profile smoke`); H200 records:
# `repro record legged --profile full`. The smoke profile is a CPU pipeline check, never evidence.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import dataclasses
import importlib.util

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from repro import notebook, plotstyle
from repro.analysis import rl as rl_analysis
from repro.analysis import stats
from repro.claims import registration, verdicts
from repro.experiments.legged import rules as legged_rules
from repro.experiments.legged import tables as A

nb = notebook.start("10_legged", "legged", profile, scratch)
HAVE_PHYSICS = all(importlib.util.find_spec(m) for m in ("brax", "mujoco"))
if nb.profile == "smoke" and HAVE_PHYSICS:  # a pipeline check on this machine: scratch records
    nb.record_smoke(A.EXPERIMENT)
elif not HAVE_PHYSICS:
    print("brax / mujoco are not installed (pip install 'repro[legged]'): committed records only")
df = A.evidence(nb.records(A.EXPERIMENT))  # committed full-profile records made on a GPU
print(f"A11's margin (repro/data/claims.yaml): {verdicts.margin('A11')}; "
      f"FP8 pays from {legged_rules.PAYS}x BF16")
print(f"{len(df)} committed full-profile GPU records" if len(df) else
      "no committed full-profile GPU records yet: the tables below are empty and A11 reads "
      "'not yet measured'")

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
physics = A.physics_table(df)
physics if len(physics) else "no physics records in the committed records"

# %% [markdown]
# ## Speed: where the PPO loop's time goes, and what FP8 changes
#
# Per update (ms): physics (the physics cell's rate at the same number of environments), the
# policy's rollout work, the update (its epochs of minibatches), and the rest. FP8/BF16: ratio
# of env-steps/s for the whole loop (`e2e`) and of times for the update alone (`update`); only
# cells recorded in one call (`same_commit`) and not emulated count for the verdict. A diamond
# is a paired cell (`timing` "paired"): the recipes compiled together and timed in rounds, the
# median of the per-round ratios with their range; where a hardware has paired cells, A11's
# speed is judged from them alone.

# %%
COLS = ["hardware", "size", "width", "recipe", "env_steps_per_s", "loop_ms_per_update",
        "physics_ms", "policy_ms_per_update", "update_ms", "other_ms", "physics_share",
        "emulated"]


KEYS = ["hardware", "env", "size", "width", "num_envs", "num_steps", "recipe"]


def loop_ranges(df, speed):
    """Per speed row: the range of the whole loop's time per update over the timed calls,
    from the env-steps/s record of its cell (a rate: its slowest call is the longest loop)."""
    d = df[(df.metric == "env_steps_per_s") & df["sizes"].map(lambda s: "size" in s)
           & ~df["extra"].map(rl_analysis.is_paired)] if len(df) and len(speed) else df.iloc[:0]
    if not len(d):
        return speed.assign(loop_lo=np.nan, loop_hi=np.nan)
    d = stats.round_range(d)
    for k in KEYS[1:-1]:
        d[k] = d["sizes"].map(lambda s, k=k: s.get(k))
    d = d.groupby(KEYS, as_index=False).agg(value=("value", "last"), lo=("lo", "last"),
                                            hi=("hi", "last"))
    m = speed.merge(d, on=KEYS, how="left")
    return speed.assign(loop_lo=(m.loop_ms_per_update * m.value / m.hi).to_numpy(),
                        loop_hi=(m.loop_ms_per_update * m.value / m.lo).to_numpy())


def plot_speed(speed, ups, df):
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    if len(speed):
        speed = loop_ranges(df, speed)
        lab = [f"{r.env[:3]} {r.size}\n{r.recipe}" for r in speed.itertuples()]
        bottom = np.zeros(len(speed))
        for col, name in (("physics_ms", "physics"), ("policy_ms_per_update", "policy (rollout)"),
                          ("update_ms", "update")):
            v = speed[col].fillna(0).to_numpy()
            ax[0].bar(lab, v, bottom=bottom, label=name)
            bottom += v
        loop = speed.loop_ms_per_update
        ax[0].errorbar(lab, loop, fmt="k_", ms=18, capsize=3, elinewidth=1,
                       yerr=[(loop - speed.loop_lo).fillna(0), (speed.loop_hi - loop).fillna(0)],
                       label="whole loop (measured; bar: range over timed calls)")
        ax[0].tick_params(axis="x", labelsize=7, labelrotation=45)
        ax[0].legend()
    # paired cells: diamonds with the range of their per-round ratios
    for (r, env), g in (ups[ups.timing == "paired"].groupby(["recipe", "env"])
                        if len(ups) and "timing" in ups else []):
        ax[1].errorbar(g.width.to_numpy(), g.e2e.to_numpy(),
                       yerr=np.vstack([g.e2e - g.e2e_lo, g.e2e_hi - g.e2e]), fmt="D", ms=6,
                       capsize=3, zorder=4, color=plotstyle.color(r),
                       label=f"{r}, {env}: whole loop, paired ({int(g.rounds.max())} rounds)")
    sep = rl_analysis.separate(ups)
    # one line per recipe and environment (never joined across environments)
    envs = sorted(set(sep.env)) if len(sep) else []
    for (r, env), g in sep.groupby(["recipe", "env"]) if len(sep) else []:
        g = g.sort_values("width")
        c = plotstyle.shade(plotstyle.color(r), -0.4 * envs.index(env))  # darker per env
        ax[1].plot(g.width, g.e2e, "o-", color=c, label=f"{r}, {env}: whole loop")
        ax[1].plot(g.width, g["update"], "s--", color=c, label=f"{r}, {env}: update alone")
    if len(ups):
        ax[1].set_xscale("log", base=2)
        ax[1].legend()
    ax[1].axhline(legged_rules.PAYS, color="grey", lw=0.8, ls=":")
    ax[1].axhline(1.0, color="grey", lw=0.8)
    ax[0].set(xlabel="policy size, recipe", ylabel="time per PPO update (ms)",
              title="Where an update's time goes")
    ax[1].set(xlabel="widest hidden layer (units)", ylabel="speedup over BF16 (x)",
              title=f"FP8 / BF16 (dotted: {legged_rules.PAYS}x, where FP8 pays)")
    fig.suptitle("PPO on MJX physics (ant; Go1 at Playground's size)")
    return fig


speed = A.speed_table(df)  # separately timed cells; the paired cells' ratios join `ups`
ups = A.speedups(speed, records=df)
# (saved also when no fresh record is left: the figure then says why in words)
nb.save(plot_speed(speed, ups, df), "10_legged_speed", df)
if len(speed):
    display(speed.reindex(columns=COLS).round(2))
ups.round(3) if len(ups) else "no FP8/BF16 pairs in the committed records"

# %% [markdown]
# ## Quality: FP8 and BF16 against FP32
#
# Per policy size: seeds, mean final return, mean normalised score ((return - random) /
# (FP32 mean - random)) and `P(recipe > FP32)` with its 95% interval, per training budget;
# for the FP8 recipes also `P(recipe > BF16)` (`poi_bf16`), which the verdict shows but does
# not judge: it tells a loss that FP8 adds from one that 16-bit compute already has. Then the
# learning curves (mean over seeds of each update's mean episode return), one panel
# per size, against env steps per seed. A cell may hold runs of several training budgets
# (`total_timesteps`) and cells different numbers of seeds (`n_seeds`, as their records say):
# each recipe is compared with FP32 trained as long, on all seeds of both, and the bootstrap
# resamples each one's seeds on their own. The verdict reads each size at its longest budget.
#
# A variant named `{recipe}+critic-fp32` trains the same policy recipe with the value tower
# in FP32 (`critic_recipes` in `params.yaml`): it tells a loss from 16-bit compute in the
# critic apart from one in the policy. The verdict judges the FP8 recipe in both towers (the
# one the speed cells time) and shows BF16 and the FP32-critic variant beside it, unjudged,
# then any variant `{recipe}:field=value` of the judged recipe, a lever tried on its return
# (Go1's `fp8-delayed:bwd_dtype=float8_e4m3fn` casts the backward's gradients to E4M3, with
# one more mantissa bit than E5M2, as the block-FP8 recipes of LLM training do).
# Go1's variants run more seeds (`more_seeds`, up to 128 each), in cells of 32 seeds each
# (`..._s32` holds seeds 32-63) recorded over several calls and pooled here: 32-seed
# intervals of `P(recipe > FP32)` are about +-0.14 wide, too wide to clear the margin's 0.4
# even for a recipe equal to FP32, and more FP32 seeds alone narrow them little (the table's
# `n_seeds` says how many each row pooled).
#
# `learned` says whether FP32 beat the random policy (`random_return`). Where the environment
# has no random-policy record of the current code, both are empty and nothing is scored or
# judged. Where FP32 did not beat the floor, the row is shown but not judged: recipes that all
# stayed at the floor compare noise. Go1 can stay there: Playground clips its per-step reward
# at zero, so a policy whose actions are as noisy as the default start (standard deviation 1,
# clipped to [-1, 1]) tends to make the robot fall early, earning little more than the uniform
# random policy (`random_return`) and leaving PPO little reward to follow. Go1's policy
# therefore starts at standard deviation 0.2 (`init_std` in `params.yaml`; brax calls it
# `init_noise_std`), close enough to standing still that the first policies collect reward.
# Playground itself trains Go1 for 200M steps (`mujoco_playground/config/locomotion_params.py`),
# far longer than this study.
#
# Go1's curves rise and fall with a period of one episode (1000 steps, 50 updates of 20 steps):
# every environment starts at once, so episodes that run to the time limit all end together
# and, between those ends, only the episodes that fell early are counted. The final return
# (the mean over the last `last_fraction` of training) therefore mixes a peak and a trough,
# at the same phase for every recipe; it compares recipes, but it is not a score of the final
# policy the way an evaluation over whole episodes would be.

# %%
def plot_curves(df):
    c = df[df.metric == "final_return"] if len(df) else df
    panel = c.sizes.map(lambda s: (s.get("env"), s.get("size"))) if len(c) else []
    panels = sorted(set(panel))
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.5 * max(len(panels), 1), 4),
                             squeeze=False)
    # one panel per environment and size; one curve per training budget and recipe (a recipe
    # keeps its colour, a budget its line style; budgets are never averaged together), against
    # env steps per seed: the mean over seeds, the band its 95% confidence interval
    keys = [panel, c.sizes.map(lambda s: int(s.get("total_timesteps") or 0)),
            c.extra.map(lambda e: e["variant"])]
    budgets = sorted(set(keys[1])) if len(c) else []
    for (where, steps, v), g in c.groupby(keys) if len(c) else []:
        seeds = np.array([[np.nan if x is None else x for x in e["curve"]] for e in g.extra],
                         float)
        ax = axes[0, panels.index(where)]
        plotstyle.seed_band(ax, steps / 1e6 * np.linspace(0, 1, seeds.shape[1]), seeds,
                            plotstyle.color(v), ls=["-", "--", ":", "-."][budgets.index(steps) % 4],
                            label=f"{v}, {steps / 1e6:.1f}M ({len(g)} seeds)")
    for ax, (env, size) in zip(axes[0], panels or [("", "")]):
        ax.set(xlabel="env steps per seed (millions)", ylabel="mean episode return",
               title=f"{env} (MJX physics), size {size}")
        if len(c):
            ax.legend(fontsize=7)
    return fig


quality = A.quality_table(df)
nb.save(plot_curves(df), "10_legged_quality", df)
if len(quality):
    for r in quality[quality.recipe == "fp32"].itertuples():
        where = f"not judged: {r.env} at {r.size}, {r.total_timesteps / 1e6:.1f}M steps: "
        if np.isnan(r.random_return):
            print(where + f"no random-policy record ({r.env}_random) to tell whether FP32 "
                  "learned")
        elif not r.learned:
            print(where + f"FP32's mean return {r.mean_return:.3g} did not beat the random "
                  f"policy's {r.random_return:.3g}")
quality.round(3) if len(quality) else "no quality records in the committed records"

# %% [markdown]
# ## brax's PPO trainer as a peer
#
# brax's `ppo.train` and ours at equal settings (one rollout of every environment per update,
# the same sizes and PPO constants, a Gaussian policy with a learned state-independent standard
# deviation, the value loss clipped, actions clipped to [-1, 1] at the environment, float32
# products at JAX's default precision: recipe `tf32`), one after the other in one process:
# env-steps/s (brax: its epochs after the first two, which compile; ours: a run after compiling)
# and the evaluation return (one episode per environment, stochastic policy). Differences that
# remain: brax folds each rollout into its observation statistics before the update's gradient
# steps, ours after them (the update then sees what the policy saw); at a time-limit end brax
# zeroes that step's TD error, ours bootstraps from the final observation. Target: ours at least
# as fast, with an equal or better return, read as A11 reads FP8 against FP32: the interval of
# P(ours > brax) over the seeds at or above the low end of A11's margin.

# %%
peer = A.peer_table(df)
if len(peer):
    display(peer.set_index(["hardware", "env"]).round(3))
    for r in peer.itertuples():
        learned = [i for i, ret in (("ours", r.return_repro), ("brax", r.return_brax))
                   if ret > r.random_return]
        print(f"{r.hardware} {r.env}: ours / brax's trainer {r.speed_ratio:.2f}x env-steps/s; "
              f"evaluation return {r.return_repro:.1f} (ours) vs {r.return_brax:.1f} (brax), "
              f"mean of {r.n_seeds} seed(s), random policy {r.random_return:.1f} ("
              + (f"above it: {', '.join(learned)}" if learned else "neither is above it")
              + "); " + (legged_rules.peer_parity(r)[1] if r.n_seeds >= 2 else
                         "one seed per trainer shows whether both learn, not which learns "
                         "better"))
else:
    print("no peer records in the committed records")

# %% [markdown]
# ## Pipeline check (smoke profile)
#
# On a smoke run the cells recorded above (a few seeds of short ant episodes on this machine)
# go through the same tables into `build/figures/`: they show that the pipeline runs, not how
# FP8 trains legged robots.

# %%
if nb.profile == "smoke" and HAVE_PHYSICS:
    smoke = nb.smoke_records(A.EXPERIMENT)
    nb.save(plot_curves(smoke), "10_legged_quality", smoke)
    display(A.physics_table(smoke))
    display(A.quality_table(smoke, reps=200).round(3))

# %% [markdown]
# ## Conclusion
#
# What the committed records say (filled in from the computed verdict): per policy size, the
# FP8/BF16 speedup of the whole loop and of the update alone, the physics' share of the BF16
# loop, the crossover width (or that none was reached) and whether FP8's quality held. Its
# numbers (speedups and `P(recipe > FP32)` per width) also go to `metrics/10_legged.json`.

# %%
a11_cells = nb.ledger(df, "A11")  # A11's ledger set: its verdict's tables from these alone
a11_ups = A.speedups(A.speed_table(a11_cells), records=a11_cells)
v = registration.judged(verdicts.a11, "A11", a11_ups, A.quality_table(a11_cells), records=df)
nb.conclusion(dataclasses.replace(v, numbers=A.key_numbers(a11_ups,
                                                          A.quality_table(a11_cells))))
