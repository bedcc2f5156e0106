"""Tables for claim B6 from the ``inference`` records: accuracy, memory and speed of each
inference format against BF16 (``repro.experiments.inference.measure`` writes the records; the
rule is ``repro.claims.verdicts.b6``).

    df = evidence.load_records("inference")
    acc, mem, spd = accuracy_table(df), bytes_table(df), speed_table(df)
    numbers = key_numbers(acc, mem, spd)  # for metrics/11_inference.json
    verdicts.b6(acc, mem, spd)     # a Verdict
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from repro.analysis.stats import t_interval


def _sizes(df: pd.DataFrame, key: str) -> pd.Series:
    col = f"size_{key}"
    return df[col] if col in df else pd.Series([None] * len(df), index=df.index)


def _latest(d: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return d.sort_values("timestamp").drop_duplicates(keys, keep="last")


def accuracy_table(df: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """One row per (hardware, profile, model, format): seeds, mean held-out loss and BF16's,
    the relative gap (format / BF16 - 1, paired by seed: the same checkpoint) with its
    Student-t interval over seeds, bits per byte, KL(BF16 || format) and top-1 agreement."""
    cols = ["hardware", "profile", "model", "format", "n_seeds", "loss", "loss_bf16",
            "rel_gap", "rel_lo", "rel_hi", "bits_per_byte", "kl", "top1", "best_steps",
            "emulated"]
    if df.empty or "metric" not in df:
        return pd.DataFrame(columns=cols)
    d = df[df["metric"].isin(["heldout_loss", "kl_to_bf16", "top1_agreement"])].copy()
    if d.empty:
        return pd.DataFrame(columns=cols)
    d["model"], d["seed"] = _sizes(d, "model"), _sizes(d, "seed")
    d = _latest(d, ["hardware", "profile", "model", "recipe", "seed", "metric"])
    rows = []
    for (hw, prof, model, fmt), g in d.groupby(["hardware", "profile", "model", "recipe"]):
        by = {m: x.set_index("seed") for m, x in g.groupby("metric")}
        loss = by.get("heldout_loss")
        if loss is None:
            continue
        base = np.asarray([e["loss_bf16"] for e in loss["extra"]], float)
        rel = loss["value"].to_numpy(float) / base - 1.0
        m, lo, hi = t_interval(rel, confidence)
        rows.append({
            "hardware": hw, "profile": prof, "model": model, "format": fmt,
            "n_seeds": len(loss), "loss": float(loss["value"].mean()),
            "loss_bf16": float(base.mean()), "rel_gap": m, "rel_lo": lo, "rel_hi": hi,
            "bits_per_byte": float(loss["value"].mean() / math.log(2)),
            "kl": float(by["kl_to_bf16"]["value"].mean()) if "kl_to_bf16" in by else math.nan,
            "top1": (float(by["top1_agreement"]["value"].mean()) if "top1_agreement" in by
                     else math.nan),
            "best_steps": sorted({int(e["best_step"]) for e in loss["extra"]}),
            "emulated": bool(g["emulated"].any())})
    return pd.DataFrame(rows, columns=cols)


def bytes_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, profile, model, format): exact weight bytes of the exported
    model, their ratio to BF16 over the whole model and over the quantized layers only, the
    bytes the arrays take as they run and the checkpoint's bytes on disk."""
    cols = ["hardware", "profile", "model", "format", "weight_bytes", "bf16_bytes",
            "ratio_to_bf16", "ratio_quantized_layers", "in_memory_bytes", "on_disk_bytes"]
    d = df[df["metric"] == "weight_bytes"].copy() if "metric" in df else df.iloc[:0]
    if d.empty:
        return pd.DataFrame(columns=cols)
    d["model"] = _sizes(d, "model")
    d = _latest(d, ["hardware", "profile", "model", "recipe"])
    rows = [{"hardware": r.hardware, "profile": r.profile, "model": r.model,
             "format": r.recipe, "weight_bytes": float(r.value),
             "bf16_bytes": r.extra["bf16_bytes"], "ratio_to_bf16": r.extra["ratio_to_bf16"],
             "ratio_quantized_layers": r.extra["ratio_to_bf16_quantized"],
             "in_memory_bytes": r.extra["in_memory"],
             "on_disk_bytes": r.extra.get("checkpoint_bytes_on_disk")}
            for r in d.itertuples()]
    return pd.DataFrame(rows, columns=cols)


def speed_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, profile, config, format, phase, batch): the format's and BF16's
    tokens/s timed in the same run, the speedup (ratio of the medians), the compiled
    program's lowering and bytes, the weight-only kernel that ran (``kernel``: "gemv",
    "reduce", "xla", "pallas", or None: qwix's product; records made before it was recorded
    say None) and
    ``emulated`` (left out of speed verdicts)."""
    cols = ["hardware", "profile", "config", "d_model", "format", "phase", "batch",
            "tokens_per_s", "bf16_tokens_per_s", "speedup", "lowering", "kernel", "emulated",
            "program_bytes", "bf16_program_bytes", "git_commit"]
    if "metric" not in df:
        return pd.DataFrame(columns=cols)
    d = df[df["metric"].isin(["prefill_tokens_per_s", "decode_tokens_per_s"])].copy()
    if d.empty:
        return pd.DataFrame(columns=cols)
    for k in ("config", "d_model", "phase", "batch"):
        d[k] = _sizes(d, k)
    d = _latest(d, ["hardware", "profile", "config", "recipe", "phase", "batch"])
    rows = [{"hardware": r.hardware, "profile": r.profile, "config": r.config,
             "d_model": int(r.d_model), "format": r.recipe, "phase": r.phase,
             "batch": int(r.batch), "tokens_per_s": float(r.value),
             "bf16_tokens_per_s": r.extra["bf16_tokens_per_s"], "speedup": r.extra["speedup"],
             "lowering": r.extra["lowering"], "kernel": r.extra.get("kernel"),
             "emulated": bool(r.emulated),
             "program_bytes": r.extra.get("program_bytes"),
             "bf16_program_bytes": r.extra.get("bf16_program_bytes"),
             "git_commit": r.git_commit} for r in d.itertuples()]
    return pd.DataFrame(rows, columns=cols).sort_values(
        ["hardware", "profile", "config", "phase", "batch", "format"]).reset_index(drop=True)


def best_evidence(t: pd.DataFrame, hardware: str | None = None) -> pd.DataFrame:
    """The rows of a table's best evidence: full profile over smoke, a GPU over a CPU (one
    hardware, one profile). ``hardware``: that hardware's rows, where it has any (B6 judges
    speed on the hardware its accuracy was measured on: one claim, one machine); otherwise,
    between accelerators, the first by name."""
    if t.empty:
        return t
    if hardware is not None and (t["hardware"] == hardware).any():
        t = t[t["hardware"] == hardware]
    t = t.sort_values("hardware", ascending=False, kind="stable")
    t = t.assign(_full=(t["profile"] == "full").astype(int),
                 _gpu=(t["hardware"] != "cpu").astype(int))
    top = t.sort_values(["_full", "_gpu"]).iloc[-1]
    return t[(t["_full"] == top["_full"]) & (t["hardware"] == top["hardware"])]


def widest_timed(spd: pd.DataFrame) -> pd.DataFrame:
    """The speed rows that ran on tensor cores (not emulated), each format's at the widest
    config (``d_model``) it was timed at: a format timed at fewer configs than another is
    still judged where it was timed."""
    real = spd[~spd["emulated"].astype(bool)] if len(spd) else spd
    if real.empty:
        return real
    widest = real.groupby("format")["d_model"].transform("max")
    return real[real["d_model"] == widest]


def key_numbers(acc: pd.DataFrame, mem: pd.DataFrame, spd: pd.DataFrame) -> dict:
    """B6's numbers per format (BF16 left out), for ``metrics/11_inference.json``, from the best
    evidence of each table (memory and speed on the accuracy's hardware, as B6 judges them):
    ``rel_gap`` and ``rel_hi`` (accuracy), ``ratio_to_bf16`` (weight
    bytes), and ``<phase>_b<batch>_speedup`` with the ``speed_d_model`` it was timed at, of
    the records that ran on tensor cores (not emulated) at the format's widest config timed
    (:func:`widest_timed`)."""
    out: dict[str, dict] = {}
    acc = best_evidence(acc)
    hw = str(acc["hardware"].iloc[0]) if len(acc) else None
    for r in acc.itertuples():
        out.setdefault(r.format, {}).update(rel_gap=r.rel_gap, rel_hi=r.rel_hi)
    for r in best_evidence(mem, hw).itertuples():
        out.setdefault(r.format, {})["ratio_to_bf16"] = r.ratio_to_bf16
    for r in widest_timed(best_evidence(spd, hw)).itertuples():
        out.setdefault(r.format, {}).update({f"{r.phase}_b{r.batch}_speedup": r.speedup,
                                             "speed_d_model": int(r.d_model)})
    return {k: v for k, v in out.items() if k != "bf16"}
