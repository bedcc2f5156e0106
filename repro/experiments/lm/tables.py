from __future__ import annotations

import math

import numpy as np

from repro.analysis.stats import t_interval

RUN_KEYS = ["hardware", "profile", "model", "recipe", "seed"]

LOSS_METRICS = ("best_eval_loss", "final_eval_loss", "final_train_loss")

SIZE_ORDER = {"tiny": 0, "20m": 1, "120m": 2}  # model presets, smallest first


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

def stored_ratios(df):
    """NVFP4's stored bytes relative to BF16 (= FP16), one row per model size, from the
    ``stored_*_bytes`` records: ``weights`` and ``activations`` over the tensors the policy
    quantizes (16x16 weight blocks, 1x16 activation blocks), ``whole``: the whole model's GEMM
    operands under the policy (BF16 embedding, head, last block), and the ``hardware`` of the
    records (the last one recorded per metric)."""
    import pandas as pd

    cols = ["model", "hardware", "weights", "activations", "whole"]
    m = df[(df["recipe"] == "nvfp4") & df["metric"].str.startswith("stored_")] \
        if not df.empty else df
    rows = []
    for size, g in (m.groupby("size_model") if len(m) else []):
        g = g.drop_duplicates("metric", keep="last").set_index("metric")

        def ratio(metric):
            return float(g.loc[metric, "extra"]["ratio_to_bf16"])

        w, a = g.loc["stored_weight_bytes"], g.loc["stored_activation_bytes"]
        whole = (w["value"] + a["value"]) / (w["extra"]["bf16_bytes"] + a["extra"]["bf16_bytes"])
        rows.append({"model": size, "hardware": str(g["hardware"].iloc[-1]),
                     "weights": ratio("stored_weight_bytes_quantized_only"),
                     "activations": ratio("stored_activation_bytes_quantized_only"),
                     "whole": float(whole)})
    return pd.DataFrame(rows, columns=cols)


def truncation_check(runs):
    """Is comparing a run truncated on purpose (``truncated_at``) over the evaluations up to
    its cut fair? Only if the whole runs beside it were best before the cut. One row per
    (hardware, profile, model) with a truncated run: the cut, the whole runs, and those best
    only after the cut (``late``)."""
    import pandas as pd

    rows = []
    for (hw, prof, size), g in (runs.groupby(["hardware", "profile", "model"])
                                if len(runs) else []):
        cut = g["truncated_at"].min()
        if not np.isfinite(cut):
            continue
        whole = g[g["truncated_at"].isna()]
        late = whole[whole["best_step"] > cut]
        rows.append({"hardware": hw, "profile": prof, "model": size, "cut at step": int(cut),
                     "whole runs": len(whole), "best before the cut": len(whole) - len(late),
                     "late": ", ".join(late["recipe"] + " s" + late["seed"].astype(str))})
    return pd.DataFrame(rows, columns=["hardware", "profile", "model", "cut at step",
                                       "whole runs", "best before the cut", "late"])
