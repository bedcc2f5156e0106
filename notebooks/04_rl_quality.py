# %% [markdown]
# # 04 · FP8 RL training: quality and reproducibility (claims A5-A8, A10; C2)
#
# **The claims** (seed article on end-to-end FP8 reinforcement learning; `docs/CLAIMS.md`):
# **A5** dynamic per-tensor (amax-based) scaling keeps values inside FP8's range; **A6** mixed
# precision (FP8 compute, wide master weights, FP32 accumulation) keeps quality; **A7** Kahan
# summation in the optimizer limits the precision loss of low-precision weights; **A8** weight
# and gradient clipping prevent divergence; **A10** quality and reproducibility are kept. The
# technique goes back to Bjorck et al. (ICML 2021, FP16 SAC): naive low precision fails, all
# the fixes together match FP32.
#
# **Method.** PPO (`repro.models.ppo`) on CartPole-v1, Acrobot-v1 and three MinAtar games
# (Breakout, SpaceInvaders, Asterix; MinAtar CNN), 16 seeds per cell in the full profile, the
# seeds of a cell under `jax.vmap`. Each *variant* (`repro.precision.recipes`) is a recipe plus
# optimizer flags:
#
# | variant | what it tests |
# |---|---|
# | fp32, bf16, fp16 | references (fp16 with dynamic loss scaling) |
# | fp8-delayed, fp8-current | FP8 GEMMs, FP32 master weights: A5, A6, A10 |
# | fp8-all-layers | the first and last layers in FP8 too |
# | fp8-e2e | FP8-stored weights, Kahan-compensated update, weight clip 1.0: A7, A8 |
# | fp8-e2e-nokahan, bf16w-kahan, bf16w-nokahan | Kahan on and off: A7 |
# | fp8-noscale | FP8 casts without scaling: A5's ablation |
# | fp8-e2e-nogradclip, fp8-e2e-noweightclip | A8's ablations |
#
# A seed's score is the mean return of the episodes completed in the last 10% of training,
# normalised per environment as `(score - random) / (fp32 mean - random)` (a random policy
# scores 0, FP32 on average 1, a diverged seed 0) and aggregated over environments with
# rliable: the interquartile mean (IQM) and the probability of improvement `P(X > Y)` (the
# chance that a seed of X outscores a seed of Y on a random environment; 0.5 = no difference),
# with 95% stratified-bootstrap intervals.
#
# **Decision rules** (`repro.claims.verdicts`). X is *better* than Y if the interval of
# `P(X > Y)` lies above 0.5, *worse* if below. The parity claims A5, A6 and A10 ("quality is
# kept") use the equivalence margin [0.4, 0.6] of their definitions (`repro/data/claims.yaml`):
# quality is *kept* if the interval lies at or above 0.4 (inside the margin: equivalent), *lost*
# if it lies below 0.4, and the part is *inconclusive* if the interval straddles 0.4.
# **A5** reproduced if fp8-delayed keeps fp32's quality and beats fp8-noscale (partly if one of
# the two); **A6** reproduced if fp8-delayed keeps fp32's quality; **A7** reproduced if a Kahan
# update beats the naive one and fp8-e2e is not worse than fp32 (partly if only the first);
# **A8** reproduced if removing either clip makes fp8-e2e worse (partly if one); a part in
# which no seed diverged in either arm is inconclusive: there was no divergence for the
# clipping to prevent, so better or worse returns say nothing about it; **A10**
# reproduced if fp8-delayed keeps the quality of fp32 and of bf16 and the same seed gives
# bit-identical returns (partly if one of the two). A claim whose undecided parts leave it open
# is *inconclusive*. Fewer than 3 environments cap a verdict at partly: one or two games cannot
# carry a claim about RL. Equal scores count 0.5 in `P(X > Y)`: where both variants reach a
# capped return (CartPole-v1's 500), that environment's fifth of the weight is fixed at 0.5 and
# the interval narrows; the verdicts report the tied share of each comparison (`ties`).
#
# **C2** asks the question of quality where the 8-bit arithmetic is INT8 (a TPU v5e): `int8`
# (INT8 in all three GEMMs of each hidden layer) against `fp32` recorded on that TPU, within
# A10's margin.
#
# **The figures** put the machines side by side: one row (curves) or one panel (aggregates)
# per machine with quality records, each named with the 8-bit format it multiplies natively
# (FP8 on the H200, INT8 on the TPU v5e). A CPU's full-profile records count for quality
# (the quantization is the same; the products are computed by upcasting, so they are never a
# speed); an 8-bit variant a machine emulated is labelled "emulated" (dotted curves, hollow
# marks). Each verdict reads its claim's ledger set alone.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from repro import config, notebook, plotstyle
from repro.analysis import rl as rl_analysis
from repro.analysis import stats
from repro.claims import registration, verdicts
from repro.experiments.rl_quality import measure as RQ

warnings.filterwarnings("ignore", category=FutureWarning)  # arch's RandomState deprecation
nb = notebook.start("04_rl_quality", "rl_quality", profile, scratch)
if nb.profile == "smoke":  # a pipeline check on this machine: scratch records, scratch figure
    nb.record_smoke("rl_quality")
FULL = config.stage_params("rl_quality", "full")  # the study the committed records come from
df = nb.records("rl_quality")
fr = rl_analysis.final_returns(df)
HWQ = fr.hardware.value_counts().idxmax() if len(fr) else "none"
HWS = plotstyle.hardware_order(fr.hardware) if len(fr) else []  # the figures' machines
print(f"quality records from {', '.join(HWS) or 'no machine'}; reproducibility shown for "
      f"{HWQ}, the machine with the most")

# %% [markdown]
# Records measured with a bug found later (`repro/data/defects.yaml`) stay in `results/` but
# out of the statistics; the next `repro record rl_quality` records their cells again.

# %%
bad = nb.records("rl_quality", keep_defective=True)
bad = bad[bad.defect.notna()] if len(bad) else bad
(bad.assign(env=bad.sizes.map(lambda s: s.get("env")), commit=bad.git_commit.str[:7],
            variant=bad.extra.map(lambda e: e.get("variant")))
 .groupby(["hardware", "commit", "env", "defect"])["variant"]
 .agg(lambda v: ", ".join(sorted(set(v)))).to_frame("variants left out")
 if len(bad) else "no records left out")

# %% [markdown]
# ## Learning curves
#
# Mean over seeds of the per-update mean episode return, the band its 95% confidence
# interval; dashed: ablations. One row per machine (titled with its 8-bit format), one panel
# per environment it recorded; "(emulated)": an 8-bit variant the machine has no arithmetic
# for, its numbers computed by upcasting (a quality, never a speed).

# %%
SHOW = ("fp32", "bf16", "fp16", "fp8-delayed", "fp8-e2e", "fp8-e2e-nokahan", "fp8-noscale",
        "fp8-e2e-nogradclip", "fp8-e2e-noweightclip", "int8")


def emulated_on(d, hw):
    """The 8-bit variants of ``d`` that ``hw`` ran emulated (no arithmetic for their format
    there: FP8 on a CPU or a TPU v5e)."""
    q = d[(d.hardware == hw) & d.emulated.astype(bool)] if len(d) else d
    names = set(q.extra.map(lambda e: e.get("variant"))) if len(q) else set()
    return {v for v in names if plotstyle.format_of(v)}


def plot_curves(df, hws):
    c = df[(df.metric == "final_return") & df.hardware.isin(hws)] if len(df) else df
    c = c.assign(variant=c.extra.map(lambda e: e["variant"]), env=c.sizes.map(lambda s: s["env"]))
    rows = [(h, sorted(c[c.hardware == h].env.unique())) for h in hws if (c.hardware == h).any()]
    ncols = max([len(e) for _, e in rows] + [1])
    fig, axes = plt.subplots(max(len(rows), 1), ncols,
                             figsize=(4.2 * ncols, 3.6 * max(len(rows), 1)), squeeze=False)
    for axrow, (hw, envs) in zip(axes, rows):
        for ax, env in zip(axrow, envs):
            for v in [v for v in SHOW if v in set(c.variant)]:
                g = c[(c.hardware == hw) & (c.env == env) & (c.variant == v)]
                if not len(g):
                    continue
                arr = np.array([[np.nan if x is None else x for x in e["curve"]]
                                for e in g.extra], float)
                emulated = v in emulated_on(g, hw)
                plotstyle.seed_band(ax, np.linspace(0, 100, arr.shape[1]), arr,
                                    plotstyle.color(v),
                                    label=v + (" (emulated)" if emulated else ""),
                                    ls=":" if emulated else "--" if v.startswith("fp8-e2e-no")
                                    or v == "fp8-noscale" else "-")
            ax.set(title=f"{plotstyle.hardware_title(hw)}\n{env}",
                   xlabel="training progress (%)", ylabel="episode return")
        axrow[0].legend(fontsize=7)
        for ax in axrow[len(envs):]:
            ax.set_visible(False)  # this machine recorded fewer environments
    fig.suptitle("Learning curves per machine, mean over seeds (band: 95% CI of the mean; "
                 "dotted: emulated 8-bit)")
    return fig


nb.save(plot_curves(df, HWS), "04_rl_curves", df[df.hardware.isin(HWS)] if len(df) else df)

# %% [markdown]
# ## Aggregate scores and probabilities of improvement
#
# Per machine (one panel each, side by side), over the environments it recorded: the IQM of
# each variant's normalised score, and the probabilities of improvement of the comparisons the
# claims make (on a machine whose 8-bit format is INT8, `int8` against `fp32`, C2's
# comparison, and against `bf16`). Intervals: 95% stratified bootstrap; a hollow mid mark and
# "(emulated)": a variant the machine emulated.

# %%
PAIRS = [("fp8-delayed", "fp32"), ("fp8-delayed", "bf16"), ("fp8-current", "bf16"),
         ("fp8-delayed", "fp8-noscale"), ("fp8-current", "fp8-noscale"),
         ("fp8-e2e", "fp32"), ("fp8-e2e", "fp8-e2e-nokahan"), ("bf16w-kahan", "bf16w-nokahan"),
         ("fp8-e2e", "fp8-e2e-nogradclip"), ("fp8-e2e", "fp8-e2e-noweightclip"),
         ("fp8-all-layers", "fp8-delayed"), ("fp8-delayed", "fp16")]
FIG_PAIRS = PAIRS + [("int8", "fp32"), ("int8", "bf16")]  # the figures' comparisons


def quality(hw):
    """One machine's aggregate IQM table, its probabilities of improvement (``FIG_PAIRS``
    whose both arms it recorded), its environments and the fewest seeds of a cell."""
    sc, en, _ = rl_analysis.normalised_scores(df, hw, order=FULL["variants"])
    a = stats.aggregate(sc, reps=2000) if sc else pd.DataFrame(columns=["variant"])
    pairs = [p for p in FIG_PAIRS if p[0] in sc and p[1] in sc]
    p = (stats.probability_of_improvement(sc, pairs, reps=1000) if pairs
         else pd.DataFrame(columns=["x", "y", "p", "lo", "hi"]))
    g = fr[(fr.hardware == hw) & fr.env.isin(en) & fr.variant.isin(list(sc))]
    return a, p, en, int(g.groupby(["env", "variant"]).size().min()) if len(g) else 0


def plot_intervals(panels, ref, xlabel, title, bounds=None):
    """One panel per machine: ``panels`` maps a machine to (names, mid, lo, hi, colours,
    the panel's subtitle); a name in its emulated set gets "(emulated)" and a hollow mid."""
    rows = max([len(p[0]) for p in panels.values()] + [2])
    fig, axes = plt.subplots(1, max(len(panels), 1), squeeze=False, sharex=True,  # one scale
                             figsize=(6.2 * max(len(panels), 1), 0.42 * rows + 1.4))
    for ax, (hw, (names, mid, lo, hi, colours, sub)) in zip(axes[0], panels.items()):
        emu = emulated_on(df, hw)
        y = np.arange(len(names))[::-1] + rows - len(names)  # from the top, in every panel
        ax.hlines(y, lo, hi, lw=6, alpha=0.6, color=[plotstyle.color(c) for c in colours])
        hollow = np.array([c in emu for c in colours], bool)
        ax.plot(np.asarray(mid)[~hollow], y[~hollow], "k|", ms=14)
        ax.scatter(np.asarray(mid)[hollow], y[hollow], facecolors="none", edgecolors="k",
                   zorder=3)
        ax.set_yticks(y, [n + (" (emulated)" if c in emu else "")
                          for n, c in zip(names, colours)])
        ax.axvline(ref, color="grey", lw=0.8)
        ax.set(xlabel=xlabel, title=f"{plotstyle.hardware_title(hw)}\n{sub}",
               ylim=(-0.6, rows - 0.4))
        if bounds is not None:  # a probability: its axis shows its whole range
            plotstyle.bounded(ax, "x", *bounds)
    fig.suptitle(title)
    return fig


Q = {hw: quality(hw) for hw in HWS}
Q = {hw: q for hw, q in Q.items() if len(q[0])}  # machines with a score table
where = {hw: f"{len(en)} environments, {n} seeds per cell" for hw, (_, _, en, n) in Q.items()}
drawn = df[df.hardware.isin(list(Q))] if len(df) else df
nb.save(plot_intervals({hw: (a.variant, a.iqm, a.iqm_lo, a.iqm_hi, a.variant, where[hw])
                        for hw, (a, _, _, _) in Q.items()}, 1.0,
                       "IQM of normalised score (random = 0, fp32 mean = 1), 95% CI",
                       "Aggregate quality per variant and machine"), "04_rl_iqm", drawn)
nb.save(plot_intervals({hw: ([f"P({a} > {b})" for a, b in zip(p.x, p.y)], p.p, p.lo, p.hi,
                             p.x, where[hw]) for hw, (_, p, _, _) in Q.items() if len(p)},
                       0.5, "probability of improvement, 95% CI",
                       "Probability of improvement per machine", bounds=(0, 1)),
        "04_rl_poi", drawn)
display(pd.concat([a.assign(hardware=hw) for hw, (a, _, _, _) in Q.items()], ignore_index=True)
        .round(3) if Q else "no quality scores")
(pd.concat([p.assign(hardware=hw) for hw, (_, p, _, _) in Q.items()], ignore_index=True)
 .round(3) if Q else "no quality scores")

# %% [markdown]
# ## Reproducibility (A10)
#
# Each study reruns one variant within its process (`same_seed_identical`). Where a cell was
# recorded twice in separate processes on the same machine and commit
# (`results/<hw>/rl_quality_repeat/`), every seed's final return and learning curve are
# compared bit for bit (a numerics defect does not affect reproducibility, so defective cells
# count here).

# %%
repeat = rl_analysis.repeat_identical(nb.records("rl_quality", keep_defective=True),
                                      nb.records(RQ.QUALITY_REPEAT, keep_defective=True))
repeat = repeat[repeat.hardware == HWQ] if len(repeat) else repeat
det = df[(df.metric == "same_seed_identical") & (df.hardware == HWQ)]
same_seed = bool(det.value.min() == 1.0) if len(det) else None
repeat if len(repeat) else "no cell recorded twice"

# %% [markdown]
# ## Verdicts

# %% [markdown]
# Each verdict reads its ledger set alone (`ledger` in `repro/data/claims.yaml`): the
# environments its rule names, each from one machine (fresh records first: the classic-control
# tasks a CPU records in full, Breakout-MinAtar an accelerator's), the figures above every
# fresh cell of the committed machine with the most.

# %%
def judged_on_ledger(fn, claim, *extra):
    """``fn`` under ``claim``'s rule, its statistics computed from the claim's ledger set."""
    d = nb.ledger(df, claim)
    where = (d.assign(env=d["sizes"].map(lambda z: z.get("env")))
             .groupby("hardware")["env"].agg(lambda e: ", ".join(sorted(set(e))))
             if len(d) else pd.Series(dtype=str))
    label = "; ".join(f"{h} ({e})" for h, e in where.items()) or "none"
    d = d.assign(hardware=label)  # one evidence per claim, its machines named
    f = rl_analysis.final_returns(d)
    arms = [v for v in FULL["variants"] if v in set(f.variant)]
    sc, en, _ = rl_analysis.normalised_scores(d, label, order=arms)
    pairs = [p for p in PAIRS if p[0] in sc and p[1] in sc]
    p = (stats.probability_of_improvement(sc, pairs, reps=1000) if pairs
         else pd.DataFrame(columns=["x", "y", "p", "lo", "hi"]))
    n = int(f.groupby(["env", "variant"]).size().min()) if len(f) else 0
    e = verdicts.QualityEvidence(label, "full", tuple(en), n, len(verdicts.rule(claim)["envs"]))
    args = {"A8": (f.groupby("variant")["diverged"].sum().to_dict(),),
            "A10": (_same_seed(d), _repeat(claim))}.get(claim, ())
    return registration.judged(fn, claim, p, e, *args, records=df)


def _same_seed(d):
    det = d[d.metric == "same_seed_identical"]
    return bool(det.value.min() == 1.0) if len(det) else None


def _repeat(claim):
    """A10's cells recorded twice, compared bit for bit (defects count: see above)."""
    rep = rl_analysis.repeat_identical(nb.records("rl_quality", keep_defective=True),
                                       nb.ledger(nb.records(RQ.QUALITY_REPEAT,
                                                            keep_defective=True), claim))
    return rep


V = [judged_on_ledger(fn, claim) for fn, claim in (
    (verdicts.a5, "A5"), (verdicts.a6, "A6"), (verdicts.a7, "A7"), (verdicts.a8, "A8"),
    (verdicts.a10, "A10"))]
for v in V:
    print(f"{v.claim}: {v.verdict} | {v.key_number}")

# %% [markdown]
# ## C2: INT8 training against FP32 on a TPU v5e
#
# `int8` (INT8 in all three GEMMs of each hidden layer) against `fp32` (every product at
# `Precision.HIGHEST`), both recorded on the hardware C2's rule names: their normalised scores
# on the environments both were recorded on, P(int8 > fp32) against A10's margin.

# %%
C2 = verdicts.rule("C2")
hw2, arms2 = C2["cells"]["hardware"], [C2["reference"], *C2["recipes"]]
d2 = nb.ledger(df, "C2")  # C2's ledger set: its cells on its hardware
s2, envs2, _ = rl_analysis.normalised_scores(d2, hw2, reference=C2["reference"], order=arms2)
poi2 = (stats.probability_of_improvement(s2, [tuple(arms2[::-1])], reps=1000)
        if len(s2) == 2 else pd.DataFrame(columns=["x", "y", "p", "lo", "hi"]))
fr2 = rl_analysis.final_returns(d2, hw2) if len(d2) else fr.iloc[:0]
fr2 = fr2[fr2.variant.isin(arms2)] if len(fr2) else fr2
ev2 = verdicts.QualityEvidence(hw2, "full", tuple(envs2),
                               int(fr2.groupby(["env", "variant"]).size().min()) if len(fr2)
                               else 0, len(FULL["envs"]))
c2_used = df[(df.hardware == hw2) & df.recipe.isin(C2["recipes"])] if len(df) else df
c2 = registration.judged(verdicts.c2, "C2", poi2, ev2, records=c2_used)
print(f"C2: {c2.verdict} | {c2.key_number}")
(poi2.round(3) if len(poi2) else f"no int8 and fp32 records on {hw2}")

# %% [markdown]
# ## Pipeline check (smoke profile)
#
# On a smoke run the cells recorded above (a few seeds of CartPole-v1 on this machine) go
# through the same statistics, into `build/figures/`: they show that the pipeline runs, not
# how FP8 trains.

# %%
if nb.profile == "smoke":
    smoke = nb.smoke_records("rl_quality")
    hw = smoke.hardware.iloc[0] if len(smoke) else "none"
    nb.save(plot_curves(smoke, [hw]), "04_rl_curves", smoke)
    s, e, _ = rl_analysis.normalised_scores(smoke, hw, order=nb.params["variants"])
    display(stats.aggregate(s, reps=200).round(3) if s else "no smoke scores")

# %% [markdown]
# ## Conclusion
#
# What the committed records say, claim by claim (each paragraph is filled in from the verdict
# computed above):

# %%
nb.conclusion(*V, c2)
