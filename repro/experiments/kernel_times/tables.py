from __future__ import annotations

import pandas as pd

# the trace reading of `repro trace`, whose records these tables read
from repro.studies.kernel_trace import (CLASSES, kernel_class, kernel_events,  # noqa: F401
                                        load_trace, summarize)


def headroom(base: pd.Series, fast: pd.Series, target: float = 1.5) -> dict[str, float]:
    """Amdahl's law over two traced steps (ms per step: ``gemm`` and ``kernel``, the total).

    ``gemm x``: how much faster ``fast``'s GEMM kernels are; ``update x``: the whole step's
    ratio; ``bound``: the step ratio ``fast`` would reach if it added no time outside the GEMMs
    (``base``'s non-GEMM time kept); ``added ms``: the non-GEMM time it adds (for FP8: amax
    reductions, converts, operand transposes); ``allowed ms``: the non-GEMM time it may spend
    and still be ``target`` x ``base``; ``spent ms``: what it spends.
    """
    b_other = base["kernel"] - base["gemm"]
    f_other = fast["kernel"] - fast["gemm"]
    return {"gemm x": base["gemm"] / fast["gemm"], "update x": base["kernel"] / fast["kernel"],
            "bound": base["kernel"] / (fast["gemm"] + b_other), "added ms": f_other - b_other,
            "allowed ms": base["kernel"] / target - fast["gemm"], "spent ms": f_other}


def update_kernels(records: pd.DataFrame, workload: str = "ppo") -> pd.DataFrame:
    """Traced step times of ``workload`` (``kernel_times`` records), in ms per step, one row
    per (hardware, width, num_envs, recipe): GEMM kernels, other kernels, memory copies, all
    kernels, wall time, and the GEMM share. Traces of emulated recipes are left out: their
    times are not the format's."""
    if not len(records):
        return pd.DataFrame()
    kt = records[records["sizes"].map(lambda s: (s or {}).get("workload") == workload)
                 & ~records["emulated"].fillna(False).astype(bool)]
    if not len(kt):
        return pd.DataFrame()
    kt = kt.assign(width=kt["sizes"].map(lambda s: s.get("width")),
                   num_envs=kt["sizes"].map(lambda s: s.get("num_envs")))
    t = kt.pivot_table(index=["hardware", "width", "num_envs", "recipe"], columns="metric",
                       values="value", aggfunc="median")
    keep = [c for c in ("gemm_ms_per_step", "other_ms_per_step", "memory_ms_per_step",
                        "kernel_ms_per_step", "wall_ms_per_step") if c in t]
    t = t[keep].rename(columns=lambda c: c.replace("_ms_per_step", " ms"))
    t["gemm share"] = t["gemm ms"] / t["kernel ms"]
    return t


def amdahl_table(kernels: pd.DataFrame, baseline: str = "bf16",
                 target: float = 1.5) -> pd.DataFrame:
    """:func:`headroom` of every recipe of :func:`update_kernels` against ``baseline`` traced
    at the same (hardware, width, num_envs); ``within``: the non-GEMM time it spends fits the
    budget that ``target`` leaves."""
    rows = []
    if not len(kernels):
        return pd.DataFrame(rows)
    for (hw, w, n), g in kernels.groupby(level=["hardware", "width", "num_envs"]):
        g = g.droplevel(["hardware", "width", "num_envs"]).rename(
            columns=lambda c: c.replace(" ms", ""))
        if baseline not in g.index:
            continue
        for rec, f in g.drop(index=baseline).iterrows():
            rows.append(dict(hardware=hw, width=w, num_envs=n, recipe=rec,
                             **headroom(g.loc[baseline], f, target=target)))
    out = pd.DataFrame(rows)
    if len(out):
        out["within"] = out["spent ms"] <= out["allowed ms"]
    return out


def top_other_kernels(records: pd.DataFrame, workload: str = "ppo", n: int = 5) -> pd.DataFrame:
    """The ``n`` costliest non-GEMM kernels of each non-BF16 traced step of ``workload``."""
    rows = []
    gemm = records[(records["metric"] == "gemm_ms_per_step") & (records["recipe"] != "bf16")
                   & records["sizes"].map(lambda s: (s or {}).get("workload") == workload)
                   & ~records["emulated"].fillna(False).astype(bool)] if len(records) else []
    for r in (gemm.itertuples() if len(gemm) else []):
        other = [k for k in (r.extra or {}).get("top_kernels", []) if k["class"] != "gemm"]
        rows += [{"hardware": r.hardware, "width": r.sizes.get("width"), "recipe": r.recipe,
                  "kernel": k["name"][:60], "ms per step": k["ms_per_step"]}
                 for k in other[:n]]
    return pd.DataFrame(rows)
