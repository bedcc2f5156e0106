"""Claim B6 from the ``inference`` records: accuracy, memory and speed of each inference
format against BF16, and the verdict (``repro.studies.inference`` writes the records).

    df = results.load_records("inference")
    acc, mem, spd = accuracy_table(df), bytes_table(df), speed_table(df)
    b6_verdict(acc, mem, spd)      # {"verdict", "key_number", "hardware", "source", ...}
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from repro.analysis.stats import t_interval

# The B6 targets: relative held-out loss gap to BF16 (upper end of the 95% interval over
# seeds), speedups over BF16 timed in the same run, weight bytes relative to BF16.
MARGINS = {"fp8": 0.005, "int8": 0.01}
MIN_SEEDS = 3
PREFILL_TARGET = ("fp8", 1.3)            # FP8 weights+activations, prefill, widest config
DECODE_TARGET = (("fp8-w", "int8-w"), 1, 1.5)  # weight-only decode at batch 1, widest config
BYTES_TARGETS = {"fp8-w": 0.52, "int8-w": 0.52, "nvfp4-w": 0.30}
SOURCE = "results/*/inference/*.json (notebooks/11_inference.py)"


def _sizes(df: pd.DataFrame, key: str) -> pd.Series:
    col = f"size_{key}"
    return df[col] if col in df else pd.Series([None] * len(df), index=df.index)


def _latest(d: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return d.sort_values("timestamp").drop_duplicates(keys, keep="last")


def accuracy_table(df: pd.DataFrame, margins: dict[str, float] | None = None,
                   confidence: float = 0.95) -> pd.DataFrame:
    """One row per (hardware, profile, model, format): seeds, mean held-out loss and BF16's,
    the relative gap (format / BF16 - 1, paired by seed: the same checkpoint) with its
    Student-t interval over seeds, bits per byte, KL(BF16 || format), top-1 agreement, and
    whether the interval's upper end is within the format's declared margin."""
    margins = MARGINS if margins is None else margins
    cols = ["hardware", "profile", "model", "format", "n_seeds", "loss", "loss_bf16",
            "rel_gap", "rel_lo", "rel_hi", "bits_per_byte", "kl", "top1", "margin",
            "within_margin", "best_steps", "emulated"]
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
        margin = margins.get(fmt)
        rows.append({
            "hardware": hw, "profile": prof, "model": model, "format": fmt,
            "n_seeds": len(loss), "loss": float(loss["value"].mean()),
            "loss_bf16": float(base.mean()), "rel_gap": m, "rel_lo": lo, "rel_hi": hi,
            "bits_per_byte": float(loss["value"].mean() / math.log(2)),
            "kl": float(by["kl_to_bf16"]["value"].mean()) if "kl_to_bf16" in by else math.nan,
            "top1": (float(by["top1_agreement"]["value"].mean()) if "top1_agreement" in by
                     else math.nan),
            "margin": margin, "within_margin": (None if margin is None or not math.isfinite(hi)
                                                else bool(hi <= margin)),
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
    program's lowering and bytes, and ``emulated`` (left out of speed verdicts)."""
    cols = ["hardware", "profile", "config", "d_model", "format", "phase", "batch",
            "tokens_per_s", "bf16_tokens_per_s", "speedup", "lowering", "emulated",
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
             "lowering": r.extra["lowering"], "emulated": bool(r.emulated),
             "program_bytes": r.extra.get("program_bytes"),
             "bf16_program_bytes": r.extra.get("bf16_program_bytes"),
             "git_commit": r.git_commit} for r in d.itertuples()]
    return pd.DataFrame(rows, columns=cols).sort_values(
        ["hardware", "profile", "config", "phase", "batch", "format"]).reset_index(drop=True)


def best_evidence(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of a table's best evidence: full profile over smoke, a GPU over a CPU (one
    hardware, one profile)."""
    if t.empty:
        return t
    t = t.assign(_full=(t["profile"] == "full").astype(int),
                 _gpu=(t["hardware"] != "cpu").astype(int))
    top = t.sort_values(["_full", "_gpu"]).iloc[-1]
    return t[(t["_full"] == top["_full"]) & (t["hardware"] == top["hardware"])]


def _part(ok: bool | None, text: str) -> dict[str, Any]:
    return {"ok": ok, "text": text}


def _accuracy_parts(acc: pd.DataFrame, margins: dict[str, float]) -> list[dict]:
    parts = []
    for fmt, margin in margins.items():
        r = acc[acc["format"] == fmt]
        if r.empty or int(r["n_seeds"].iloc[0]) < 2:
            parts.append(_part(None, f"{fmt.upper()} accuracy not measured"))
            continue
        r = r.iloc[0]
        ok = bool(r["rel_hi"] <= margin) if r["n_seeds"] >= MIN_SEEDS else None
        parts.append(_part(ok, f"{fmt.upper()} held-out loss {100 * r['rel_gap']:+.2f}% vs "
                               f"BF16 (95% CI {100 * r['rel_lo']:+.2f}% .. "
                               f"{100 * r['rel_hi']:+.2f}%, {int(r['n_seeds'])} seeds, "
                               f"margin {100 * margin:.1f}%)"))
    return parts


def _speed_parts(spd: pd.DataFrame) -> list[dict]:
    real = spd[~spd["emulated"].astype(bool)] if not spd.empty else spd
    if real.empty:
        return [_part(None, "speed not measured on tensor cores (emulated or no records)")]
    wide = real[real["d_model"] == real["d_model"].max()]
    fmt, target = PREFILL_TARGET
    parts = []
    r = wide[(wide["format"] == fmt) & (wide["phase"] == "prefill")]
    parts.append(_part(None, f"{fmt.upper()} prefill not measured") if r.empty else _part(
        bool(r["speedup"].iloc[0] >= target),
        f"{fmt.upper()} prefill {r['speedup'].iloc[0]:.2f}x BF16 at d_model "
        f"{int(r['d_model'].iloc[0])} (target {target}x)"))
    fmts, batch, target = DECODE_TARGET
    for f in fmts:
        r = wide[(wide["format"] == f) & (wide["phase"] == "decode") & (wide["batch"] == batch)]
        parts.append(_part(None, f"{f} decode not measured") if r.empty else _part(
            bool(r["speedup"].iloc[0] >= target),
            f"{f} decode {r['speedup'].iloc[0]:.2f}x BF16 at batch {batch} (target {target}x)"))
    return parts


def _bytes_parts(mem: pd.DataFrame) -> list[dict]:
    parts = []
    for fmt, limit in BYTES_TARGETS.items():
        r = mem[mem["format"] == fmt]
        parts.append(_part(None, f"{fmt} bytes not measured") if r.empty else _part(
            bool(r["ratio_to_bf16"].iloc[0] <= limit),
            f"{fmt} weights {r['ratio_to_bf16'].iloc[0]:.3f}x BF16 (target <= {limit}x)"))
    return parts


def b6_verdict(acc: pd.DataFrame, mem: pd.DataFrame, spd: pd.DataFrame,
               margins: dict[str, float] | None = None) -> dict[str, Any]:
    """Claim B6's inference half from the three tables (full-profile GPU records preferred).

    Parts: FP8 and INT8 held-out loss within their margins of BF16 (upper end of the 95%
    interval, >= 3 seeds); FP8 prefill >= 1.3x BF16 and weight-only FP8 / INT8 decode at
    batch 1 >= 1.5x at the widest config timed, from records whose products ran on tensor
    cores (not emulated); weight bytes <= 0.52x (FP8/INT8 weight-only) and <= 0.30x (NVFP4)
    of BF16 over the whole model. All parts pass -> "reproduced"; none -> "contradicted";
    otherwise (or a part not measured, or smoke records only) -> "partly". No accuracy
    records: "not yet measured".
    """
    margins = MARGINS if margins is None else margins
    acc, mem, spd = best_evidence(acc), best_evidence(mem), best_evidence(spd)
    if acc.empty:
        return {"verdict": "not yet measured", "key_number": "no inference accuracy records",
                "hardware": "", "source": SOURCE, "note": "", "emulated": False, "parts": []}
    parts = _accuracy_parts(acc, margins) + _speed_parts(spd) + _bytes_parts(mem)
    oks = [p["ok"] for p in parts]
    smoke = acc["profile"].iloc[0] != "full"
    if all(o is True for o in oks) and not smoke:
        verdict = "reproduced"
    elif all(o is False for o in oks):
        verdict = "contradicted"
    else:
        verdict = "partly"
    hw = str(acc["hardware"].iloc[0])
    speed_hw = "" if spd.empty else str(spd["hardware"].iloc[0])
    note = ("inference half of B6 (FP4 training: B4). Accuracy: the same BF16-trained "
            "checkpoint per seed, exported with qwix, step picked by held-out loss. "
            + ("Smoke records only: a pipeline check, not evidence. " if smoke else "")
            + "; ".join(f"{'pass' if p['ok'] else 'FAIL' if p['ok'] is False else 'n/a'}: "
                        f"{p['text']}" for p in parts))
    return {"verdict": verdict, "key_number": "; ".join(p["text"] for p in parts[:3]),
            "hardware": hw if speed_hw in ("", hw) else f"{hw}, {speed_hw}",
            "source": SOURCE, "note": note, "emulated": bool(acc["emulated"].any()),
            "parts": parts}
