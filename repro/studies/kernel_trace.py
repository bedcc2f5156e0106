"""Reading a JAX profiler trace: the device kernels of a Perfetto trace, classed by name
(gemm, attention, collective, memory, other), and their time per traced step. What
``repro trace`` (:mod:`repro.experiments.kernel_times.measure`) records;
:mod:`repro.experiments.kernel_times.tables` builds its tables on these."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

CLASSES = ("gemm", "attention", "collective", "memory", "other")


# Checked in this order: a flash-attention kernel's name also says "gemm"-like things.
_PATTERNS = (
    ("collective", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all",
                              re.I)),
    ("attention", re.compile(r"fmha|flash|sdpa|attention", re.I)),
    ("memory", re.compile(r"memcpy|memset", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|wgmma|matmul", re.I)),
)


# Lines the profiler derives from the kernels (not kernels themselves).
_OVERLAY = re.compile(r"xla ops|xla modules|steps|tensorflow|launch stats|source", re.I)


def kernel_class(name: str) -> str:
    """The class of a device kernel, from its name."""
    for cls, pat in _PATTERNS:
        if pat.search(name):
            return cls
    return "other"


def kernel_events(trace: dict[str, Any] | list) -> pd.DataFrame:
    """Complete events (``ph == "X"``) of a Perfetto/Chrome trace that ran on a device stream:
    columns name, ts, dur (microseconds), pid, tid, process, thread, class."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    proc, thread = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            proc[e["pid"]] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread[(e["pid"], e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    device = {p for p, n in proc.items()
              if n.startswith("/device:") and not n.startswith("/device:CPU")}
    rows = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device:
            continue
        tname = thread.get((e["pid"], e.get("tid")), "")
        if _OVERLAY.search(tname):
            continue
        rows.append({"name": str(e.get("name", "")), "ts": float(e.get("ts", 0.0)),
                     "dur": float(e.get("dur", 0.0)), "pid": e["pid"], "tid": e.get("tid"),
                     "process": proc[e["pid"]], "thread": tname})
    df = pd.DataFrame(rows, columns=["name", "ts", "dur", "pid", "tid", "process", "thread"])
    df["class"] = [kernel_class(n) for n in df["name"]]
    return df


def summarize(kernels: pd.DataFrame, steps: int) -> dict[str, Any]:
    """Per-step milliseconds by class, kernel count and the costliest kernels."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    ms = {f"{c}_ms_per_step": float(kernels.loc[kernels["class"] == c, "dur"].sum())
          / 1e3 / steps for c in CLASSES}
    top = (kernels.groupby(["name", "class"])["dur"].agg(["sum", "count"])
           .sort_values("sum", ascending=False).head(15).reset_index())
    return {**ms, "kernel_ms_per_step": float(kernels["dur"].sum()) / 1e3 / steps,
            "kernels_per_step": len(kernels) / steps,
            "top_kernels": [{"name": r["name"][:120], "class": r["class"],
                             "ms_per_step": float(r["sum"]) / 1e3 / steps,
                             "calls_per_step": float(r["count"]) / steps}
                            for _, r in top.iterrows()]}


def load_trace(logdir: Path) -> dict[str, Any]:
    """The newest ``perfetto_trace.json.gz`` under ``logdir``."""
    files = sorted(Path(logdir).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {logdir}")
    with gzip.open(files[-1], "rt") as f:
        return json.load(f)
