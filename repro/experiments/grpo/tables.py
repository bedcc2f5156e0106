"""Tables from the ``grpo`` records (``repro.experiments.grpo.measure``) for claim A12, whose
rule is ``repro.claims.verdicts.a12``.

* :func:`evidence` -- the records a verdict may use (full profile, GPU or TPU).
* :func:`accuracy_table` -- one row per (hardware, arm, seed): the base model's and the
  final held-out accuracy, whether FP8 was emulated.
* :func:`shared_bases` -- per (hardware, seed): whether every arm started from one base model.
* :func:`curves` -- one row per (hardware, arm, seed): held-out accuracy and the per-step
  series (reward, token KL between rollout engine and trainer, capped share).
* :func:`arm_summary` -- per (hardware, arm): seeds, mean base and final accuracy, mean gain,
  mean token KL and capped share over the steps.
* :func:`speed_table` -- per (hardware, run, d_model, recipe) of the speed cell: median RL step,
  rollout and update times, and the speedup over the run's BF16 (ratio of medians, and the
  range of the per-round ratios).
* :func:`rl_step_speedup` -- the number A12's rule judges: that speedup at the widest config
  timed with ``d_model`` >= the rule's, where FP8 ran FP8 GEMMs (None otherwise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from repro.analysis.stats import round_ratio_range

EXPERIMENT = "grpo"
COLUMNS = ["hardware", "arm", "seed", "base", "final", "emulated"]
SERIES = ["curve_steps", "curve", "reward", "mismatch_kl", "is_capped_frac"]


def evidence(df: pd.DataFrame) -> pd.DataFrame:
    """The records a verdict may use: full-profile records made on an accelerator (a GPU or a
    TPU: held-out accuracy is the same computation on either, FP8 emulated on the TPU as the
    block FP8 rollouts are everywhere; a speed record counts only where its FP8 ran FP8 GEMMs,
    :func:`rl_step_speedup`)."""
    if not len(df):
        return df
    return df[df["backend"].isin(["gpu", "tpu"]) & (df["profile"] == "full")
              ].reset_index(drop=True)


def _rows(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    if not len(df):
        return pd.DataFrame()
    d = df[df.metric == metric]
    return pd.DataFrame({"hardware": d.hardware.values,
                         "arm": d.sizes.map(lambda s: s.get("arm")).values,
                         "seed": d.sizes.map(lambda s: s.get("seed")).values,
                         "value": d.value.astype(float).values,
                         "emulated": d.emulated.astype(bool).values,
                         "extra": d.extra.values})


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (hardware, arm, seed): ``base`` and ``final`` held-out accuracy, ``emulated``."""
    final, base = _rows(df, "heldout_accuracy"), _rows(df, "base_accuracy")
    if not len(final):
        return pd.DataFrame(columns=COLUMNS)
    keys = ["hardware", "arm", "seed"]
    out = final.rename(columns={"value": "final"}).merge(
        base[keys + ["value"]].rename(columns={"value": "base"}), on=keys, how="left")
    return out[COLUMNS].sort_values(keys).reset_index(drop=True)


def shared_bases(df: pd.DataFrame) -> pd.DataFrame:
    """Per (hardware, seed): the arms recorded, how many distinct base models they started
    from (the digest of the warm-up's parameters, ``extra.base``; records without one count as
    unknown) and ``shared``: one base for every arm, which the paired comparison assumes."""
    final = _rows(df, "heldout_accuracy")
    if not len(final):
        return pd.DataFrame(columns=["hardware", "seed", "arms", "bases", "shared"])
    final["digest"] = final.extra.map(lambda e: ((e or {}).get("base") or {}).get("digest"))
    rows = [{"hardware": hw, "seed": seed, "arms": len(g),
             "bases": g.digest.nunique() if g.digest.notna().all() else None,
             "shared": bool(g.digest.notna().all() and g.digest.nunique() == 1)}
            for (hw, seed), g in final.groupby(["hardware", "seed"], sort=True)]
    return pd.DataFrame(rows)


def curves(df: pd.DataFrame) -> pd.DataFrame:
    """Per (hardware, arm, seed): the held-out curve and the per-step series of the cell."""
    final = _rows(df, "heldout_accuracy")
    if not len(final):
        return pd.DataFrame(columns=["hardware", "arm", "seed", *SERIES])
    for k in SERIES:
        final[k] = final.extra.map(
            lambda e, k=k: np.array([np.nan if x is None else x for x in e.get(k) or []],
                                    float))
    return final.drop(columns=["extra", "value"]).reset_index(drop=True)


def arm_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (hardware, arm): seeds, mean base and final accuracy, mean gain over the base,
    and the token KL and capped share averaged over steps and seeds."""
    acc, cur = accuracy_table(df), curves(df)
    if not len(acc):
        return pd.DataFrame()
    cur = cur.assign(kl=cur.mismatch_kl.map(np.nanmean),
                     capped=cur.is_capped_frac.map(np.nanmean))
    d = acc.merge(cur[["hardware", "arm", "seed", "kl", "capped"]],
                  on=["hardware", "arm", "seed"])
    return d.assign(gain=d.final - d.base).groupby(["hardware", "arm"], sort=False).agg(
        seeds=("seed", "count"), base=("base", "mean"), final=("final", "mean"),
        gain=("gain", "mean"), mismatch_kl=("kl", "mean"), capped_frac=("capped", "mean"),
        emulated=("emulated", "any")).reset_index()


SPEED_COLUMNS = ["hardware", "run_id", "d_model", "recipe", "step_s", "rollout_s", "update_s",
                 "rollout_tokens_per_s", "speedup", "speedup_lo", "speedup_hi", "rounds",
                 "emulated"]


def speed_table(df: pd.DataFrame, reference: str = "bf16") -> pd.DataFrame:
    """Per (hardware, run, d_model, recipe) of the speed cell's ``rl_step_s`` records: the
    medians over rounds, and ``speedup``: ``reference``'s median step time over the recipe's,
    both timed in the same interleaved rounds (A12's registered statistic, a ratio of medians
    of paired rounds), with the range of the per-round ratios in ``speedup_lo`` ..
    ``speedup_hi``."""
    if not len(df):
        return pd.DataFrame(columns=SPEED_COLUMNS)
    d = df[df.metric == "rl_step_s"]
    rows = []
    for _, r in d.iterrows():
        e = r.extra or {}
        step = np.asarray(e.get("step_samples_s") or [], float)
        roll = np.asarray(e.get("rollout_samples_s") or [], float)
        rows.append({"hardware": r.hardware, "run_id": e.get("run_id"),
                     "d_model": (r.sizes or {}).get("d_model"), "recipe": r.recipe,
                     "step": step, "step_s": float(np.median(step)) if len(step) else np.nan,
                     "rollout_s": float(np.median(roll)) if len(roll) else np.nan,
                     "update_s": float(np.median(e.get("update_samples_s") or [np.nan])),
                     "rollout_tokens_per_s": float(np.median(e.get("rollout_tokens", 0) / roll))
                     if len(roll) else np.nan,
                     "rounds": len(step), "emulated": bool(r.emulated)})
    if not rows:
        return pd.DataFrame(columns=SPEED_COLUMNS)
    t = pd.DataFrame(rows)
    out = []
    for _, g in t.groupby(["hardware", "run_id", "d_model"], sort=True):
        ref = g[g.recipe == reference]
        base = ref.step.iloc[0] if len(ref) else None
        for _, r in g.iterrows():
            paired = base is not None and len(base) == len(r.step) and len(base)
            lo, hi = round_ratio_range(list(base) if paired else [], list(r.step))
            out.append({**r.drop("step").to_dict(),
                        "speedup": float(np.median(base) / np.median(r.step)) if paired
                        else np.nan, "speedup_lo": lo, "speedup_hi": hi})
    return pd.DataFrame(out)[SPEED_COLUMNS].sort_values(
        ["hardware", "d_model", "recipe"]).reset_index(drop=True)


def rl_step_speedup(table: pd.DataFrame, recipe: str = "fp8-current", min_d_model: int = 4096
                    ) -> tuple[float | None, str]:
    """``(speedup, where)``: ``recipe``'s paired RL-step speedup over BF16 at the widest
    ``d_model`` >= ``min_d_model`` timed, FP8 GEMMs run (not emulated); None and why not."""
    if table is None or not len(table):
        return None, "no speed record"
    t = table[(table.recipe == recipe) & (table.d_model >= min_d_model)]
    if not len(t):
        return None, f"no {recipe} speed record at d_model >= {min_d_model}"
    t = t[~t.emulated]
    if not len(t):
        return None, f"{recipe}'s speed records ran no FP8 GEMM (emulated): not judged"
    best = t.sort_values(["d_model", "rounds"]).iloc[-1]
    return float(best.speedup), (f"{best.hardware}, d_model {int(best.d_model)}, "
                                 f"{int(best.rounds)} paired rounds (range "
                                 f"{best.speedup_lo:.2f}-{best.speedup_hi:.2f}x)")
