"""Claims B1-B5: the NVFP4 format, its speed, memory, quality, and scaling (notebooks 01,
05, 06, 08)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from repro.analysis.lm import SIZE_ORDER
from repro.claims.verdicts._base import Verdict, margin

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
    if passed and not native_fp4:
        key += ("; native Blackwell support not tested: no committed record ran NVFP4 GEMMs on "
                "FP4 tensor cores")
    v = "contradicted" if not passed else "reproduced" if native_fp4 else "partly"
    return Verdict("B1", v, key, hardware,
                   "notebooks/01_formats.py (checks run in the notebook); results/*/lm", note)


B2_TARGET = 1.5  # a measured NVFP4/BF16 step speedup at or above this reproduces "up to 1.6x"
# The projections the key number quotes: (model, comparison, target chip, text), the text
# with the projected speedup {x} and the published one {p}.
B2_KEY = (
    ("llama3-8b", "nvfp4_vs_bf16", "gb200", "{x} vs BF16 (Llama-3-8B, GB200; published {p})"),
    ("llama3-8b", "nvfp4_mlp_vs_fp8", "gb200", "{x} vs FP8 MLP-only (GB200; published {p})"),
    ("llama3-405b", "nvfp4_mlp_vs_fp8", "gb300", "405B GB300 {x} (published {p})"))


def _b2_measured(measured_fp4: pd.DataFrame) -> Verdict:
    """B2 from NVFP4 speedups measured on a chip with FP4 tensor cores."""
    best = measured_fp4.loc[measured_fp4["speedup"].idxmax()]
    bf = measured_fp4[measured_fp4["baseline"] == "bf16"]
    top = float(bf["speedup"].max()) if len(bf) else float("nan")
    v = ("reproduced" if top >= B2_TARGET else "partly" if top > 1.0 else
         "contradicted" if np.isfinite(top) else "partly")
    return Verdict("B2", v, f"measured NVFP4 {best['speedup']:.2f}x vs {best['baseline']} "
                   f"({best['model']}, {best['hardware']})", str(best["hardware"]),
                   "lm records (measured)", "measured on a chip with FP4 tensor cores; "
                   "the model's projection is in notebook 06")


def _b2_validation(val: pd.DataFrame | None, hw_slug: str, calibrated: bool, mode: str) -> str:
    """What the projection's validation says, from ``validation_table`` rows."""
    if val is not None and len(val):
        err = val["error"].abs()  # MLP and LM shapes count alike
        n_lm = int((val["workload"] == "lm").sum())
        return (f"validated on {hw_slug}: FP8/BF16 speedup predicted within 10% at "
                f"{int((err <= 0.10).sum())}/{len(err)} measured shapes ({len(err) - n_lm} "
                f"MLP, {n_lm} LM; max error {err.max():.0%})")
    if calibrated:
        return "not validated: no FP8 mlp_step/lm_step records beside the BF16 ones"
    if mode == "rates_only":
        return (f"NOT validated: measured {hw_slug} GEMM rates, but no mlp_step records (nor "
                "lm_step) yet to calibrate and validate the step model (default "
                "bandwidth/gap parameters)")
    return "NOT validated: no GPU gemm/mlp_step/lm_step records yet (datasheet peaks only)"


def _b2_key(projection: pd.DataFrame) -> str:
    """The projected speedups of :data:`B2_KEY`, each beside its published one."""
    def x(value) -> str:
        ok = value is not None and np.isfinite(float(value))
        return f"{float(value):.2f}x" if ok else "n/a"

    parts = []
    for model, comparison, target, text in B2_KEY:
        m = projection[(projection["model"] == model) & (projection["comparison"] == comparison)
                       & (projection["target"] == target)]
        got, pub = (m["speedup"].iloc[0], m["published_speedup"].iloc[0]) if len(m) else (
            None, None)
        parts.append(text.format(x=x(got), p=x(pub)))
    return "projected NVFP4 " + ", ".join(parts)


def b2(projection: pd.DataFrame, measured_fp4: pd.DataFrame | None = None,
       validation: pd.DataFrame | None = None) -> Verdict:
    """B2: measured where a chip with FP4 tensor cores recorded NVFP4 steps (``measured_fp4``,
    ``repro.perfmodel.measured_fp4_speedups``: reproduced if NVFP4 is >= 1.5x BF16, partly if
    faster, contradicted otherwise); else ``projected`` from ``projection``
    (``repro.perfmodel.projections``: speedup and published speedup per model, comparison and
    target chip), its note saying how the FP8 speedups of ``validation``
    (``repro.perfmodel.validation_table``) were predicted."""
    if measured_fp4 is not None and len(measured_fp4):
        return _b2_measured(measured_fp4)
    if projection is None or not len(projection):
        return Verdict("B2", "not yet measured", "", "", "perfmodel", "no projection")
    calibrated = bool(projection["calibrated"].any())
    mode, hw_slug = str(projection["mode"].iloc[0]), str(projection["hardware"].iloc[0])
    source = "datasheet" if mode == "datasheet" else hw_slug
    return Verdict("B2", "projected", _b2_key(projection),
                   f"{source} -> gb200/gb300 (projection)",
                   "perfmodel projection" + ("" if calibrated else " (not calibrated)"),
                   "no record from a chip with FP4 tensor cores yet; "
                   + _b2_validation(validation, hw_slug, calibrated, mode))


B3_LIMIT = 0.30  # 1/4 of FP16's bytes plus at most 5 points of scale overhead


def b3(ratios: pd.DataFrame) -> Verdict:
    """B3 from ``repro.analysis.lm.stored_ratios`` (NVFP4 bytes / BF16 bytes per model: the
    quantized ``weights`` and ``activations``, and the ``whole`` model's GEMM operands under
    the policy), largest model: reproduced if the format ratio (the larger of weights and
    activations) and the whole-model ratio are <= 0.30; partly if the format ratio only."""
    note = ("Computed from the quantizers' dtypes and scale shapes (device-independent). "
            "Training memory is dominated by FP32 master weights + AdamW moments (16 "
            "bytes/parameter with gradients), which the format does not change.")
    source = "lm records stored_*_bytes (notebooks/05_lm_nvfp4.py)"
    if not len(ratios):
        return Verdict("B3", "not yet measured", "no stored-bytes records", "", source, note)
    r = ratios.loc[ratios["model"].map(lambda m: SIZE_ORDER.get(m, -1)).idxmax()]
    fmt = max(r["weights"], r["activations"])
    v = ("reproduced" if fmt <= B3_LIMIT and r["whole"] <= B3_LIMIT else
         "partly" if fmt <= B3_LIMIT else "contradicted")
    key = (f"NVFP4 tensors take {r['weights']:.3f} (weights, 16x16 blocks) and "
           f"{r['activations']:.3f} (activations, 1x16) of their BF16/FP16 bytes; the "
           f"{r['model']} model's GEMM operands under NVIDIA's policy {r['whole']:.3f}")
    return Verdict("B3", v, key, str(r["hardware"]), source, note)


B4_MIN_SEEDS = 3


def _b4_row(gaps: pd.DataFrame) -> pd.Series | None:
    """The evidence: the largest model with >= 3 paired NVFP4/BF16 seeds, full profile first."""
    g = gaps[(gaps["recipe"] == "nvfp4") & (gaps["n_seeds"] >= B4_MIN_SEEDS)] if len(
        gaps) else gaps
    if not len(g):
        return None
    g = g.assign(_full=(g["profile"] == "full").astype(int),
                 _size=g["model"].map(SIZE_ORDER).fillna(-1))
    return g.sort_values(["_full", "_size", "n_seeds"]).iloc[-1]


def _b4_note(row: pd.Series, gaps: pd.DataFrame, vs_fp8: pd.DataFrame) -> str:
    note = ("quality only; NVFP4 GEMMs emulated (bit-faithful values), so no speed claim. "
            if row["emulated"] else "")
    if row["profile"] != "full":
        note += "Smoke profile only (tiny model, 100 steps): a pipeline check, not evidence. "
    vs = vs_fp8[(vs_fp8["recipe"] == "nvfp4") & (vs_fp8["model"] == row["model"])
                & (vs_fp8["profile"] == row["profile"])] if len(vs_fp8) else vs_fp8
    if len(vs):
        r = vs.iloc[-1]
        note += (f"NVFP4 - FP8(delayed): {r['gap_nats']:+.4f} nats "
                 f"(95% CI {r['gap_lo']:+.4f} .. {r['gap_hi']:+.4f}) vs MaxText's +0.026. ")
    more = gaps[(gaps["recipe"] == "nvfp4") & (gaps["profile"] == "full")
                & (gaps["model"].map(SIZE_ORDER) > SIZE_ORDER.get(row["model"], -1))]
    for _, r in more.iterrows():
        note += (f"Full profile, larger model so far: {r['model']} on {r['hardware']}, "
                 f"{int(r['n_seeds'])} paired seed(s) (the rule needs 3): NVFP4 vs BF16 "
                 f"{100 * r['rel_gap']:+.2f}% best held-out loss. ")
    if row["overfit"] > 0.05:
        note += (f"Multi-epoch regime: the runs' held-out loss ends up to "
                 f"{100 * row['overfit']:.0f}% above its best (memorisation), so the "
                 "verdict uses the best held-out loss; section 4 also gives the final ones.")
    return note.strip()


def b4(gaps: pd.DataFrame, vs_fp8: pd.DataFrame, bounds: tuple[float, float] | None = None
       ) -> Verdict:
    """B4 from ``repro.analysis.lm.paired_gaps`` against BF16 (``gaps``) and FP8 delayed
    (``vs_fp8``, for the note), a parity claim with the equivalence margin [low, high] of its
    definition (``repro/data/claims.yaml``) on the relative gap (NVFP4 - BF16) / BF16 of the
    best held-out loss. With its 95% t-interval [lo, hi]: quality kept (reproduced) if
    hi <= high (inside the margin, or NVFP4 better); lost (contradicted) if lo > high;
    inconclusive if the interval straddles high. Smoke records give at most partly."""
    low, high = bounds or margin("B4")
    source = "results/*/lm (eval_loss: the best held-out loss of each run)"
    row = _b4_row(gaps)
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
    return Verdict("B4", v, key, str(row["hardware"]), source, _b4_note(row, gaps, vs_fp8),
                   emulated=bool(row["emulated"]))


B5_EFFICIENCY = 0.8  # weak-scaling efficiency at the largest device count
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


def b5(table: pd.DataFrame, planned: Mapping[str, Sequence[str]] | None = None) -> Verdict:
    """B5 from ``repro.analysis.scaling.throughput_table``. Only GPU records on real devices
    with >= 2 devices count; on the hardware with the largest count, the weak-scaling
    efficiency of every (workload, recipe) there: reproduced if all are >= 0.8 at >= 4 GPUs,
    partly if all are at 2 GPUs only or some are, contradicted if none is. ``planned``:
    ``{"workloads": [...], "recipes": [...]}`` of the full study, to name what is missing."""
    source = "multigpu records (notebooks/08_multigpu.py); tests/test_distributed.py"
    real = table[(~table["simulated"].astype(bool)) & (table["backend"] == "gpu")
                 & (table["n_devices"] >= 2)] if len(table) else table
    real = real[np.isfinite(real["efficiency"].astype(float))] if len(real) else real
    if not len(real):
        return Verdict("B5", "not yet measured", f"{B5_CPU_CHECKS}. Scaling not measured: run "
                       "`repro record multigpu --profile full` on a 2/4/8-GPU machine", "",
                       source, "No multi-GPU records yet; CPU devices never count.")
    top = real.groupby("hardware")["n_devices"].max()
    hw = top[top == top.max()].index[0]  # first hardware (by name) with the largest count
    nmax = int(top[hw])
    last = real[(real["hardware"] == hw) & (real["n_devices"] == nmax)]
    ok = last["efficiency"] >= B5_EFFICIENCY
    v = ("reproduced" if nmax >= 4 else "partly") if ok.all() else (
        "partly" if ok.any() else "contradicted")
    key = (f"weak-scaling efficiency at {nmax} GPUs: "
           + "; ".join(_b5_part(r) for r in last.itertuples()))
    have = set(zip(last["workload"], last["recipe"]))
    missing = [f"{w} {r}" for w in (planned or {}).get("workloads", [])
               for r in (planned or {}).get("recipes", []) if (w, r) not in have]
    note = (f"Target >= {B5_EFFICIENCY} at >= 4 GPUs."
            + (f" Not recorded at {nmax} GPUs: {', '.join(missing)}." if missing else "")
            + f" {B5_CPU_CHECKS}.")
    return Verdict("B5", v, key, hw, source, note, emulated=bool(last["emulated"].any()))
