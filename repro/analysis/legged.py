"""Tables and the A11 verdict from the ``legged`` records (``repro.studies.legged``).

* :func:`physics_table` -- the physics alone: env-steps/s per (hardware, env, num_envs,
  precision), scanned and per call, with the first two calls' times.
* :func:`speed_table` -- the whole PPO loop per (hardware, env, size, recipe) and its parts per
  update: ``physics_ms`` (from the physics cell at the same number of environments and the
  default precision), ``policy_ms`` (the rollout's network work), ``update_ms`` and
  ``other_ms`` (the rest: GAE, statistics, glue; may be negative within timing noise).
* :func:`speedups` -- each FP8 recipe over BF16 per size: whole loop and update alone.
* :func:`quality_table` -- per size, each recipe against FP32: normalised scores ((return -
  random) / (FP32 mean - random)) and the probability of improvement with its 95% stratified
  bootstrap interval (rliable), the statistics of the other RL quality claims.
* :func:`a11_verdict` -- the rule, stated there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from repro import results
from repro.analysis import rl as rl_analysis
from repro.analysis import stats

EXPERIMENT = "legged"
BASELINE = "bf16"
REFERENCE = "fp32"
PAYS = 1.1  # FP8 "pays" where the whole loop is >= 1.1x BF16's (A2's "faster" threshold)
MIN_SEEDS = 8


def _sizes(d: pd.DataFrame, keys) -> pd.DataFrame:
    d = d.copy()
    for k in keys:
        d[k] = d["sizes"].map(lambda s, k=k: s.get(k))
    return d


def physics_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, env, num_envs, precision) physics cell."""
    cols = ["hardware", "backend", "env", "num_envs", "precision", "physics_env_steps_per_s",
            "loop_env_steps_per_s", "first_call_s", "second_call_s", "compile_s",
            "physics_dots", "git_commit"]
    metrics = ["physics_env_steps_per_s", "loop_env_steps_per_s", "first_call_s",
               "second_call_s"]
    d = df[df.metric.isin(metrics)] if len(df) else df
    if not len(d):
        return pd.DataFrame(columns=cols)
    d = _sizes(d, ["env", "num_envs", "precision"])
    keys = ["hardware", "backend", "env", "num_envs", "precision"]
    t = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="last")
    first = d.groupby(keys).last()
    t["compile_s"] = first["extra"].map(lambda e: e.get("compile_s"))
    t["physics_dots"] = first["extra"].map(lambda e: e.get("physics_dot_precisions"))
    t["git_commit"] = first["git_commit"]
    return t.reset_index().reindex(columns=cols)


def speed_table(df: pd.DataFrame, physics: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (hardware, env, size, recipe) speed cell, with the loop's parts per update
    (module docstring) and ``git_commit``."""
    metrics = ["env_steps_per_s", "loop_ms_per_update", "policy_ms_per_update", "update_ms"]
    d = df[df.metric.isin(metrics) & df["sizes"].map(lambda s: "size" in s)] if len(df) else df
    if not len(d):
        return pd.DataFrame()
    d = _sizes(d, ["env", "size", "width", "num_envs", "num_steps"])
    keys = ["hardware", "env", "size", "width", "num_envs", "num_steps", "recipe"]
    t = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="last").reset_index()
    g = d.groupby(keys)
    t = t.merge(g["emulated"].any().reset_index(), on=keys)
    t = t.merge(g["git_commit"].last().reset_index(), on=keys)
    physics = physics_table(df) if physics is None else physics
    rate = {(r.hardware, r.env, int(r.num_envs)): r.physics_env_steps_per_s
            for r in physics.itertuples() if r.precision == "default"}
    t["physics_ms"] = [r.num_steps * r.num_envs / rate.get((r.hardware, r.env, int(r.num_envs)),
                                                           np.nan) * 1e3
                       for r in t.itertuples()]
    t["other_ms"] = (t["loop_ms_per_update"] - t["physics_ms"] - t["policy_ms_per_update"]
                     - t["update_ms"])
    t["physics_share"] = t["physics_ms"] / t["loop_ms_per_update"]
    return t.sort_values(["hardware", "env", "width", "recipe"]).reset_index(drop=True)


def speedups(speed: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Each non-baseline recipe over ``baseline`` per (hardware, env, size): ``e2e`` (ratio of
    env-steps/s), ``update`` (ratio of update times), ``same_commit`` (both cells from one
    call)."""
    cols = ["hardware", "env", "size", "width", "recipe", "e2e", "update", "physics_share",
            "emulated", "same_commit"]
    if not len(speed):
        return pd.DataFrame(columns=cols)
    keys = ["hardware", "env", "size", "width"]
    base = speed[speed.recipe == baseline].set_index(keys)
    rows = []
    for r in speed[speed.recipe != baseline].itertuples():
        k = tuple(getattr(r, c) for c in keys)
        if k not in base.index:
            continue
        b = base.loc[k]
        rows.append({**dict(zip(keys, k)), "recipe": r.recipe,
                     "e2e": r.env_steps_per_s / b["env_steps_per_s"],
                     "update": b["update_ms"] / r.update_ms,
                     "physics_share": b["physics_share"],
                     "emulated": bool(r.emulated or b["emulated"]),
                     "same_commit": results.same_commit(r.git_commit, b["git_commit"])})
    return pd.DataFrame(rows, columns=cols)


def quality_table(df: pd.DataFrame, reps: int = 1000) -> pd.DataFrame:
    """Per (hardware, env, size) and recipe: seeds, mean return, mean normalised score (NaN
    where FP32 did not beat the random policy) and P(recipe > fp32) with its 95% interval."""
    cols = ["hardware", "env", "size", "width", "recipe", "n_seeds", "mean_return",
            "normalised", "poi", "poi_lo", "poi_hi", "diverged", "profile"]
    q = df[df.metric.isin(["final_return", "random_return"])] if len(df) else df
    fr = q[q.metric == "final_return"] if len(q) else q
    if not len(fr):
        return pd.DataFrame(columns=cols)
    fr = _sizes(fr, ["size", "width"])
    rows = []
    for (hw, size, width), g in fr.groupby(["hardware", "size", "width"]):
        part = pd.concat([g, q[(q.metric == "random_return") & (q.hardware == hw)]])
        scores, envs, _ = rl_analysis.normalised_scores(part, hw, REFERENCE, order=sorted(
            set(g.extra.map(lambda e: e["variant"]))))
        pairs = [(v, REFERENCE) for v in scores if v != REFERENCE]
        poi = stats.probability_of_improvement(scores, pairs, reps=reps).set_index("x")
        per = rl_analysis.final_returns(g, hw)
        floor = part[part.metric == "random_return"]["value"].mean()
        # a score needs FP32 above the random floor (else its scale is meaningless: NaN)
        scale_ok = per[per.variant == REFERENCE].final_return.mean() > floor
        for v, s in scores.items():
            mine = per[per.variant == v]
            rows.append({"hardware": hw, "env": ",".join(envs), "size": size, "width": width,
                         "recipe": v, "n_seeds": int(s.shape[0]),
                         "mean_return": float(mine.final_return.mean()),
                         "normalised": float(s.mean()) if scale_ok else np.nan,
                         "poi": poi["p"].get(v, np.nan), "poi_lo": poi["lo"].get(v, np.nan),
                         "poi_hi": poi["hi"].get(v, np.nan),
                         "diverged": int(mine.diverged.sum()),
                         "profile": ",".join(sorted(set(mine.profile.dropna())))})
    return pd.DataFrame(rows, columns=cols)


def evidence(df: pd.DataFrame) -> pd.DataFrame:
    """The records a verdict may use: full-profile records made on a GPU."""
    if not len(df):
        return df
    return df[(df["backend"] == "gpu") & (df["profile"] == "full")]


def _quality_ok(quality: pd.DataFrame, recipe: str) -> dict[Any, bool]:
    """Per width: ``recipe`` not worse than FP32 (the upper end of P(recipe > fp32)'s 95%
    interval reaches 0.5), with >= MIN_SEEDS seeds."""
    q = quality[(quality.recipe == recipe) & (quality.n_seeds >= MIN_SEEDS)] \
        if len(quality) else quality
    return {int(r.width): bool(r.poi_hi >= 0.5) for r in q.itertuples()}


def crossover(pays: dict[int, bool]) -> int | None:
    """The smallest width from which FP8 pays at every wider measured width (None if it does
    not pay at the widest)."""
    out = None
    for w in sorted(pays, reverse=True):
        if not pays[w]:
            break
        out = w
    return out


def a11_verdict(ups: pd.DataFrame, quality: pd.DataFrame, recipe: str = "fp8-delayed"
                ) -> dict[str, Any]:
    """Claim A11 ("FP8 matters for compute-heavy RL such as legged-robot training") from
    :func:`speedups` and :func:`quality_table` of the :func:`evidence` records.

    Speed counts only for non-emulated ratios of two cells recorded in one call
    (``same_commit``). FP8 *pays* at a policy size when ``recipe``'s whole PPO loop reaches
    >= 1.1x BF16's env-steps/s; its *quality holds* at a size when P(``recipe`` > FP32)'s 95%
    interval reaches 0.5 (not worse, the rule of the other RL quality claims) over >= 8 seeds.
    The crossover is the smallest measured width from which FP8 pays at every wider one.

    **reproduced**: FP8 pays at the narrowest measured size (the standard legged policy) and
    its quality holds wherever measured; **partly**: it pays only from a wider crossover on
    (or pays but its quality does not hold); **contradicted**: it pays at no measured size;
    **not yet measured**: no such records.
    """
    u = ups[(ups.recipe == recipe) & ~ups.emulated.astype(bool)
            & ups.same_commit.astype(bool)] if len(ups) else ups
    if not len(u):
        return {"verdict": "not yet measured", "hardware": "", "crossover_width": None,
                "key_number": f"no native-FP8 {recipe}/BF16 pairs of the legged study on a GPU",
                "source": f"results/*/{EXPERIMENT}", "note": "notebook 10_legged"}
    hw = u.groupby("hardware").size().idxmax()
    envs = ", ".join(sorted(set(u[u.hardware == hw].env)))
    u = u[u.hardware == hw].groupby("width", as_index=False).agg(
        e2e=("e2e", "median"), update=("update", "median"), size=("size", "first"),
        physics_share=("physics_share", "first")).sort_values("width")
    pays = {int(r.width): bool(r.e2e >= PAYS) for r in u.itertuples()}
    ok = _quality_ok(quality[quality.hardware == hw] if len(quality) else quality, recipe)
    cross = crossover(pays)
    narrow = int(u.width.min())
    held = all(ok.values()) if ok else None
    if not any(pays.values()):
        verdict = "contradicted"
    elif pays[narrow] and held:
        verdict = "reproduced"
    else:
        verdict = "partly"
    speed = ", ".join(f"{r['e2e']:.2f}x at {r['size']} (width {int(r['width'])}; update alone "
                      f"{r['update']:.2f}x; physics {r['physics_share']:.0%} of the BF16 loop)"
                      for _, r in u.iterrows())
    qual = ("quality not measured with >= 8 seeds" if not ok else "quality vs FP32 "
            + ", ".join(f"width {w}: {'holds' if v else 'worse'}" for w, v in sorted(ok.items())))
    where = (f"FP8 pays from width {cross} on" if cross is not None else
             f"FP8 does not pay up to width {int(u.width.max())}")
    key = f"{recipe}/BF16 whole PPO loop on {envs} (MJX physics): {speed}; {where}; {qual}"
    return {"verdict": verdict, "hardware": hw, "crossover_width": cross, "key_number": key,
            "source": f"results/{hw}/{EXPERIMENT} (env_steps_per_s, update_ms, final_return, "
                      "physics_env_steps_per_s)", "note": "notebook 10_legged"}
