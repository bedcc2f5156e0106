from __future__ import annotations

import math
from typing import Any

import numpy as np

from repro.analysis.stats import t_interval

RUN_KEYS = ["hardware", "profile", "model", "recipe", "seed"]

LOSS_METRICS = ("best_eval_loss", "final_eval_loss", "final_train_loss")


def run_losses(df):
    """One row per (hardware, profile, model, variant, seed): the losses a run ended with.

    ``final_eval_loss``: held-out loss at the last step. ``best_eval_loss``: the lowest
    held-out loss over the run's evaluations (the early-stopping loss; equal to the final one
    while the held-out loss still falls) and ``best_step``, where it was reached.
    ``final_train_loss``: the training loss logged at the last evaluation. ``overfit``:
    final / best held-out loss - 1 (0 for a run whose held-out loss never rose).
    ``truncated_at``: the step a run truncated on purpose ended at (params.yaml ``stop_at``;
    NaN otherwise); such a run has no final losses or overfit (NaN), only its curve and the
    best held-out loss over it.
    """
    import pandas as pd

    cols = RUN_KEYS + ["final_eval_loss", "best_eval_loss", "best_step", "final_train_loss",
                       "overfit", "truncated_at", "emulated", "curve"]
    need = {"hardware", "profile", "size_model", "recipe", "size_seed", "value", "emulated"}
    if df.empty or not need <= set(df.columns):
        return pd.DataFrame(columns=cols)
    ren = {"size_model": "model", "size_seed": "seed"}
    f = (df[df["metric"] == "final_eval_loss"].rename(columns=ren)
         .drop_duplicates(RUN_KEYS, keep="last").set_index(RUN_KEYS))
    ev = df[df["metric"] == "eval_loss"].rename(columns=ren)
    by_run = dict(iter(ev.groupby(RUN_KEYS)))
    rows = []
    for key, r in f.iterrows():
        g = by_run.get(key, ev.iloc[:0])
        g = g.drop_duplicates("size_step", keep="last").sort_values("size_step")
        final = float(r["value"])
        curve = {int(k): float(v) for k, v in zip(g["size_step"], g["value"])}
        if len(g):
            i = int(np.argmin(g["value"].to_numpy()))
            best, step = float(g["value"].iloc[i]), int(g["size_step"].iloc[i])
            train = g["extra"].iloc[-1].get("train_loss")
        else:
            best, step, train = final, None, None
        cut = r["extra"].get("truncated_at")
        if cut is not None:  # ended on purpose: no final losses, only the curve so far
            final = train = math.nan
        else:
            best = min(best, final)
        rows.append({**dict(zip(RUN_KEYS, key)), "final_eval_loss": final,
                     "best_eval_loss": best, "best_step": step,
                     "final_train_loss": None if train is None else float(train),
                     "overfit": final / best - 1.0,
                     "truncated_at": math.nan if cut is None else int(cut),
                     "emulated": bool(r["emulated"]), "curve": curve})
    return pd.DataFrame(rows, columns=cols)


def _paired_best(a: dict, b: dict, fallback: tuple[float, float]) -> tuple[float, float]:
    """Best held-out losses of two runs over the evaluation steps BOTH have (runs recorded
    with different evaluation schedules are compared at the same points)."""
    common = sorted(set(a) & set(b))
    if not common:
        return fallback
    return min(a[k] for k in common), min(b[k] for k in common)


def paired_gaps(df, baseline: str = "bf16", confidence: float = 0.95,
                metric: str = "best_eval_loss"):
    """Loss gap of every variant to ``baseline``, paired by seed (same init and batches).

    ``metric`` is one of :data:`LOSS_METRICS` (see :func:`run_losses`); the best held-out
    losses of a pair are taken over the evaluation steps both runs have. One row per
    (hardware, profile, model, variant): seeds, mean gap in nats with its t interval, and the
    relative gap (gap / baseline loss) with its t interval; ``overfit``: the largest
    final/best held-out loss - 1 of the runs compared; ``truncated_at``: where the variant's
    runs ended on purpose (NaN for whole runs): their best held-out loss is compared over the
    evaluations up to there, and they have no final losses to compare.
    """
    import pandas as pd

    if metric not in LOSS_METRICS:
        raise ValueError(f"metric {metric!r}: choose one of {', '.join(LOSS_METRICS)}")
    fl = run_losses(df)
    rows = []
    for (hw, prof, size), g in fl.groupby(["hardware", "profile", "model"]):
        base = g[g["recipe"] == baseline].set_index("seed")
        for rec, gr in g.groupby("recipe"):
            if rec == baseline:
                continue
            s = gr.set_index("seed")
            seeds = sorted(i for i in set(s.index) & set(base.index)
                           if s.loc[i, metric] is not None and base.loc[i, metric] is not None
                           and math.isfinite(s.loc[i, metric])
                           and math.isfinite(base.loc[i, metric]))
            if not seeds:
                continue
            b, x = base.loc[seeds, metric].astype(float), s.loc[seeds, metric].astype(float)
            if metric == "best_eval_loss":  # over the evaluation steps both runs have
                pairs = [_paired_best(base.loc[i, "curve"], s.loc[i, "curve"], (b[i], x[i]))
                         for i in seeds]
                b = pd.Series([u for u, _ in pairs], index=seeds)
                x = pd.Series([v for _, v in pairs], index=seeds)
            gap = list(x - b)
            rel = list((x - b) / b)
            m, lo, hi = t_interval(gap, confidence)
            rm, rlo, rhi = t_interval(rel, confidence)
            rows.append({"hardware": hw, "profile": prof, "model": size, "recipe": rec,
                         "baseline": baseline, "metric": metric, "n_seeds": len(seeds),
                         "baseline_loss": float(b.mean()), "loss": float(x.mean()),
                         "gap_nats": m, "gap_lo": lo, "gap_hi": hi,
                         "rel_gap": rm, "rel_lo": rlo, "rel_hi": rhi,
                         "overfit": float(pd.concat([base.loc[seeds, "overfit"],
                                                     s.loc[seeds, "overfit"]]).astype(float)
                                          .max()),  # NaN-skipping: truncated runs have none
                         "truncated_at": float(s.loc[seeds, "truncated_at"].max()),
                         "emulated": bool(gr["emulated"].any())})
    return pd.DataFrame(rows, columns=[
        "hardware", "profile", "model", "recipe", "baseline", "metric", "n_seeds",
        "baseline_loss", "loss", "gap_nats", "gap_lo", "gap_hi", "rel_gap", "rel_lo", "rel_hi",
        "overfit", "truncated_at", "emulated"])

SIZE_ORDER = {"tiny": 0, "20m": 1, "120m": 2}


def b4_verdict(gaps, threshold: float = 0.015, min_seeds: int = 3) -> dict[str, Any]:
    """Claim B4 from ``paired_gaps(df, "bf16")``: the rule the notebook states.

    Evidence: the largest model with >= ``min_seeds`` paired NVFP4/BF16 seeds (full profile
    preferred over smoke). With the 95% t-interval [lo, hi] of the relative gap
    (NVFP4 - BF16) / BF16 of the gaps' metric (the best held-out loss by default): hi <= 1.5%
    -> "reproduced"; lo > 1.5% -> "contradicted"; otherwise "partly" (the interval straddles
    1.5%). From smoke records only (the tiny model, ~100 steps) a passing rule gives at most
    "partly": that is a pipeline check, not evidence.
    """
    g = gaps[(gaps["recipe"] == "nvfp4") & (gaps["n_seeds"] >= min_seeds)]
    if g.empty:
        return {"verdict": "not yet measured", "row": None,
                "key_number": "no NVFP4/BF16 pair with enough seeds"}
    g = g.assign(_full=(g["profile"] == "full").astype(int),
                 _size=g["model"].map(SIZE_ORDER).fillna(-1))
    row = g.sort_values(["_full", "_size", "n_seeds"]).iloc[-1]
    if row["rel_hi"] <= threshold:
        verdict = "reproduced"
    elif row["rel_lo"] > threshold:
        verdict = "contradicted"
    else:
        verdict = "partly"
    smoke_only = row["profile"] != "full"
    if smoke_only and verdict == "reproduced":
        verdict = "partly"
    what = {"best_eval_loss": "best held-out loss", "final_eval_loss": "final held-out loss",
            "final_train_loss": "final training loss"}.get(row.get("metric"), "held-out loss")
    key = (f"NVFP4 vs BF16 {what} {100 * row['rel_gap']:+.2f}% "
           f"(95% CI {100 * row['rel_lo']:+.2f}% .. {100 * row['rel_hi']:+.2f}%, "
           f"{int(row['n_seeds'])} seeds, {row['model']} model, {row['profile']} profile"
           f"{', emulated NVFP4' if row['emulated'] else ''})")
    return {"verdict": verdict, "row": row, "key_number": key, "smoke_only": smoke_only}


def b3_verdict(df, limit: float = 0.30) -> dict[str, Any]:
    """Claim B3 from the stored-bytes records: the rule the notebook states.

    format ratio: NVFP4 bytes / BF16 (= FP16) bytes over the tensors the policy quantizes,
    max of weights and activations. model ratio: weights + activations of the whole model
    under the paper policy (BF16 embedding, head, last block). format ratio <= 0.30 (1/4 plus
    at most 5 points of scales) and model ratio <= 0.30 -> "reproduced"; format ratio <= 0.30
    only -> "partly"; else "contradicted". Uses the largest model recorded.
    """
    m = df[(df["recipe"] == "nvfp4") & df["metric"].str.startswith("stored_")] \
        if not df.empty else df
    if m.empty:
        return {"verdict": "not yet measured", "key_number": "no stored-bytes records"}
    m = m.assign(_size=m["size_model"].map(SIZE_ORDER).fillna(-1))
    size = m.sort_values("_size")["size_model"].iloc[-1]
    m = m[m["size_model"] == size].drop_duplicates("metric", keep="last").set_index("metric")
    hardware = str(m["hardware"].iloc[-1])

    def ratio(metric):
        return float(m.loc[metric, "extra"]["ratio_to_bf16"])

    w_q, a_q = ratio("stored_weight_bytes_quantized_only"), ratio(
        "stored_activation_bytes_quantized_only")
    whole = ((m.loc["stored_weight_bytes", "value"] + m.loc["stored_activation_bytes", "value"])
             / (m.loc["stored_weight_bytes", "extra"]["bf16_bytes"]
                + m.loc["stored_activation_bytes", "extra"]["bf16_bytes"]))
    fmt = max(w_q, a_q)
    verdict = ("reproduced" if fmt <= limit and whole <= limit else
               "partly" if fmt <= limit else "contradicted")
    key = (f"NVFP4 tensors take {w_q:.3f} (weights, 16x16 blocks) and {a_q:.3f} (activations, "
           f"1x16) of their BF16/FP16 bytes; the {size} model's GEMM operands under NVIDIA's "
           f"policy {whole:.3f}")
    return {"verdict": verdict, "key_number": key, "model": size, "weights": w_q,
            "activations": a_q, "whole": float(whole), "hardware": hardware}
