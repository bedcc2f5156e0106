"""Tables from the ``grpo`` records (``repro.studies.grpo``) for claim A12, whose rule is
``repro.claims.verdicts.a12``.

* :func:`evidence` -- the records a verdict may use (full profile, GPU).
* :func:`accuracy_table` -- one row per (hardware, arm, seed): the base model's and the
  final held-out accuracy, whether FP8 was emulated.
* :func:`curves` -- one row per (hardware, arm, seed): held-out accuracy and the per-step
  series (reward, token KL between rollout engine and trainer, capped share).
* :func:`arm_summary` -- per (hardware, arm): seeds, mean base and final accuracy, mean gain,
  mean token KL and capped share over the steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

EXPERIMENT = "grpo"
COLUMNS = ["hardware", "arm", "seed", "base", "final", "emulated"]
SERIES = ["curve_steps", "curve", "reward", "mismatch_kl", "is_capped_frac"]


def evidence(df: pd.DataFrame) -> pd.DataFrame:
    """The records a verdict may use: full-profile records made on a GPU."""
    if not len(df):
        return df
    return df[(df["backend"] == "gpu") & (df["profile"] == "full")].reset_index(drop=True)


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
