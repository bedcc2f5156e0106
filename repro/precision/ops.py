"""Quantized matrix products: per-tensor FP8, MXFP8 and NVFP4, all three GEMMs of a layer.

A layer computes ``y = x @ w`` forward and two GEMMs backward: the data gradient
``dx = g @ w.T`` ("dgrad") and the weight gradient ``dw = x.T @ g`` ("wgrad"). Each function
is a ``jax.custom_vjp`` that runs all three in the recipe's format:

* :func:`fp8_dot`: FP8 operands (e4m3 forward, e5m2 gradients, ``recipe.fwd_dtype`` /
  ``recipe.bwd_dtype``) go STRAIGHT into ``lax.dot_general``; the product of the two dequantize
  scales multiplies the output, a multiply of the GEMM result by a broadcast scalar that XLA's
  GEMM rewriter folds into the cuBLASLt FP8 call. (The "convert f8 -> bf16, multiply by the
  scale, then dot" pattern is not rewritten into an FP8 GEMM by current XLA: the module
  docstring of ``repro.experiments.gemm.measure`` says why the operands go in as FP8.)
  The forward and data-gradient GEMMs write ``recipe.dtype`` (``recipe.fp8_gemm_out ==
  "compute"``, the default: half the bytes of FP32, and the bias add can join the cuBLASLt
  epilogue) or FP32 (``"float32"``); weight gradients are always FP32. The residuals saved for
  the backward pass are the FP8 operands, not BF16 copies, and each weight is quantized once
  per call (the data gradient reuses the forward's copy). ``recipe.scaling``: "current" (this
  tensor's amax now), "delayed" (Transformer Engine's amax history, state in ``meta``), "none"
  (plain saturating cast, scale 1: the ablation).
* :func:`mxfp8_dot`, :func:`nvfp4_dot`: block-scaled GEMMs. "native" backend (compute
  capability >= 10): ``jax.nn.scaled_matmul`` on the quantized elements and block scales.
  "emulated" backend (anything else, incl. the H200 and CPU): the same quantized values,
  dequantized to BF16 (exact: element x block scale fits BF16's significand) and an ordinary
  dot with FP32 accumulation; the NVFP4 per-tensor global scales multiply the output. The
  numbers are those of the block-scaled format; only the speed is not.
* :func:`fp8block_dot`: DeepSeek-V3's block FP8 (128x128 weight tiles, 1x128 activation and
  gradient blocks, FP32 scales), always emulated the same way (no device here has its GEMM).

Each family has its module: per-tensor FP8 (:mod:`repro.precision.fp8`, with the layout, the
non-differentiated input and the delayed-scaling state), FP8 convolutions
(:mod:`repro.precision.conv`), the block-scaled GEMMs (:mod:`repro.precision.block_scaled`) and
INT8 (:mod:`repro.precision.int8`); what they share (operand checks, the bias-and-activation
epilogue) is :mod:`repro.precision.gemm`. This module is the dispatch: :func:`dot`, the one
entry point layers call, runs a product as its recipe says, and :func:`is_emulated` says
whether a recipe's GEMMs run on the device's own arithmetic. It also hands on each family's
entry points (``ops.fp8_dot``, ``ops.nvfp4_dot``...).
"""

from __future__ import annotations

from jax import lax

from repro.precision import int8, validate
from repro.precision.block_scaled import block_scaled_backend, fp8block_dot, mxfp8_dot, nvfp4_dot
from repro.precision.conv import conv_dimension_numbers, fp8_conv
from repro.precision.fp8 import (META_KEYS, StoredWeight, fp8_dense, fp8_dot, init_meta,
                                 stored_weight)
from repro.precision.gemm import ACTIVATIONS, _check_2d_weight, _flatten_lhs
from repro.precision.recipes import Recipe

__all__ = [
    "ACTIVATIONS", "META_KEYS", "init_meta", "fp8_dot", "fp8_dense", "fp8_conv",
    "fp8block_dot", "mxfp8_dot", "nvfp4_dot", "dot", "dense_dot", "conv_dimension_numbers",
    "block_scaled_backend", "is_emulated", "StoredWeight", "stored_weight",
]


# ------------------------------------------------------------------------------ dispatch


def is_emulated(recipe: Recipe, hardware=None) -> bool:
    """True when ``recipe``'s GEMMs have no tensor-core support on ``hardware``.

    MXFP8/NVFP4 off Blackwell, and FP8 on a device without FP8 tensor cores (e.g. CPU). The
    numerics are those of the format either way; benchmarks stamp their records with this.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"is_emulated: recipe must be a Recipe, got {type(recipe).__name__}")
    if hardware is None:
        from repro.hardware import current

        hardware = current()
    if recipe.gemm == "fp8block":  # no block-scaled FP8 GEMM here on any device
        return True
    if recipe.gemm in ("mxfp8", "nvfp4"):
        return not hardware.has_fp4
    if recipe.gemm == "fp8":
        return not hardware.has_fp8
    if recipe.gemm == "int8":
        return int8.is_emulated(hardware)
    return False


# ------------------------------------------------------------------------- entry point


def dense_dot(x, w, recipe):
    """Ordinary ``x[..., K] @ w[K, N]``: operands and output in ``recipe.dtype``,
    ``precision=recipe.precision`` (HIGHEST = true FP32, DEFAULT = TF32 for FP32 on GPUs).

    The output stays in ``recipe.dtype`` on purpose: GPU GEMMs accumulate in FP32 internally
    either way, and an FP32 output would make the backward pass multiply an FP32 cotangent
    with BF16 operands, which XLA runs as a (slower) FP32/TF32 GEMM: an unfair baseline.

    An operand already in ``recipe.dtype`` is passed as it is, not cast: post-training
    quantization (qwix's ``PtqProvider``, ``repro.precision.export``) hands this function its
    quantized weight arrays, whose ``dtype`` is their dequantized dtype and which do not
    support a cast through the array API; qwix then runs the product on the quantized values."""
    dt = recipe.dtype

    def cast(a):
        return a if a.dtype == dt else a.astype(dt)

    return lax.dot_general(cast(x), cast(w), (((x.ndim - 1,), (0,)), ((), ())),
                           precision=recipe.precision)


def dot(x, w, recipe, meta=None, key=None):
    """The one entry point layers call: ``x[..., K] @ w[K, N]`` as ``recipe`` says (a recipe of
    this repository; a peer library's runs in ``repro.precision.peers``)."""
    recipe = validate.recipe_for(recipe, ("dense", "fp8", "fp8block", "mxfp8", "nvfp4", "int8"),
                                 "dot")
    if recipe.gemm == "dense":
        _flatten_lhs(x, _check_2d_weight(w, "dot"), "dot")
        return dense_dot(x, w, recipe)
    if recipe.gemm == "fp8":
        return fp8_dot(x, w, recipe, meta)
    if recipe.gemm == "fp8block":
        return fp8block_dot(x, w, recipe)
    if recipe.gemm == "mxfp8":
        return mxfp8_dot(x, w, recipe)
    if recipe.gemm == "nvfp4":
        return nvfp4_dot(x, w, recipe, key, meta)
    if recipe.gemm == "int8":
        _flatten_lhs(x, _check_2d_weight(w, "dot"), "dot")
        return int8.int8_dot(x, w, recipe)
    raise ValueError(f"unknown gemm {recipe.gemm!r} in recipe {recipe.name!r}")
