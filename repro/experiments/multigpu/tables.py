from __future__ import annotations

import numpy as np
import pandas as pd

from repro import results
from repro.analysis.stats import ratio

# workload -> (throughput metric, unit) of the multigpu records
METRIC = {"ppo": ("env_steps_per_s", "steps/s"), "lm_dp": ("tokens_per_s", "tokens/s"),
          "lm_fsdp": ("tokens_per_s", "tokens/s")}
BASELINE = "bf16"


def throughput_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, workload, recipe, n_devices) throughput record, with
    ``efficiency`` (throughput_n / (n * throughput_1) of the same hardware, workload and
    recipe) and ``fp8_speedup`` (this recipe over BF16 at the same count; NaN for BF16).
    ``efficiency_same_commit`` / ``fp8_same_commit``: the two cells of that ratio were
    recorded at one git commit (in this repository's GPU workflow: one call, one machine)."""
    cols = ["hardware", "workload", "recipe", "n_devices", "throughput", "unit", "spread",
            "simulated", "emulated", "backend", "profile", "efficiency", "fp8_speedup",
            "git_commit", "efficiency_same_commit", "fp8_same_commit"]
    if df is None or df.empty:
        return pd.DataFrame(columns=cols)
    d = df[df["metric"].isin({m for m, _ in METRIC.values()})].copy()
    if d.empty:
        return pd.DataFrame(columns=cols)
    d["workload"] = [s.get("workload") for s in d["sizes"]]
    d["n_devices"] = [int(e.get("n_devices", s.get("n_devices", 1)))
                      for e, s in zip(d["extra"], d["sizes"])]
    d["simulated"] = [bool(e.get("simulated_devices", False)) for e in d["extra"]]
    d["throughput"] = d["value"].astype(float)
    d["git_commit"] = (d["git_commit"].map(lambda c: c if isinstance(c, str) else "")
                       if "git_commit" in d else "")
    d = d.sort_values("timestamp").drop_duplicates(
        ["hardware", "workload", "recipe", "n_devices"], keep="last")
    key = ["hardware", "workload", "recipe"]
    base = d[d["n_devices"] == 1].set_index(key)["throughput"]
    base_commit = d[d["n_devices"] == 1].set_index(key)["git_commit"]
    d["efficiency_same_commit"] = [
        results.same_commit(row.git_commit, base_commit.get(tuple(row[k] for k in key)))
        for _, row in d.iterrows()]
    d["efficiency"] = [ratio(row.throughput, row.n_devices * base.get(
        tuple(row[k] for k in key), np.nan), f"multigpu efficiency of {row.get('source', row.workload)}")
                       for _, row in d.iterrows()]
    bf = d[d["recipe"] == BASELINE].set_index(["hardware", "workload", "n_devices"])["throughput"]
    d["fp8_speedup"] = [np.nan if row.recipe == BASELINE else
                        ratio(row.throughput, bf.get((row.hardware, row.workload,
                                                      row.n_devices), np.nan),
                              f"multigpu fp8 speedup of {row.get('source', row.workload)}")
                        for _, row in d.iterrows()]
    bf_commit = d[d["recipe"] == BASELINE].set_index(
        ["hardware", "workload", "n_devices"])["git_commit"]
    d["fp8_same_commit"] = [  # False for BF16 itself: no ratio
        row.recipe != BASELINE and results.same_commit(
            row.git_commit, bf_commit.get((row.hardware, row.workload, row.n_devices)))
        for _, row in d.iterrows()]
    return d[cols].sort_values(["hardware", "workload", "recipe", "n_devices"]).reset_index(
        drop=True)
