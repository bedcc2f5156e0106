# %% [markdown]
# # 08 · Distributed FP8 and NVFP4 training (claim B5)
#
# **The claim** (seed article on NVFP4 with JAX / MaxText): *"scalable distributed training
# (communication, checkpoints)."* Here: does the FP8 and NVFP4 training of this repository run
# sharded over several devices through JAX's own runtime, compute what one device computes,
# checkpoint and resume sharded, and scale?
#
# **How the sharding is applied** (`repro.models.sharding`; GSPMD: the program is written for
# the global batch, `jax.jit` gets input and output shardings, XLA inserts the collectives):
#
# | what | data parallel, mesh `("data",)` | FSDP, mesh `("data", "fsdp")` |
# |---|---|---|
# | PPO env states, observations, trajectories | `P("data")` on the env axis | - |
# | PPO minibatches | `P(None, "data")` | - |
# | LM batch `[B, T]` | `P("data")` | `P(("data", "fsdp"))` |
# | parameters, Adam moments | replicated | split over `"fsdp"` on the largest divisible axis |
# | FP8 metadata (amax histories, scales) | replicated | replicated |
#
# The gradient all-reduce (DP) and the weight all-gathers and gradient reduce-scatters (FSDP)
# come from XLA; for FSDP the step reads its weights through a sharding constraint to
# "replicated". The delayed-scaling amax is a `jnp.max` over a sharded array, which XLA makes a
# global all-reduce(max): every device quantizes with the scale one device would use.
#
# **Checked on CPU** (`tests/test_distributed.py`, 8 simulated devices): data-parallel PPO
# equals the single-device run (FP32 and FP8 delayed scaling); the LM's losses on 8x1 (DP) and
# 2x4 (FSDP) meshes equal the single-device ones (BF16 and NVFP4); FSDP parameters and moments
# are really split; a sharded checkpoint restores and resumes exactly, also onto another mesh.
#
# **Scaling** (`repro.experiments.multigpu.measure`, `repro record multigpu --profile full`):
# weak scaling (fixed work per device) on 1, 2, 4 and 8 GPUs, BF16 and FP8 delayed scaling, for
# the data-parallel PPO loop (env-steps/s) and the LM step with replicated (`lm_dp`) and fully
# sharded (`lm_fsdp`) parameters (tokens/s). Efficiency = `throughput_n / (n * throughput_1)`.
#
# **Decision rule** (`repro.claims.verdicts.b5`): only GPU records on real devices, 2 or more
# of them, count. On the hardware with the largest count, the efficiency of every (workload,
# recipe) there: **reproduced** if all are at least 0.8 on 4 or more GPUs; **partly** if all
# are on 2 GPUs only, or some are; **contradicted** if none is. CPU devices share one
# processor's cores: their records check the pipeline and never count.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import matplotlib.pyplot as plt
import pandas as pd

from repro import config, notebook, plotstyle
from repro.analysis import stats
from repro.claims import registration, verdicts
from repro.experiments.multigpu import measure as multigpu
from repro.experiments.multigpu import tables as scaling

nb = notebook.start("08_multigpu", "multigpu", profile, scratch)
if nb.profile == "smoke" or nb.machine.backend == "gpu":  # full records only on a GPU
    nb.record_smoke("multigpu")
df = nb.records("multigpu")
table = scaling.throughput_table(df)
table.drop(columns=["spread"]).round(3)

# %% [markdown]
# Records measured with a bug found later (`repro/data/defects.yaml`) stay in `results/` but
# out of the table and the verdict; the next full run records their cells again.

# %%
bad = nb.records("multigpu", keep_defective=True)
bad = bad[bad.defect.notna() & bad.metric.isin([m for m, _ in multigpu.METRIC.values()])] \
    if len(bad) else bad
(bad.assign(workload=bad.sizes.map(lambda s: s.get("workload")),
            n_devices=bad.sizes.map(lambda s: s.get("n_devices")), commit=bad.git_commit.str[:7])
 [["hardware", "commit", "workload", "recipe", "n_devices", "value", "unit", "defect"]]
 if len(bad) else "no records left out")

# %% [markdown]
# ## Throughput and scaling efficiency
#
# One line per (hardware, recipe); dashed with hollow markers: simulated CPU devices.

# %%
KEYS = ["hardware", "workload", "recipe", "n_devices"]


def round_ranges(df):
    """Per (hardware, workload, recipe, devices): the range of the throughput over the timed
    rounds of the record the table keeps (the latest)."""
    d = df[df.metric.isin({m for m, _ in multigpu.METRIC.values()})] if len(df) else df
    if not len(d):
        return pd.DataFrame(columns=KEYS + ["lo", "hi"])
    d = stats.round_range(d).assign(
        workload=[s.get("workload") for s in d["sizes"]],
        n_devices=[int(e.get("n_devices", s.get("n_devices", 1)))
                   for e, s in zip(d["extra"], d["sizes"])])
    return d.sort_values("timestamp").drop_duplicates(KEYS, keep="last")[KEYS + ["lo", "hi"]]
TITLES = {"ppo": "PPO, data parallel", "lm_dp": "LM step, data parallel",
          "lm_fsdp": "LM step, fully sharded (FSDP)"}


def plot_scaling(table, ranges):
    table = table.merge(ranges, on=KEYS, how="left") if len(table) else table
    workloads = [w for w in multigpu.WORKLOADS if len(table) and (table.workload == w).any()]
    fig, axes = plt.subplots(2, max(len(workloads), 1), figsize=(4.8 * max(len(workloads), 1),
                                                                 7.2), squeeze=False)
    for j, w in enumerate(workloads):
        d = table[table.workload == w]
        for (hw, recipe), g in d.groupby(["hardware", "recipe"]):
            g = g.sort_values("n_devices")
            sim = bool(g.simulated.any())
            c = plotstyle.color(recipe)
            style = dict(color=c, ls="--" if sim else "-", marker=plotstyle.style(recipe)["marker"],
                         mfc="none" if sim else c)
            label = f"{recipe}, {hw}" + (" (simulated devices)" if sim else "")
            axes[0, j].errorbar(g.n_devices, g.throughput, capsize=3, label=label,
                                yerr=[g.throughput - g.lo.fillna(g.throughput),
                                      g.hi.fillna(g.throughput) - g.throughput], **style)
            axes[1, j].plot(g.n_devices, g.efficiency, label=label, **style)
        axes[0, j].set(title=TITLES.get(w, w), ylabel=f"throughput ({multigpu.METRIC[w][1]})", ylim=(0, None))
        axes[1, j].axhline(verdicts.nvfp4.B5_EFFICIENCY, color="grey", lw=0.8, ls=":")
        axes[1, j].set(xlabel="devices", ylabel="weak-scaling efficiency", ylim=(0, 1.15))
        for ax in axes[:, j]:
            ax.set(xscale="log", xlim=(0.8, 10))
            ax.set_xticks([1, 2, 4, 8], labels=["1", "2", "4", "8"], minor=False)
            ax.minorticks_off()
        axes[0, j].legend(fontsize=7)
    fig.suptitle("Weak scaling: fixed work per device (bars: range over timed rounds; dotted: "
                 "the 0.8 efficiency target)")
    return fig


nb.save(plot_scaling(table, round_ranges(df)), "08_multigpu", df)

# %% [markdown]
# FP8/BF16 speedup at each device count:

# %%
(table[table.recipe != scaling.BASELINE]
 .pivot_table(index=["hardware", "workload", "recipe"], columns="n_devices",
              values="fp8_speedup").round(3)
 if len(table) and (table.recipe != scaling.BASELINE).any() else "no FP8 records")

# %% [markdown]
# Key numbers (`dvc metrics show`): per hardware, workload and recipe, the throughput and
# weak-scaling efficiency at the most devices measured and FP8's speedup there; and how many
# records the table used and how many it left out as stale. The efficiency curves are also
# written as data for `dvc plots diff`.

# %%
def key_numbers(table, used, left_out):
    out = {"records": {"used": int(used), "left_out_stale": int(left_out)}}
    for (hw, w, recipe), g in table.groupby(["hardware", "workload", "recipe"]) if len(table) \
            else []:
        top = g.sort_values("n_devices").iloc[-1]
        out.setdefault(hw, {}).setdefault(w, {})[recipe] = {
            "n_devices": int(top.n_devices), "throughput": top.throughput,
            "efficiency": top.efficiency, "fp8_speedup": top.fp8_speedup}
    return out


nb.metrics(**key_numbers(table, len(df), sum(len(x) for x in nb.left_out)))
if len(table):
    nb.plot_data("08_multigpu_efficiency", table.assign(
        series=table.hardware + " " + table.workload + " " + table.recipe)
        .pivot_table(index="n_devices", columns="series", values="efficiency"), df)
key_numbers(table, len(df), sum(len(x) for x in nb.left_out))

# %% [markdown]
# ## Pipeline check (smoke profile)
#
# A smoke run records tiny cells on this machine's devices (on a CPU, simulated devices that
# cannot scale) and draws them into `build/figures/`.

# %%
if nb.profile == "smoke":
    smoke = nb.smoke_records("multigpu")
    nb.save(plot_scaling(scaling.throughput_table(smoke), round_ranges(smoke)), "08_multigpu",
            smoke)

# %% [markdown]
# ## Conclusion
#
# What the committed records say (filled in from the computed verdict); "of different calls"
# marks a ratio of two cells recorded in different GPU calls.

# %%
# B5's ledger set names no cell yet (its rule needs four or more GPUs of one machine)
b5 = registration.judged(verdicts.b5, "B5", scaling.throughput_table(nb.ledger(df, "B5")),
                         config.stage_params("multigpu", "full"), records=df)
nb.conclusion(b5)
