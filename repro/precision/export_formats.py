"""The inference formats a trained model's weights are exported to (:data:`FORMATS`,
:func:`resolve_format`): what each format's GEMMs read and compute in, and which layers'
products it needs (:mod:`repro.precision.export` does the exporting)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax.numpy as jnp

from repro.precision import dequant_gemm

QTYPES = {"float8_e4m3fn": jnp.float8_e4m3fn, "int8": jnp.int8, "nvfp4": "nvfp4"}
NVFP4_TILE = 16
E4M3_MAX, E2M1_MAX = 448.0, 6.0
# The weight-only FP8 / INT8 product (repro.precision.dequant_gemm): "gemv" (one row: the
# Pallas GEMV where the device's tiling table has the weight's shape, else a row reduction
# over the transposed weight; more rows: the XLA form), "reduce", "xla" or "pallas".
WEIGHT_ONLY_KERNEL = "gemv"


@dataclass(frozen=True)
class ExportFormat:
    """One inference format. ``weight`` / ``act``: qtype names of :data:`QTYPES` (None: BF16);
    ``recipe``: the model's training recipe it runs under (bf16 for the qwix formats);
    ``gemm``: what the GEMM computes in on a GPU with the format's tensor cores ("bf16",
    "fp8", "int8", or "dequant-bf16" for weight-only formats); ``hopper``: whether Hopper
    (H100/H200) has tensor cores for it; ``maxtext``: MaxText's ``quantization`` names whose
    forward pass this matches; ``granularity``: the scales of a qwix FP8 / INT8 format,
    "channel" (weights per output channel, activations per token) or "tensor" (one per
    tensor; NVFP4 has its blocks of 16 whatever this says);
    ``kernel``: a weight-only format's fused product (:mod:`repro.precision.dequant_gemm`:
    "gemv", "reduce", "xla" or "pallas"), None where qwix dequantizes the weight first;
    ``weight_layout``: how the quantized ``[K, N]`` kernels are stored, "kn" (as the layer
    holds them) or "nk" (transposed, :class:`TransposedQArray`: the contraction axis minor,
    the layout cuBLASLt's FP8 GEMM reads without a transpose on every call and a
    matrix-vector product streams)."""

    name: str
    weight: str | None = None
    act: str | None = None
    recipe: str = "bf16"
    gemm: Literal["bf16", "fp8", "int8", "dequant-bf16"] = "bf16"
    hopper: bool = True
    maxtext: str = ""
    about: str = ""
    granularity: Literal["channel", "tensor"] = "channel"
    kernel: str | None = None
    weight_layout: Literal["kn", "nk"] = "kn"

    def __post_init__(self):
        if self.granularity == "tensor" and (self.weight, self.act) != ("float8_e4m3fn",) * 2:
            raise ValueError(f"format {self.name}: per-tensor scales are for E4M3 weights and "
                             "activations only")
        if self.kernel is not None and (not self.weight_only or self.weight == "nvfp4"):
            raise ValueError(f"format {self.name}: a fused kernel is for weight-only FP8 / "
                             "INT8 formats")
        if self.kernel is not None and self.kernel not in dequant_gemm.IMPLS:
            raise ValueError(f"format {self.name}: kernel must be one of "
                             f"{dequant_gemm.IMPLS}, got {self.kernel!r}")
        if self.weight_layout == "nk" and not (
                self.granularity == "tensor" or self.kernel in ("xla", "reduce", "gemv")):
            raise ValueError(f"format {self.name}: transposed weights are for fp8-tensor's "
                             "product and the weight-only XLA / reduce / GEMV products")

    @property
    def qwix(self) -> bool:
        return self.weight is not None

    @property
    def weight_only(self) -> bool:
        return self.weight is not None and self.act is None

    @property
    def tile_size(self) -> int | None:
        return NVFP4_TILE if self.weight == "nvfp4" else None


FORMATS: dict[str, ExportFormat] = {f.name: f for f in [
    ExportFormat("bf16", about="BF16 weights and activations: the baseline"),
    ExportFormat("fp8", "float8_e4m3fn", "float8_e4m3fn", gemm="fp8", maxtext="fp8, fp8_full",
                 about="E4M3 weights (per output channel) and activations (per token)"),
    ExportFormat("fp8-tensor", "float8_e4m3fn", "float8_e4m3fn", gemm="fp8",
                 granularity="tensor", maxtext="aqt_fp8_full (its forward pass)",
                 weight_layout="nk",
                 about="E4M3 weights (one stored scale) and activations (one scale from "
                       "their absmax at run time)"),
    ExportFormat("int8", "int8", "int8", gemm="int8", maxtext="int8",
                 about="INT8 weights (per output channel) and activations (per token)"),
    ExportFormat("fp8-w", "float8_e4m3fn", gemm="dequant-bf16", kernel=WEIGHT_ONLY_KERNEL,
                 weight_layout="nk",
                 about="weight-only E4M3 (per output channel), BF16 GEMM of the stored "
                       "values, the scale on its output"),
    ExportFormat("int8-w", "int8", gemm="dequant-bf16", maxtext="int8w (AQT)",
                 kernel=WEIGHT_ONLY_KERNEL, weight_layout="nk",
                 about="weight-only INT8 (per output channel), BF16 GEMM of the stored "
                       "values, the scale on its output"),
    ExportFormat("nvfp4-w", "nvfp4", gemm="dequant-bf16", hopper=False,
                 about="weight-only NVFP4 (E2M1, E4M3 scale per 16, power-of-two tensor "
                       "scale): accuracy only on Hopper"),
    ExportFormat("flax-fp8", recipe="flax-fp8", gemm="fp8", maxtext="fp8_gpu",
                 about="flax Fp8DirectDotGeneralOp: per-tensor delayed scaling, calibrated"),
    ExportFormat("fp8-current", recipe="fp8-current", gemm="fp8",
                 about="this repository's FP8 training recipe: per-tensor current scaling"),
]}


def resolve_format(name: str) -> ExportFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown inference format {name!r}; valid: {', '.join(FORMATS)}")
    return FORMATS[name]
