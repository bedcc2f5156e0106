"""Claims B1-B5: the NVFP4 format, its speed, memory, quality, and scaling (notebooks 01,
05, 06, 08)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from repro.verdict import Verdict, margin
from repro.verdict import rule as rule_of
from repro.experiments.lm.tables import SIZE_ORDER


def _pick(frame: pd.DataFrame, which: str, by: list[str]) -> pd.Series | None:
    """The row of ``frame`` a rule's ``cells`` name: ``largest ...`` (the last sorted by
    ``by``), ``smallest ...`` (the first) or a model by name (its last row; None where the
    frame has none)."""
    ordered = frame.sort_values(by, kind="stable")
    if which.startswith("largest"):
        return ordered.iloc[-1]
    if which.startswith("smallest"):
        return ordered.iloc[0]
    if which in SIZE_ORDER:
        named = ordered[ordered["model"] == which] if "model" in ordered else ordered.iloc[:0]
        return named.iloc[-1] if len(named) else None
    raise ValueError(f"a rule's model must be 'largest ...', 'smallest ...' or one of "
                     f"{', '.join(SIZE_ORDER)}, got {which!r}")


def b1(checks: Mapping[str, bool], mismatches: tuple[int, int], sizes: tuple[int, int],
       nvfp4_error: float, hardware: str, has_fp4: bool, native_fp4: bool = False) -> Verdict:
    """B1 from the format checks of notebook 01 (name -> passed) and whether any committed
    record ran NVFP4 GEMMs natively on FP4 tensor cores (``native_fp4``): reproduced if every
    check passes and the native half was measured; partly if the checks pass but the native
    half was not measured; contradicted if a check fails. ``mismatches`` / ``sizes``: (E2M1
    elements, E4M3 block scales) differing from the reference / compared."""
    passed = all(checks.values())
    failed = [name for name, ok in checks.items() if not ok]
    note = ("format is bit-faithful: " + "; ".join(checks) if passed
            else "quantizer differs from the NVFP4 recipe: " + "; ".join(failed))
    note += (f". Native FP4 tensor cores on the machine that ran the checks ({hardware}): "
             f"{'yes' if has_fp4 else 'no'}")
    key = (f"0 bit mismatches in {sizes[0]} E2M1 elements and {sizes[1]} E4M3 block scales "
           f"vs ml_dtypes; NVFP4 relative error {nvfp4_error:.3f} on normal data" if passed
           else f"{mismatches[0]} element and {mismatches[1]} block-scale bit mismatches")
    decides = ""
    if passed and not native_fp4:
        decides = ("native Blackwell support not tested: no committed record ran NVFP4 GEMMs "
                   "on FP4 tensor cores")
        key += "; " + decides
    v = "contradicted" if not passed else "reproduced" if native_fp4 else "partly"
    return Verdict("B1", v, key, hardware,
                   "notebooks/01_formats.py (checks run in the notebook); results/*/lm", note,
                   numbers={"e2m1_mismatches": mismatches[0], "scale_mismatches": mismatches[1],
                            "nvfp4_rel_error": nvfp4_error, "native_fp4": int(native_fp4)},
                   decides=decides)


def _b2_keys(r) -> list[tuple[str, str, str, str]]:
    """The projections B2's key number quotes (its rule's ``projections``): (model,
    comparison, target chip, text), the text with the projected speedup {x} and the published
    one {p}."""
    return [(p["model"], p["comparison"], p["target"], p["text"]) for p in r["projections"]]


def _b2_measured(measured_fp4: pd.DataFrame, r) -> Verdict:
    """B2 from NVFP4 speedups measured on a chip with FP4 tensor cores: reproduced at the
    rule's ``target`` over BF16, partly above ``faster``."""
    best = measured_fp4.loc[measured_fp4["speedup"].idxmax()]
    bf = measured_fp4[measured_fp4["baseline"] == r["baseline"]]
    top = float(bf["speedup"].max()) if len(bf) else float("nan")
    v = ("reproduced" if top >= r["target"] else "partly" if top > r["faster"] else
         "contradicted" if np.isfinite(top) else "partly")
    return Verdict("B2", v, f"measured NVFP4 {best['speedup']:.2f}x vs {best['baseline']} "
                   f"({best['model']}, {best['hardware']})", str(best["hardware"]),
                   "lm records (measured)", "measured on a chip with FP4 tensor cores; "
                   "the model's projection is in notebook 06",
                   numbers={"nvfp4_speedup_max": best["speedup"], "nvfp4_bf16_max": top})


def _b2_validation(val: pd.DataFrame | None, hw_slug: str, calibrated: bool, mode: str,
                   within: float) -> str:
    """What the projection's validation says, from ``validation_table`` rows: at how many
    shapes the model's FP8/BF16 speedup is ``within`` of the measured one."""
    if val is not None and len(val):
        err = val["error"].abs()  # MLP and LM shapes count alike
        n_lm = int((val["workload"] == "lm").sum())
        return (f"validated on {hw_slug}: FP8/BF16 speedup predicted within {within:.0%} at "
                f"{int((err <= within).sum())}/{len(err)} measured shapes ({len(err) - n_lm} "
                f"MLP, {n_lm} LM; max error {err.max():.0%})")
    if calibrated:
        return "not validated: no FP8 mlp_step/lm_step records beside the BF16 ones"
    if mode == "rates_only":
        return (f"NOT validated: measured {hw_slug} GEMM rates, but no mlp_step records (nor "
                "lm_step) yet to calibrate and validate the step model (default "
                "bandwidth/gap parameters)")
    return "NOT validated: no GPU gemm/mlp_step/lm_step records yet (datasheet peaks only)"


def _b2_caveat(val: pd.DataFrame | None, within: float) -> str:
    """The projection's limit in one phrase: at how few measured shapes its step model is
    within ``within`` of the measured FP8/BF16 speedup, and its largest error."""
    if val is None or not len(val):
        return "the projection's step model is not validated against measured steps"
    err = val["error"].abs()
    return (f"projection model within {within:.0%} of measured FP8 steps at "
            f"{int((err <= within).sum())} of {len(err)} shapes (max error {err.max():.0%})")


def _b2_key(projection: pd.DataFrame, r) -> str:
    """The projected speedups of the rule's ``projections``, each beside its published one."""
    def x(value) -> str:
        ok = value is not None and np.isfinite(float(value))
        return f"{float(value):.2f}x" if ok else "n/a"

    parts = []
    for model, comparison, target, text in _b2_keys(r):
        m = projection[(projection["model"] == model) & (projection["comparison"] == comparison)
                       & (projection["target"] == target)]
        got, pub = (m["speedup"].iloc[0], m["published_speedup"].iloc[0]) if len(m) else (
            None, None)
        parts.append(text.format(x=x(got), p=x(pub)))
    return "projected NVFP4 " + ", ".join(parts)


def b2(projection: pd.DataFrame, measured_fp4: pd.DataFrame | None = None,
       validation: pd.DataFrame | None = None, rule=None) -> Verdict:
    """B2: measured where a chip with FP4 tensor cores recorded NVFP4 steps (``measured_fp4``,
    ``repro.perfmodel.measured_fp4_speedups``: reproduced if NVFP4 is >= 1.5x BF16, partly if
    faster, contradicted otherwise); else ``projected`` from ``projection``
    (``repro.perfmodel.projections``: speedup and published speedup per model, comparison and
    target chip), its note saying how the FP8 speedups of ``validation``
    (``repro.perfmodel.validation_table``) were predicted."""
    r = rule_of("B2", rule)
    if measured_fp4 is not None and len(measured_fp4):
        return _b2_measured(measured_fp4, r)
    if projection is None or not len(projection):
        return Verdict("B2", "not yet measured", "", "", "perfmodel", "no projection")
    calibrated = bool(projection["calibrated"].any())
    mode, hw_slug = str(projection["mode"].iloc[0]), str(projection["hardware"].iloc[0])
    source = "datasheet" if mode == "datasheet" else hw_slug
    numbers = {}
    for model, comparison, target, _ in _b2_keys(r):
        m = projection[(projection["model"] == model) & (projection["comparison"] == comparison)
                       & (projection["target"] == target)]
        if len(m):
            numbers[f"{model}_{comparison}_{target}"] = {
                "projected": m["speedup"].iloc[0], "published": m["published_speedup"].iloc[0]}
    return Verdict("B2", "projected", _b2_key(projection, r),
                   f"{source} -> gb200/gb300 (projection)",
                   "perfmodel projection" + ("" if calibrated else " (not calibrated)"),
                   "no record from a chip with FP4 tensor cores yet; "
                   + _b2_validation(validation, hw_slug, calibrated, mode,
                                    r["validation_within"]), numbers=numbers,
                   caveat=_b2_caveat(validation, r["validation_within"]))


def b3(ratios: pd.DataFrame, rule=None) -> Verdict:
    """B3 from ``repro.experiments.lm.tables.stored_ratios`` (NVFP4 bytes / BF16 bytes per
    model: the quantized ``weights`` and ``activations``, and the ``whole`` model's GEMM
    operands under the policy), at the model B3's ``rule`` names (the largest): reproduced if
    the format ratio (the larger of weights and activations) and the whole-model ratio are <=
    its ``limit`` (1/4 of FP16's bytes plus at most 5 points of scale overhead); partly if the
    format ratio only."""
    rl = rule_of("B3", rule)
    limit = rl["limit"]
    note = ("Computed from the quantizers' dtypes and scale shapes (device-independent). "
            "Training memory is dominated by FP32 master weights + AdamW moments (16 "
            "bytes/parameter with gradients), which the format does not change.")
    source = "lm records stored_*_bytes (notebooks/05_lm_nvfp4.py)"
    if not len(ratios):
        return Verdict("B3", "not yet measured", "no stored-bytes records", "", source, note)
    r = _pick(ratios.assign(_size=ratios["model"].map(lambda m: SIZE_ORDER.get(m, -1))),
              rl["cells"]["model"], ["_size"])
    fmt = max(r["weights"], r["activations"])
    v = ("reproduced" if fmt <= limit and r["whole"] <= limit else
         "partly" if fmt <= limit else "contradicted")
    whole = (f"the {r['model']} model's GEMM operands under NVIDIA's policy "
             f"{r['whole']:.3f} (limit {limit})")
    key = (f"NVFP4 tensors take {r['weights']:.3f} (weights, 16x16 blocks) and "
           f"{r['activations']:.3f} (activations, 1x16) of their BF16/FP16 bytes; {whole}")
    return Verdict("B3", v, key, str(r["hardware"]), source, note,
                   numbers={k: r[k] for k in ("weights", "activations", "whole")},
                   decides=whole if v == "partly" else "")


def _b4_row(gaps: pd.DataFrame, r) -> pd.Series | None:
    """The evidence: the model B4's ``rule`` names (the largest) with >= ``min_seeds`` paired
    NVFP4/BF16 seeds, full profile first."""
    fmt = r["formats"][0]
    g = gaps[(gaps["recipe"] == fmt) & (gaps["n_seeds"] >= r["min_seeds"])] if len(
        gaps) else gaps
    if not len(g):
        return None
    g = g.assign(_full=(g["profile"] == "full").astype(int),
                 _size=g["model"].map(SIZE_ORDER).fillna(-1))
    full = g[g["_full"] == g["_full"].max()]
    picked = _pick(full, r["cells"]["model"], ["_size"])
    if picked is None:
        return None
    return full[full["_size"] == picked["_size"]].sort_values("n_seeds").iloc[-1]


def _b4_note(row: pd.Series, gaps: pd.DataFrame, vs_fp8: pd.DataFrame, r) -> str:
    note = ("quality only; NVFP4 GEMMs emulated (bit-faithful values), so no speed claim. "
            if row["emulated"] else "")
    if row["profile"] != "full":
        note += "Smoke profile only (tiny model, 100 steps): a pipeline check, not evidence. "
    vs = vs_fp8[(vs_fp8["recipe"] == r["formats"][0]) & (vs_fp8["model"] == row["model"])
                & (vs_fp8["profile"] == row["profile"])] if len(vs_fp8) else vs_fp8
    if len(vs):
        x = vs.iloc[-1]
        note += (f"NVFP4 - FP8(delayed): {x['gap_nats']:+.4f} nats "
                 f"(95% CI {x['gap_lo']:+.4f} .. {x['gap_hi']:+.4f}) vs MaxText's +0.026. ")
    min_seeds, overfit = r["min_seeds"], r["overfit_note"]
    more = gaps[(gaps["recipe"] == r["formats"][0]) & (gaps["profile"] == "full")
                & (gaps["model"].map(SIZE_ORDER) > SIZE_ORDER.get(row["model"], -1))]
    for _, m in more.iterrows():
        note += (f"Full profile, larger model so far: {m['model']} on {m['hardware']}, "
                 f"{int(m['n_seeds'])} paired seed(s) (the rule needs {min_seeds}): NVFP4 vs "
                 f"BF16 {100 * m['rel_gap']:+.2f}% best held-out loss. ")
    if row["overfit"] > overfit:
        note += (f"Multi-epoch regime: the runs' held-out loss ends up to "
                 f"{100 * row['overfit']:.0f}% above its best (memorisation), so the "
                 "verdict uses the best held-out loss; section 4 also gives the final ones.")
    return note.strip()


def b4(gaps: pd.DataFrame, vs_fp8: pd.DataFrame, bounds: tuple[float, float] | None = None,
       rule=None) -> Verdict:
    """B4 from ``repro.experiments.lm.tables.paired_gaps`` against BF16 (``gaps``) and FP8
    delayed (``vs_fp8``, for the note), a parity claim with the equivalence margin [low, high]
    of its definition (``repro/data/claims.yaml``) on the relative gap (NVFP4 - BF16) / BF16 of
    the best held-out loss. With its 95% t-interval [lo, hi]: quality kept (reproduced) if
    hi <= high (inside the margin, or NVFP4 better); lost (contradicted) if lo > high;
    inconclusive if the interval straddles high. Smoke records give at most partly."""
    low, high = bounds or margin("B4")
    source = "results/*/lm (eval_loss: the best held-out loss of each run)"
    r = rule_of("B4", rule)
    row = _b4_row(gaps, r)
    if row is None:
        return Verdict("B4", "not yet measured", "no NVFP4/BF16 pair with enough seeds", "",
                       source)
    v = ("reproduced" if row["rel_hi"] <= high else "contradicted" if row["rel_lo"] > high
         else "inconclusive")
    if row["profile"] != "full" and v == "reproduced":
        v = "partly"
    what = {"best_eval_loss": "best held-out loss", "final_eval_loss": "final held-out loss",
            "final_train_loss": "final training loss"}.get(row.get("metric"), "held-out loss")
    key = (f"NVFP4 vs BF16 {what} {100 * row['rel_gap']:+.2f}% "
           f"(95% CI {100 * row['rel_lo']:+.2f}% .. {100 * row['rel_hi']:+.2f}%, "
           f"{int(row['n_seeds'])} seeds, {row['model']} model, {row['profile']} profile"
           f"{', emulated NVFP4' if row['emulated'] else ''}) vs margin "
           f"[{100 * low:+.1f}%, {100 * high:+.1f}%]")
    return Verdict("B4", v, key, str(row["hardware"]), source, _b4_note(row, gaps, vs_fp8, r),
                   emulated=bool(row["emulated"]),
                   numbers={"rel_gap": row["rel_gap"], "rel_lo": row["rel_lo"],
                            "rel_hi": row["rel_hi"], "margin_low": low, "margin_high": high,
                            "n_seeds": int(row["n_seeds"])})


B5_EFFICIENCY = rule_of("B5")["efficiency"]  # weak scaling at the largest count (claims.yaml)
B5_CPU_CHECKS = ("CPU, 8 simulated devices (tests/test_distributed.py): data-parallel PPO "
                 "(FP32, FP8 delayed) and DP/FSDP LM training (BF16, NVFP4) equal "
                 "single-device runs; gradient all-reduce and global amax verified; sharded "
                 "checkpoints resume")


def _b5_part(r) -> str:
    text = f"{r.workload} {r.recipe} {r.efficiency:.2f}"
    if not r.efficiency_same_commit:
        text += " [1- and n-GPU cells of different calls]"
    if np.isfinite(r.fp8_speedup):
        text += (f" (FP8/BF16 {r.fp8_speedup:.2f}x"
                 + ("" if r.fp8_same_commit else ", cells of different calls") + ")")
    return text


def b5(table: pd.DataFrame, planned: Mapping[str, Sequence[str]] | None = None,
       rule=None) -> Verdict:
    """B5 from ``repro.experiments.multigpu.tables.throughput_table``. Only GPU records on real
    devices with >= 2 devices count; on the hardware with the largest count, the weak-scaling
    efficiency of every (workload, recipe) there: reproduced if all are >= 0.8 at >= 4 GPUs,
    partly if all are at 2 GPUs only or some are, contradicted if none is. ``planned``:
    ``{"workloads": [...], "recipes": [...]}`` of the full study, to name what is missing."""
    source = "multigpu records (notebooks/08_multigpu.py); tests/test_distributed.py"
    r = rule_of("B5", rule)
    efficiency, min_gpus = r["efficiency"], r["min_gpus"]
    real = table[(~table["simulated"].astype(bool)) & (table["backend"] == "gpu")
                 & (table["n_devices"] >= 2)] if len(table) else table
    real = real[np.isfinite(real["efficiency"].astype(float))] if len(real) else real
    if not len(real):
        missing = ("Scaling not measured: run `repro record multigpu --profile full` on a "
                   "2/4/8-GPU machine")
        return Verdict("B5", "not yet measured", f"{B5_CPU_CHECKS}. {missing}", "",
                       source, "No multi-GPU records yet; CPU devices never count.",
                       decides=missing)
    top = real.groupby("hardware")["n_devices"].max()
    hw = top[top == top.max()].index[0]  # first hardware (by name) with the largest count
    nmax = int(top[hw])
    last = real[(real["hardware"] == hw) & (real["n_devices"] == nmax)]
    ok = last["efficiency"] >= efficiency
    v = ("reproduced" if nmax >= min_gpus else "partly") if ok.all() else (
        "partly" if ok.any() else "contradicted")
    key = (f"weak-scaling efficiency at {nmax} GPUs: "
           + "; ".join(_b5_part(r) for r in last.itertuples()))
    have = set(zip(last["workload"], last["recipe"]))
    missing = [f"{w} {r}" for w in (planned or {}).get("workloads", [])
               for r in (planned or {}).get("recipes", []) if (w, r) not in have]
    note = (f"Target >= {efficiency} at >= {min_gpus} GPUs."
            + (f" Not recorded at {nmax} GPUs: {', '.join(missing)}." if missing else "")
            + f" {B5_CPU_CHECKS}.")
    numbers = {"n_gpus": nmax, **{f"{r.workload}_{r.recipe}": {
        "efficiency": r.efficiency, "fp8_bf16": r.fp8_speedup} for r in last.itertuples()}}
    return Verdict("B5", v, key, hw, source, note, emulated=bool(last["emulated"].any()),
                   numbers=numbers)
