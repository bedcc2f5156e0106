"""Projections of NVFP4 training steps onto Blackwell, beside NVIDIA's published speedups.

:func:`calibrations` calibrates the model on every chip whose records allow it (measured GEMM
rates, and BF16 step times to fit); :func:`project` applies a calibration's efficiencies to
another chip's datasheet peaks (B200, GB200, GB300) for Llama-shaped steps and this
repository's LM presets. That is an ASSUMPTION (:data:`ASSUMPTIONS`): the tables say
``projected``, name the chip the efficiencies come from (``hardware``) and the projected one
(``target``), and nothing here is written as a record. :data:`PUBLISHED` holds the public
numbers to compare with, each with its source. :func:`measured_fp4_speedups` reads the
measured NVFP4 speedups of chips that have FP4 tensor cores, where there are any.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from repro import hardware as hw
from repro.perfmodel.calibrate import Calibration, calibrate, datasheet_calibration, predict
from repro.perfmodel.cost import llama3_8b_config, llama3_405b_config, lm_shapes, lm_step_gemms
from repro.perfmodel.measured import GEMM, WORKLOADS
from repro.precision.recipes import resolve

TARGETS = ("b200", "gb200", "gb300")
MODES = ("calibrated", "rates_only", "datasheet")  # best first

# Published NVFP4 speedups (claims to compare with, not measurements).
PUBLISHED = [
    {"model": "llama3-8b", "baseline": "bf16", "policy": "paper", "targets": ["b200", "gb200"],
     "speedup": 1.59, "label": "NeMo 1.59x vs BF16",
     "source": "NVIDIA blog, Feb 2026 (NeMo Megatron Bridge; 1,850 vs 1,165 TFLOP/s per GPU; "
               "last 4 blocks BF16; micro-batch 2 -> 4). Secondary reports disagree on the "
               "chip (B200 or GB200 NVL72)."},
    {"model": "llama3-8b", "baseline": "fp8", "policy": "mlp", "targets": ["gb200"],
     "speedup": 1.35, "label": "MaxText 1.35x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
    {"model": "llama3-405b", "baseline": "fp8", "policy": "mlp", "targets": ["gb200"],
     "speedup": 1.44, "label": "MaxText 1.44x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
    {"model": "llama3-8b", "baseline": "fp8", "policy": "mlp", "targets": ["gb300"],
     "speedup": 1.31, "label": "MaxText 1.31x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
    {"model": "llama3-405b", "baseline": "fp8", "policy": "mlp", "targets": ["gb300"],
     "speedup": 1.73, "label": "MaxText 1.73x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
]

# (name, subject recipe, subject policy, other recipe, baseline recipe); the baseline's label
# (``bf16``, ``fp8``) is its Recipe.number_format.
COMPARISONS = [
    ("nvfp4_vs_bf16", "nvfp4", "paper", "bf16", "bf16"),
    ("nvfp4_mlp_vs_fp8", "nvfp4", "mlp", "fp8-current", "fp8-current"),
    ("fp8_vs_bf16", "fp8-current", "paper", None, "bf16"),
]

ASSUMPTIONS = [
    "target chip = its datasheet dense peaks and bandwidth (repro/data/hardware.yaml) times the "
    "efficiency the calibrating chip reaches on the same GEMM shape",
    "FP4 GEMMs reach the efficiency measured for FP8 GEMMs of the same shape",
    "bandwidth efficiency and idle gap per GEMM launch as calibrated on the measuring chip",
    "one GPU's share of the step; communication (FSDP/TP collectives) not modelled",
    "flash attention and the output head stay BF16 in every recipe",
]


def published_for(model: str, target: str, baseline: str, policy: str) -> dict | None:
    """The :data:`PUBLISHED` entry for this model, chip, baseline format and policy, or None."""
    for p in PUBLISHED:
        if (p["model"] == model and target in p["targets"] and p["baseline"] == baseline
                and p["policy"] == policy):
            return p
    return None


# ---------------------------------------------------------------------------- calibrations


def calibrating_hardware(records: pd.DataFrame | None, need_steps: bool = True) -> list[str]:
    """GPU chips in the registry with non-emulated ``gemm`` rates (and, with ``need_steps``,
    BF16 ``mlp_step`` or ``lm_step`` times)."""
    if records is None or not len(records):
        return []
    ok = records[~records["emulated"].astype(bool)]
    gemm = set(ok[(ok["experiment"] == GEMM) & (ok["metric"] == "tflops")]["hardware"])
    step = set(ok[ok["experiment"].isin(list(WORKLOADS)) & (ok["metric"] == "step_time_ms")
                  & (ok["recipe"] == "bf16")]["hardware"])
    reg = hw.registry()
    chips = gemm & step if need_steps else gemm
    return sorted(s for s in chips if s in reg and reg[s]["backend"] == "gpu")


def calibrations(measured: pd.DataFrame | None, gap_per: str = "gemm"
                 ) -> tuple[str, list[Calibration]]:
    """The best :data:`MODES` the records allow, and the model of each chip in it.

    ``calibrated``: chips with ``gemm`` rates and BF16 step times, fitted (:func:`calibrate`).
    ``rates_only``: measured GEMM rates but no step times to fit (default bandwidth and gap).
    ``datasheet``: nothing measured; this machine's datasheet entry (B200's where it has no
    memory bandwidth, e.g. a CPU) at the default efficiencies."""
    for mode, need_steps in (("calibrated", True), ("rates_only", False)):
        chips = calibrating_hardware(measured, need_steps)
        if chips:
            return mode, [calibrate(measured, slug, gap_per) for slug in chips]
    info = hw.detect()
    return "datasheet", [datasheet_calibration(info if info.memory_bandwidth_tbs else TARGETS[0])]


# ------------------------------------------------------------------------------ projection


def default_projection_setup() -> dict[str, dict[str, Any]]:
    """Models and per-GPU tokens projected (params.yaml ``perfmodel`` may override)."""
    out = {"llama3-8b": {"shape": llama3_8b_config(), "batch_tokens": 16384, "fsdp": 8},
           "llama3-405b": {"shape": llama3_405b_config(), "batch_tokens": 8192, "fsdp": 64}}
    for name, shape in lm_shapes().items():
        # params.yaml's lm full profile trains with 64 sequences a step
        out[name] = {"shape": shape, "batch_tokens": 64 * shape.seq_len, "fsdp": 1}
    return out


def projection_setup(params: dict[str, Any] | None) -> tuple[dict[str, dict], list[str]]:
    """(setup, targets) from params.yaml's ``perfmodel`` section: ``models`` overrides a
    model's ``batch_tokens`` / ``fsdp``, ``model_names`` keeps only those models, ``targets``
    replaces :data:`TARGETS`."""
    p = params or {}
    setup = default_projection_setup()
    for model, over in (p.get("models") or {}).items():
        if model in setup and isinstance(over, dict):
            setup[model] = {**setup[model], **{k: v for k, v in over.items() if k != "shape"}}
    if p.get("model_names"):
        setup = {k: v for k, v in setup.items() if k in p["model_names"]}
    return setup, list(p.get("targets", TARGETS))


def _comparison_row(cal: Calibration, tgt: hw.HardwareInfo, model: str, s: dict,
                    comparison: tuple) -> dict[str, Any] | None:
    """One projected comparison on one chip, or None where the chip lacks a format."""
    name, rec, pol, other, base = comparison
    rec_r, base_r = (resolve(r) for r in (rec, base))
    if any(not (tgt.peak_tflops or {}).get(r.number_format) for r in (rec_r, base_r)):
        return None  # e.g. NVFP4 on Hopper: nothing to project
    shape, T, fsdp = s["shape"], int(s["batch_tokens"]), int(s.get("fsdp", 1))
    subj = lm_step_gemms(shape, T, rec_r, pol, other_recipe=other, fsdp=fsdp)
    ref = lm_step_gemms(shape, T, base_r, "paper", fsdp=fsdp)
    ps, pr = predict(subj, cal, tgt), predict(ref, cal, tgt)
    base_label = base_r.number_format
    pub = published_for(model, tgt.slug, base_label, pol) or {}
    return {"hardware": cal.hardware.slug, "calibrated": cal.calibrated, "target": tgt.slug,
            "model": model, "comparison": name, "recipe": rec, "policy": pol,
            "other_recipe": other, "baseline": base_label, "baseline_recipe": base,
            "batch_tokens": T, "fsdp": fsdp, "speedup": pr["total_s"] / ps["total_s"],
            "step_ms": ps["total_s"] * 1e3, "baseline_step_ms": pr["total_s"] * 1e3,
            "tflops": ref.flops / ps["total_s"] / 1e12,
            "baseline_tflops": ref.flops / pr["total_s"] / 1e12,
            "breakdown_ms": {k: v * 1e3 for k, v in ps.items() if k != "flops"},
            "baseline_breakdown_ms": {k: v * 1e3 for k, v in pr.items() if k != "flops"},
            "published_speedup": pub.get("speedup"), "published_source": pub.get("source")}


def project(cal: Calibration, targets: Sequence[str] = TARGETS,
            setup: dict[str, dict[str, Any]] | None = None,
            comparisons=COMPARISONS, include_self: bool = True) -> pd.DataFrame:
    """Projected speedups of :data:`COMPARISONS` on ``targets`` (and on the calibrating chip
    itself, for the formats it has, when ``include_self``): one row per (target, model,
    comparison), with the chip the efficiencies come from (``hardware``), step times, their
    GEMM / traffic / gap parts and the published speedup where there is one."""
    setup = setup or default_projection_setup()
    rows = []
    for slug in dict.fromkeys([cal.hardware.slug] * include_self + list(targets)):
        tgt = cal.hardware if slug == cal.hardware.slug else hw.lookup(slug)
        if not tgt.memory_bandwidth_tbs:
            continue
        for model, s in setup.items():
            rows += filter(None, (_comparison_row(cal, tgt, model, s, c) for c in comparisons))
    return pd.DataFrame(rows)


def projections(mode: str, cals: Sequence[Calibration], targets: Sequence[str] = TARGETS,
                setup: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """:func:`project` of every calibration of :func:`calibrations`, with its ``mode``; a
    ``datasheet`` model is projected onto the targets only (there is no measured chip)."""
    frames = [project(c, targets, setup, include_self=mode != "datasheet").assign(mode=mode)
              for c in cals]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ------------------------------------------------------------------- measured on FP4 chips


def measured_fp4_speedups(records: pd.DataFrame | None, subject: str = "nvfp4",
                          baselines: Sequence[str] = ("bf16", "fp8-current", "fp8-delayed")
                          ) -> pd.DataFrame:
    """Measured ``subject`` speedups on chips with FP4 tensor cores: ``lm`` records
    (``tokens_per_s`` of each recipe, median over seeds, per model size), or any
    ``step_time_ms`` records of ``subject``, against each of ``baselines`` measured beside
    it. Emulated records never count. Empty while there are none."""
    cols = ["hardware", "model", "baseline", "speedup"]
    if records is None or not len(records):
        return pd.DataFrame(columns=cols)
    fp4_chips = {s for s in records["hardware"].unique()
                 if s in hw.registry() and hw.lookup(s).has_fp4}
    df = records[records["hardware"].isin(fp4_chips)
                 & records["metric"].isin(["tokens_per_s", "step_time_ms"])
                 & (~records["emulated"].astype(bool))].copy()
    if not len(df):
        return pd.DataFrame(columns=cols)
    df["model"] = df["sizes"].map(lambda s: str((s or {}).get("model") or json.dumps(
        {k: v for k, v in (s or {}).items() if k not in ("seed", "steps", "tokens")},
        sort_keys=True)))
    rows = []
    for (slug, model, metric), g in df.groupby(["hardware", "model", "metric"]):
        v = g.groupby("recipe")["value"].median()
        if subject not in v:
            continue
        for base in (b for b in baselines if b in v):
            ratio = v[subject] / v[base] if metric == "tokens_per_s" else v[base] / v[subject]
            rows.append((slug, model, base, float(ratio)))
    return pd.DataFrame(rows, columns=cols)

