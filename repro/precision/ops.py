"""Quantized matrix products: per-tensor FP8, MXFP8 and NVFP4, all three GEMMs of a layer.

A layer computes ``y = x @ w`` forward and two GEMMs backward: the data gradient
``dx = g @ w.T`` ("dgrad") and the weight gradient ``dw = x.T @ g`` ("wgrad"). Each function
here is a ``jax.custom_vjp`` that runs all three in the recipe's format:

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

Layout (``recipe.fp8_layout``; "auto", the default, picks "tn" where the cast-transpose kernel
of ``repro.precision.kernels`` runs, else "natural"). "natural": every GEMM is written as
``dot_general`` with the natural contraction dims: fwd ``x[M,K] . w[K,N]`` (contract K), dgrad
``g[M,N] . w[K,N]`` (contract N), wgrad ``x[M,K] . g[M,N]`` (contract M). cuBLASLt FP8 on
Hopper needs both operands with the contraction dim minor ("TN"); XLA's GEMM rewriter inserts
the missing transposes, and with this formulation they are always transposes of 1-byte FP8
arrays: ``w`` in the forward pass (weight-sized), and ``xq``/``gq`` in the wgrad
(activation-sized). "tn": every GEMM written in TN form, the transposed FP8 copies made in
the pass that quantizes (Transformer Engine's cast-transpose: ``x^T``, ``g^T``, ``w^T``; on a
GPU one Pallas kernel per operand), ``x^T`` saved instead of ``x``; same values
(``recipe.fp8_grad_cast`` "two-pass": the output gradient's two copies in two passes, for a
smaller backward peak). Block-scaled GEMMs are written directly in the TN form ``a[M,K] . b[N,K]`` that
``scaled_matmul`` requires.

An input that is not differentiated (a network's input batch: its holder keeps it through
the backward pass anyway) is saved as it is, not as an FP8 copy, and the backward pass
quantizes it again with its forward scale (same values); no data gradient is computed for it.

Delayed scaling and the ``meta`` cotangent. ``meta`` is a dict
``{"input", "kernel", "output_grad"}`` of ``repro.precision.scaling.DelayedScalingState``. The forward
pass quantizes with the stored scales (computed at the end of the previous step, as TE does)
and the custom_vjp returns the UPDATED state (current amax pushed into each history, scale
recomputed) as the "gradient" of ``meta``: flax's overwrite-with-gradient mechanism
(``flax.linen.fp8_ops``). A train step replaces the state by its gradient
(``repro.precision.layers.apply_gradients``). Caveat: if the same ``meta`` is used by several calls in one
differentiated function (shared weights), the cotangents are summed and the state is wrong;
give each call its own state. flax avoids this with a private dtype; we keep to public APIs.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from repro.precision import blockfp8 as B
from repro.precision import formats as F
from repro.precision import kernels
from repro.precision import scaling as S
from repro.precision import validate
from repro.precision.recipes import resolve

__all__ = [
    "META_KEYS", "init_meta", "fp8_dot", "fp8_dense", "fp8_conv", "fp8block_dot", "mxfp8_dot",
    "nvfp4_dot", "dot",
    "block_scaled_backend", "is_emulated", "StoredWeight", "stored_weight",
]

META_KEYS = ("input", "kernel", "output_grad")

# dot_general dimension numbers of the three GEMMs (2-D operands).
_DN_FWD = (((1,), (0,)), ((), ()))  # x[M,K] . w[K,N] -> [M,N]
_DN_DGRAD = (((1,), (1,)), ((), ()))  # g[M,N] . w[K,N] -> [M,K]
_DN_WGRAD = (((0,), (0,)), ((), ()))  # x[M,K] . g[M,N] -> [K,N]
_DN_TN = (((1,), (1,)), ((), ()))  # a[M,K] . b[N,K] -> [M,N]


# ------------------------------------------------------------------------------ dispatch


def block_scaled_backend(hardware=None) -> Literal["native", "emulated"]:
    """"native" where block-scaled FP4/MXFP8 tensor cores exist (compute capability >= 10)."""
    if hardware is None:
        from repro.hardware import current

        hardware = current()
    return "native" if hardware.has_fp4 else "emulated"


def is_emulated(recipe, hardware=None) -> bool:
    """True when ``recipe``'s GEMMs have no tensor-core support on ``hardware``.

    MXFP8/NVFP4 off Blackwell, and FP8 on a device without FP8 tensor cores (e.g. CPU). The
    numerics are those of the format either way; benchmarks stamp their records with this.
    """
    recipe = resolve(recipe)
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
        from repro.precision import int8

        return int8.is_emulated(hardware)
    return False


# ------------------------------------------------------------------------------ helpers


def _fmax(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def _token(x):
    """A scalar carrying x's dtype through custom_vjp residuals (cotangents need it)."""
    return jnp.zeros((), x.dtype)


def init_meta(history_len: int = 1024) -> dict[str, S.DelayedScalingState]:
    """Fresh delayed-scaling state for one FP8 GEMM: input, kernel and output-gradient."""
    return {k: S.init_delayed(history_len) for k in META_KEYS}


def _check_2d_weight(w, what):
    w = validate.operand(w, what, "w")
    if w.ndim != 2:
        raise ValueError(f"{what}: w must be 2-D [K, N], got shape {w.shape}")
    return w


def _flatten_lhs(x, w, what):
    x = validate.operand(x, what, "x")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"{what}: contraction mismatch, x {x.shape} vs w {w.shape}: the "
                         "last axis of x must be w's first")
    return x.reshape(-1, x.shape[-1])


# ------------------------------------------------------------------- per-tensor FP8 core


def _scale_now(x, dtype, recipe):
    if recipe.scaling == "none":
        return jnp.float32(1.0)
    return S.current_scale(x, _fmax(dtype), recipe.margin)


def _gemm_out_dtype(recipe, op) -> jnp.dtype:
    """Element type of the forward and dgrad GEMM outputs (``Recipe.fp8_gemm_out``).

    "compute" writes ``recipe.dtype`` when it has FP32's exponent range (BF16, FP32): the
    unscaled product of FP8 values (up to K * 448 * 57344) overflows FP16, so FP16 keeps FP32.
    Convolutions always use FP32."""
    dt = recipe.dtype
    if (op[0] in ("dot", "dot_tn") and recipe.fp8_gemm_out == "compute"
            and jnp.finfo(dt).maxexp >= jnp.finfo(jnp.float32).maxexp):
        return dt
    return jnp.dtype(jnp.float32)


def _rescale(acc, scale, dtype):
    """``acc * scale`` cast to ``dtype``, the multiply in ``acc``'s dtype: a multiply of the
    GEMM output by a broadcast scalar, which XLA's GEMM rewriter folds into the cuBLASLt FP8
    call (and a following vector bias add into its epilogue)."""
    return (acc * scale.astype(acc.dtype)).astype(dtype)


def _fwd_gemm(op, xq, wq, out_dtype=jnp.float32):
    """The forward product of FP8 operands in ``out_dtype``, unscaled. For "tn", ``wq`` is
    the transposed weight ``w^T[N, K]``."""
    if op[0] == "dot":
        return lax.dot_general(xq, wq, _DN_FWD, preferred_element_type=out_dtype)
    if op[0] == "dot_tn":
        return lax.dot_general(xq, wq, _DN_TN, preferred_element_type=out_dtype)
    _, strides, padding, dn = op
    return lax.conv_general_dilated(xq, wq, strides, padding, dimension_numbers=dn,
                                    preferred_element_type=jnp.float32)


def _bwd_gemms(op, gq, xq, wq, out_dtype=jnp.float32, gq_t=None):
    """dgrad (``out_dtype``) and wgrad (FP32) of FP8 operands, unscaled.

    "dot": ``xq`` is the saved input ``x[M, K]``. "dot_tn": ``xq`` is the saved ``x^T[K, M]``
    and ``gq_t`` the transposed gradient ``g^T[N, M]``: every GEMM in TN form."""
    if op[0] in ("dot", "dot_tn"):
        if op[0] == "dot":
            dw = lax.dot_general(xq, gq, _DN_WGRAD, preferred_element_type=jnp.float32)
        else:
            dw = lax.dot_general(xq, gq_t, _DN_TN, preferred_element_type=jnp.float32)
        # The weight gradient first: nothing waits for ``dw`` until the optimizer, and XLA's
        # scheduler left weight-gradient GEMMs to the end of the backward pass, keeping every
        # layer's FP8 operands (x^T, g^T) alive until then. Through the barrier the data
        # gradient (and the layers below) waits for it; an unused data gradient (the input's)
        # is still left out.
        gq, dw = lax.optimization_barrier((gq, dw))
        dx = lax.dot_general(gq, wq, _DN_DGRAD, preferred_element_type=out_dtype)
        return dx, dw
    # Convolution backward: quantize-dequantize emulation. The FP8 values (exact in BF16,
    # unscaled) go through BF16 transposed convolutions; scales are applied afterwards.
    _, strides, padding, dn = op
    bf = jnp.bfloat16

    def conv(a, b):
        return lax.conv_general_dilated(a, b, strides, padding, dimension_numbers=dn)

    _, vjp = jax.vjp(conv, xq.astype(bf), wq.astype(bf))
    dx, dw = vjp(gq.astype(bf))
    return dx.astype(jnp.float32), dw.astype(jnp.float32)


def _replace_meta(meta, new: dict):
    """``new`` (a dict keyed like META_KEYS) in the exact pytree structure of ``meta``."""
    leaves = [leaf for k in sorted(new) for leaf in jax.tree.leaves(new[k])]
    return jax.tree.unflatten(jax.tree.structure(meta), leaves)


def _pushed(state, amax, dtype, recipe):
    """A tensor's delayed-scaling state after this step's ``amax``: pushed into its own
    history ("shift", :func:`repro.precision.scaling.delayed_update`), or for the "ring"
    layout (``Recipe.amax_history``) the amax alone beside the unchanged scale: the optimizer
    step pushes every tensor's at once (``repro.precision.layers.apply_gradients``)."""
    if recipe.amax_history == "ring":
        return S.AmaxSlot(jnp.asarray(amax, jnp.float32), state.scale)
    return S.delayed_update(state, amax, _fmax(dtype), recipe.amax_compute_algo, recipe.margin)


ACTIVATIONS = (None, "relu", "tanh")


def _caster(recipe, op):
    """The FP8 cast of GEMM operands: the hardware convert (``Recipe.fp8_cast`` "native") for
    products, the explicit rounding for convolutions (their emulated backward converts the FP8
    operands back to BF16, a round trip XLA may fold)."""
    return F.fp8_cast if recipe.fp8_cast == "native" and op[0] != "conv" else F.fp8_quantize


def _epilogue(y, b, act):
    """``act(y + b)`` in ``y``'s dtype and the activation's residual: a bit-packed mask
    (relu: 1 bit per element), the output (tanh) or None."""
    if b is not None:
        y = y + b.astype(y.dtype)
    if act == "relu":
        return jnp.maximum(y, 0), jnp.packbits(y > 0, axis=-1)
    if act == "tanh":
        y = jnp.tanh(y)
        return y, y
    return y, None


def _epilogue_grad(g, act_res, act, n):
    """The gradient before the activation (``g * act'``) from the output gradient ``g``."""
    if act == "relu":
        return jnp.where(jnp.unpackbits(act_res, axis=-1, count=n).astype(bool), g,
                         jnp.zeros((), g.dtype))
    if act == "tanh":
        return (g.astype(jnp.float32) * (1 - jnp.square(act_res.astype(jnp.float32)))
                ).astype(g.dtype)
    return g


def _cast_and_amax(cast, x, dtype, scale):
    """``(cast(x), amax(x))`` computed together. Under delayed scaling nothing downstream
    waits for the amax (it only updates the history), and XLA's scheduler then ran its
    reduction late, keeping the activation-sized source alive until the end of the step (a
    quarter more memory than BF16 for the benchmark MLP); the barrier makes both results
    available at once, so the source can be freed where it is quantized."""
    return lax.optimization_barrier((cast(x, dtype, scale), S.amax(x)))


def _operand(x, dtype, recipe, op, scale=None, mask=None, transpose=False):
    """The FP8 copy of a GEMM operand ``x[M, N]`` for ``recipe``.

    Returns ``(q, q^T or None, scale, amax, column sums)``. ``scale``: the stored scale
    (delayed scaling) or None (computed here from this tensor's amax). ``mask``: a packed ReLU
    mask (``jnp.packbits`` along N) applied first. ``transpose``: also the transposed copy
    (the "tn" layout); then, where it runs, one Pallas kernel reads ``x`` once for all of it
    (``repro.precision.kernels.cast_transpose``).
    """
    cast = _caster(recipe, op)
    one_pass = transpose and recipe.fp8_cast == "native" and kernels.fits(x.shape)
    if not one_pass and mask is not None:
        x = _epilogue_grad(x, mask, "relu", x.shape[-1])
        mask = None
    current = scale is None  # current scaling (or none): the scale comes first
    if current:
        xm = x if mask is None else _epilogue_grad(x, mask, "relu", x.shape[-1])
        scale = _scale_now(xm, dtype, recipe)
    if one_pass:
        q, qt, amax, sums = kernels.cast_transpose(x, dtype, scale, mask)
        return q, qt, scale, amax, sums
    q, amax = (cast(x, dtype, scale), None) if current else _cast_and_amax(cast, x, dtype, scale)
    qt = cast(x.T, dtype, scale) if transpose else None
    return q, qt, scale, amax, None


def _requantize(x, dtype, recipe, op, scale):
    """The FP8 copy of a kept input for the weight gradient, with its forward scale: ``x^T``
    for "tn" (one kernel pass where it runs), else ``x``."""
    if op[0] != "dot_tn":
        return _caster(recipe, op)(x, dtype, scale)
    if recipe.fp8_cast == "native" and kernels.fits(x.shape):
        return kernels.cast_transpose(x, dtype, scale, None, "t")[1]
    return _caster(recipe, op)(x.T, dtype, scale)


def _fp8_fwd(x, w, b, meta, recipe, op, act, keep_input=False):
    """The forward product and its residuals. ``keep_input``: save ``x`` itself (the caller
    holds it anyway, see :func:`_fp8_fwd_rule`) instead of its FP8 copy; the backward
    quantizes it again with the same scale (same values)."""
    fdt = jnp.dtype(recipe.fwd_dtype)
    tn = op[0] == "dot_tn"
    delayed = recipe.scaling == "delayed"
    mx, mw = (meta["input"], meta["kernel"]) if delayed else (None, None)
    xq, xq_t, sx, ax, _ = _operand(x, fdt, recipe, op, mx.scale if delayed else None,
                                   transpose=tn and not keep_input)
    stored = None if meta is None else meta.get("weight")
    if stored is None:
        # the weight: quantized ONCE per call (the dgrad reuses it); its amax from the FP32 master
        wq, wq_t, sw, aw, _ = _operand(w, fdt, recipe, op, mw.scale if delayed else None,
                                       transpose=tn)
    else:  # the copy the optimizer step wrote (``fp8_weights="stored"``): w is not read
        wq, wq_t, sw, aw = _stored_operands(stored, tn)
    carry = None
    if delayed:
        carry = (meta["output_grad"], _pushed(mx, ax, fdt, recipe), _pushed(mw, aw, fdt, recipe))
    odt = _gemm_out_dtype(recipe, op)
    # "tn": every GEMM in TN form; x^T, not x, is kept for the weight-gradient GEMM
    acc = _fwd_gemm(op, xq, wq_t if tn else wq, odt)
    y, act_res = _epilogue(_rescale(acc, sx * sw, recipe.dtype), b, act)
    bt = None if b is None else _token(b)
    x_res = x if keep_input else (xq_t if tn else xq)
    return y, (x_res, wq, sx, sw, carry, _token(x), _token(w), bt, act_res, meta)


def _fp8_fwd_rule(x, w, b, meta, recipe, op, act):
    """The custom_vjp's forward (``symbolic_zeros``: each primal says whether it is
    differentiated). An input that is not differentiated (a network's input batch) is held by
    its caller through the backward pass anyway, so it is saved as it is: no FP8 copy of it
    outlives the forward pass, and no data gradient is computed for it. (For a non-
    differentiated input that the caller would free, e.g. features of a frozen network, this
    keeps its own bytes instead of one byte per element.)"""
    keep = not x.perturbed
    x, w, b, meta = jax.tree.map(lambda p: p.value, (x, w, b, meta),
                                 is_leaf=lambda p: isinstance(p, CustomVJPPrimal))
    return _fp8_fwd(x, w, b, meta, recipe, op, act, keep_input=keep)


def _grad_gemms(recipe, op, act_mask, g, x_res, wq, scale, want_dx):
    """The output gradient's FP8 copies and both backward GEMMs: ``(dx or None, dw, scale,
    amax, column sums)``, unscaled. In the "tn" layout through the kernel: ``g^T`` alone where
    no data gradient is wanted, and with ``recipe.fp8_grad_cast == "two-pass"`` a second pass
    for ``g`` after the weight gradient, so that ``g`` and both FP8 copies are never alive
    together."""
    bdt = jnp.dtype(recipe.bwd_dtype)
    tn = op[0] == "dot_tn"
    if not (tn and recipe.fp8_cast == "native" and kernels.fits(g.shape)):
        gq, gq_t, sg, ag, sums = _operand(g, bdt, recipe, op, scale, act_mask, transpose=tn)
        dx, dw = _bwd_gemms(op, gq, x_res, wq, _gemm_out_dtype(recipe, op), gq_t)
        return (dx if want_dx else None), dw, sg, ag, sums
    if scale is None:  # current scaling: the scale first
        gm = g if act_mask is None else _epilogue_grad(g, act_mask, "relu", g.shape[-1])
        scale = _scale_now(gm, bdt, recipe)
    two = recipe.fp8_grad_cast == "two-pass"
    gq, gq_t, ag, sums = kernels.cast_transpose(g, bdt, scale, act_mask,
                                                "t" if two or not want_dx else "qt")
    dw = lax.dot_general(x_res, gq_t, _DN_TN, preferred_element_type=jnp.float32)
    if not want_dx:
        return None, dw, scale, ag, sums
    if two:  # the second pass waits for the weight gradient (else XLA runs both passes first)
        g, act_mask, dw = lax.optimization_barrier((g, act_mask, dw))
        gq = kernels.cast_transpose(g, bdt, scale, act_mask, "q")[0]
    else:  # the weight gradient first, as _bwd_gemms does
        gq, dw = lax.optimization_barrier((gq, dw))
    dx = lax.dot_general(gq, wq, _DN_DGRAD, preferred_element_type=_gemm_out_dtype(recipe, op))
    return dx, dw, scale, ag, sums


def _fp8_bwd(recipe, op, act, res, g):
    x_res, wq, sx, sw, carry, xt, wt, bt, act_res, meta = res
    fdt, bdt = jnp.dtype(recipe.fwd_dtype), jnp.dtype(recipe.bwd_dtype)
    if isinstance(g, SymbolicZero):  # the output is not used: a zero gradient
        g = jnp.zeros(g.shape, g.dtype)
    mask = act_res if act == "relu" else None
    if act == "tanh":
        g = _epilogue_grad(g, act_res, act, g.shape[-1])
    kept = x_res.dtype != fdt  # the input itself (not differentiated): quantize it again
    if kept:
        x_res = _requantize(x_res, fdt, recipe, op, sx)
    delayed = recipe.scaling == "delayed"
    dx, dw, sg, ag, sums = _grad_gemms(recipe, op, mask, g, x_res, wq,
                                       carry[0].scale if delayed else None, not kept)
    db = None
    if bt is not None:
        if sums is None:
            gm = g if mask is None else _epilogue_grad(g, mask, "relu", g.shape[-1])
            sums = jnp.sum(gm.astype(jnp.float32), axis=0)
        db = sums.astype(bt.dtype)
    if delayed:
        mg, new_x, new_w = carry
        new = {"input": new_x, "kernel": new_w, "output_grad": _pushed(mg, ag, bdt, recipe)}
        if "weight" in meta:  # the optimizer step writes the next copy
            new["weight"] = jax.tree.map(jnp.zeros_like, meta["weight"])
        meta_ct = _replace_meta(meta, new)
    else:
        meta_ct = None if meta is None else jax.tree.map(jnp.zeros_like, meta)
    dx = None if dx is None else _rescale(dx, sg * sw, xt.dtype)
    dw = _rescale(dw, sx * sg, wt.dtype)
    return dx, dw, db, meta_ct


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fp8_core(x, w, b, meta, recipe, op, act):
    return _fp8_fwd(x, w, b, meta, recipe, op, act)[0]


_fp8_core.defvjp(_fp8_fwd_rule, _fp8_bwd, symbolic_zeros=True)


def _fp8_call(x, w, recipe, meta, op, what, b=None, act=None):
    if recipe.scaling not in ("current", "delayed", "none"):
        raise ValueError(f"{what}: recipe {recipe.name!r} has scaling={recipe.scaling!r}; "
                         "FP8 per-tensor scaling is 'current', 'delayed' or 'none'")
    if act not in ACTIVATIONS:
        raise ValueError(f"{what}: activation must be one of {list(ACTIVATIONS)}, got {act!r}")
    stored = recipe.fp8_weights == "stored"
    if stored and not isinstance((meta or {}).get("weight"), StoredWeight):
        raise ValueError(f"{what}: recipe {recipe.name!r} reads a stored FP8 weight: meta needs "
                         "'weight', a StoredWeight (see ops.stored_weight)")
    if recipe.scaling == "delayed":
        if meta is None:
            raise ValueError(f"{what}: delayed scaling needs meta (see ops.init_meta)")
        missing = [k for k in META_KEYS if k not in meta]
        if missing:
            raise ValueError(f"{what}: meta lacks {missing}; expected keys {META_KEYS}")
    elif stored:
        meta = {"weight": meta["weight"]}  # the stored copy alone (no scaling state)
    else:
        meta = None  # no state: ignore whatever was passed, its cotangent is zero
    return _fp8_core(x, w, b, meta, recipe, op, act)


def _tn(recipe, x_shape, w_shape) -> bool:
    """Whether a product runs in the "tn" layout (``Recipe.fp8_layout``; "auto": where the
    cast-transpose kernel runs for the input, the weight and the output gradient)."""
    if recipe.fp8_layout != "auto":
        return recipe.fp8_layout == "tn"
    m, k = x_shape
    n = w_shape[1]
    return (recipe.fp8_cast == "native"
            and all(kernels.fits(s) for s in ((m, k), (k, n), (m, n))))


def fp8_dot(x, w, recipe, meta=None):
    """``x[..., K] @ w[K, N] -> [..., N]`` in ``recipe.dtype``, all three GEMMs in FP8.

    Forward operands ``recipe.fwd_dtype`` (e4m3), the output gradient ``recipe.bwd_dtype``
    (e5m2); FP32 accumulation; scales multiply the GEMM outputs. ``meta`` (delayed scaling
    only): ``{"input", "kernel", "output_grad"}`` -> DelayedScalingState; its gradient is the
    updated state. Gradients come back in x's and w's dtypes. ``recipe``: a per-tensor FP8
    recipe of this repository (``gemm="fp8"``); anything else is refused.
    """
    return _fp8_dense(x, w, None, recipe, meta, None, "fp8_dot")


def fp8_dense(x, w, b, recipe, meta=None, activation: str | None = None):
    """``activation(x[..., K] @ w[K, N] + b[N])`` with all three GEMMs in FP8, bias and
    activation inside the ``custom_vjp`` (``Recipe.fp8_epilogue`` "fused").

    What the backward pass keeps: the FP8 input (an input that is not differentiated: the
    input itself) and weight, their scales, and for ``"relu"`` a 1-bit mask
    (``jnp.packbits``), for ``"tanh"`` the output; no activation-sized BF16 copy for ReLU. The output gradient is read once for the activation's gradient, the bias
    gradient (summed in FP32) and its FP8 cast. ``b`` may be None; ``activation`` one of
    None, "relu", "tanh". Same forward values as ``activation(fp8_dot(x, w) + b)``.
    """
    return _fp8_dense(x, w, b, recipe, meta, activation, "fp8_dense")


def _fp8_dense(x, w, b, recipe, meta, activation, what):
    recipe = validate.recipe_for(recipe, ("fp8",), what)
    w = _check_2d_weight(w, what)
    x2 = _flatten_lhs(x, w, what)
    if b is not None and jnp.shape(b) != (w.shape[1],):
        raise ValueError(f"{what}: bias shape {jnp.shape(b)} does not match the "
                         f"{w.shape[1]} outputs of w {w.shape}")
    op = ("dot_tn",) if _tn(recipe, x2.shape, w.shape) else ("dot",)
    y = _fp8_call(x2, w, recipe, meta, op, what, b, activation)
    return y.reshape(*x.shape[:-1], w.shape[1])


# ------------------------------------------------------------- stored FP8 weights


@dataclasses.dataclass(frozen=True)
class StoredWeight:
    """The FP8 copy of a weight ``w[K, N]`` that a layer of a ``fp8_weights="stored"`` recipe
    reads instead of its master weight (``meta["weight"]`` of :func:`fp8_dense`): ``q`` (``w``
    over ``scale`` in ``recipe.fwd_dtype``), its transpose ``q_t`` [N, K] (the "tn" layout's
    forward operand; None where the layer does not store it: then it transposes ``q``), the
    dequantize ``scale`` and the ``amax`` of the master weight it was made from (delayed
    scaling pushes it into the kernel's history, as a per-call recipe pushes the amax of the
    weight it quantizes). ``recipe`` (static): the layer's recipe, which says how to make the
    next copy (:func:`stored_weight`)."""

    q: jax.Array
    q_t: jax.Array | None
    scale: jax.Array
    amax: jax.Array
    recipe: object = None


jax.tree_util.register_dataclass(StoredWeight, data_fields=["q", "q_t", "scale", "amax"],
                                 meta_fields=["recipe"])


def stored_weight(w, recipe, scale=None, transpose: bool = False) -> StoredWeight:
    """The FP8 copy of ``w[K, N]`` that the layer's next call reads (``Recipe.fp8_weights``
    "stored"), made as a per-call recipe's forward pass quantizes it: ``scale`` is the kernel's
    delayed-scaling scale for that call (None: current scaling, from ``w``'s amax now; scale 1
    for ``scaling="none"``); ``transpose`` also stores ``q^T`` (in one pass where the
    cast-transpose kernel runs, ``repro.precision.kernels``). The optimizer step calls it
    right after the update (``repro.precision.layers.apply_gradients``), where it reads the
    master weight it has just written."""
    recipe = validate.recipe_for(recipe, ("fp8",), "stored_weight")
    w = _check_2d_weight(w, "stored_weight")
    fdt = jnp.dtype(recipe.fwd_dtype)
    a = S.amax(w)
    if scale is None:
        scale = (jnp.float32(1.0) if recipe.scaling == "none"
                 else F.compute_scale(a, _fmax(fdt), recipe.margin))
    scale = jnp.asarray(scale, jnp.float32)
    if transpose and recipe.fp8_cast == "native" and kernels.fits(w.shape):
        q, q_t, a, _ = kernels.cast_transpose(w, fdt, scale)
    else:
        cast = _caster(recipe, ("dot",))
        q = cast(w, fdt, scale)
        q_t = cast(w.T, fdt, scale) if transpose else None
    return StoredWeight(q, q_t, scale, a, recipe)


def _stored_operands(stored: StoredWeight, tn: bool):
    """``(q, q^T or None, scale, amax)`` of a stored copy for a product in layout ``tn``."""
    q_t = (stored.q_t if stored.q_t is not None else stored.q.T) if tn else None
    return stored.q, q_t, stored.scale, stored.amax


def conv_dimension_numbers(ndim: int) -> lax.ConvDimensionNumbers:
    """Channels-last dimension numbers (NHWC, HWIO, NHWC) for ``ndim``-D inputs."""
    nsp = ndim - 2
    lhs = (0, ndim - 1, *range(1, ndim - 1))
    rhs = (nsp + 1, nsp, *range(nsp))
    return lax.ConvDimensionNumbers(lhs, rhs, lhs)


def _static_padding(padding):
    return padding if isinstance(padding, str) else tuple(tuple(int(p) for p in pair)
                                                          for pair in padding)


# Input channels of an FP8 convolution are zero-padded to a multiple of this (see fp8_conv).
CONV_CHANNEL_MULTIPLE = 16


def fp8_conv(x, w, recipe, meta=None, strides=None, padding="SAME"):
    """Channels-last convolution ``x[N, *spatial, C] * w[*window, C, F]`` in FP8.

    Forward: FP8 operands straight into ``lax.conv_general_dilated`` (preferred FP32, scales on
    the output): cuDNN FP8 convolution on Hopper. Backward: quantize-dequantize emulation (the
    e5m2 gradient and the saved e4m3 operands, exact in BF16, through BF16 transposed
    convolutions): the numerics of an FP8 backward pass, the speed of BF16. FP8 convolutions are
    here for the numerics, not for speed: in the H200's ``rl_throughput`` records of the MinAtar
    CNN (``cnn_w0_*`` cells) the FP8 recipes' updates are slower than BF16's.
    """
    recipe = validate.recipe_for(recipe, ("fp8",), "fp8_conv")
    x, w = _check_conv(x, w)
    nsp = x.ndim - 2
    strides = _conv_strides(strides, nsp)
    op = ("conv", strides, _conv_padding(padding, nsp), conv_dimension_numbers(x.ndim))
    # Input channels padded with zeros to a multiple of CONV_CHANNEL_MULTIPLE (exact: the
    # padded products are zero, the amaxes unchanged; pad's gradient slices them off). On the
    # H200 cuDNN has no FP8 plan for SpaceInvaders-MinAtar's 6 input channels under vmap (a
    # grouped convolution: "No supported configs found" at compile time), while 4 channels
    # work; XLA's FP8 conv fallback (openxla/xla#40021) names grouped convs under 16 channels
    # per group.
    x = _pad_axis(x, x.ndim - 1, CONV_CHANNEL_MULTIPLE)
    w = _pad_axis(w, w.ndim - 2, CONV_CHANNEL_MULTIPLE)
    return _fp8_call(x, w, recipe, meta, op, "fp8_conv")


def _check_conv(x, w):
    """Ranks and channels of a channels-last convolution (the zero padding of the channels
    would otherwise hide a mismatch that ``lax.conv`` reports)."""
    x = validate.operand(x, "fp8_conv", "x", min_ndim=3)
    w = validate.operand(w, "fp8_conv", "w", min_ndim=3)
    if w.ndim != x.ndim:
        raise ValueError(f"fp8_conv: x {x.shape} [N, *spatial, C] and w {w.shape} "
                         "[*window, C, F] need the same rank")
    if x.shape[-1] != w.shape[-2]:
        raise ValueError(f"fp8_conv: channel mismatch: x {x.shape} has {x.shape[-1]} input "
                         f"channels, w {w.shape} expects {w.shape[-2]}")
    return x, w


def _conv_strides(strides, nsp: int) -> tuple[int, ...]:
    try:
        out = (1,) * nsp if strides is None else tuple(operator.index(v) for v in strides)
    except TypeError:
        out = ()
    if len(out) != nsp or min(out) < 1:
        raise ValueError(f"fp8_conv: strides must be {nsp} positive ints, got {strides!r}")
    return out


def _conv_padding(padding, nsp: int):
    if isinstance(padding, str) and padding in ("SAME", "VALID", "SAME_LOWER"):
        return padding
    try:
        pads = None if isinstance(padding, str) else _static_padding(padding)
    except (TypeError, ValueError):
        pads = None
    if pads is None or len(pads) != nsp or not all(len(p) == 2 and min(p) >= 0 for p in pads):
        raise ValueError(f"fp8_conv: padding must be 'SAME', 'VALID', 'SAME_LOWER' or {nsp} "
                         f"(low, high) pairs of ints >= 0, got {padding!r}")
    return pads


# -------------------------------------------------------------- block-scaled GEMM kernels


def _pad_axis(x, axis, multiple):
    r = (-x.shape[axis]) % multiple
    if r == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, r)
    return jnp.pad(x, pad)


def _rows_from_2d(t: F.NVFP4Tensor, transpose: bool):
    """A 16x16-block NVFP4 matrix as (q, 1x16 row-block scales, global scale).

    2-D blocks are transpose-symmetric: the transposed matrix is the same blocks, transposed.
    Each 16x16 scale is repeated over the 16 rows it covers (what scaled_matmul takes).
    """
    q, bs = t.q, t.block_scale
    if transpose:
        q, bs = q.T, bs.T
    return q, jnp.repeat(bs, 16, axis=0), t.global_scale


def _nvfp4_rows(a, rounding="nearest", key=None):
    """NVFP4 of a[R, C] with 1x16 blocks along C (C padded to 16): (q, scales, global)."""
    t = F.nvfp4_quantize(_pad_axis(a, 1, 16), (1, 16), rounding=rounding, key=key)
    return t.q, t.block_scale, t.global_scale


def _mxfp8_rows(a):
    """MXFP8 of a[R, C] with 32-blocks along C (C padded to 32): (q, scales, None)."""
    t = F.mxfp8_quantize(_pad_axis(a, 1, 32), axis=-1, block=32)
    return t.q, t.scale, None


def _dequant_rows(q, s):
    """q * s (s repeated over its block), in BF16: exact for E4M3 x E8M0 and E2M1 x E4M3."""
    block = q.shape[-1] // s.shape[-1]
    return (q.astype(jnp.float32) * jnp.repeat(s.astype(jnp.float32), block, axis=-1)
            ).astype(jnp.bfloat16)


def _block_gemm(a, b, backend):
    """``a[M,K] . b[N,K]^T`` for row-block-quantized operands ``(q, scales, global_scale)``.

    Returns FP32 [M, N]. The global scales (NVFP4) multiply the output.
    """
    (qa, sa, ga), (qb, sb, gb) = a, b
    if qa.shape[1] != qb.shape[1]:
        raise ValueError(f"block GEMM: contraction mismatch {qa.shape} vs {qb.shape}")
    if backend == "native":
        out = jax.nn.scaled_matmul(qa[None], qb[None], sa[None], sb[None],
                                   preferred_element_type=jnp.float32)[0]
    elif backend == "emulated":
        out = lax.dot_general(_dequant_rows(qa, sa), _dequant_rows(qb, sb), _DN_TN,
                              preferred_element_type=jnp.float32)
    else:
        raise ValueError(f"backend must be 'native' or 'emulated', got {backend!r}")
    if ga is not None:
        out = out * (ga * gb)
    return out


def _resolve_backend(backend, what):
    if backend not in (None, "native", "emulated"):
        raise ValueError(f"{what}: backend must be None (detect), 'native' or 'emulated', "
                         f"got {backend!r}")
    return block_scaled_backend() if backend is None else backend


# ------------------------------------------------------------------------------- MXFP8


def _mx_fwd(x, w, recipe, backend):
    # forward: a = x[M,K], b = w^T[N,K] (blocks along K); the dgrad operand w[K,N] is quantized
    # along N (a second quantization of w, as TE's columnwise copy); wgrad operand x^T[K,M].
    K, N = w.shape
    y = _block_gemm(_mxfp8_rows(x), _mxfp8_rows(w.T), backend)[:, :N]
    res = (_mxfp8_rows(w), _mxfp8_rows(x.T), _token(x), _token(w))
    return y.astype(recipe.dtype), res


def _mx_bwd(recipe, backend, res, g):
    w_rows, xt_rows, xt, wt = res
    K = xt_rows[0].shape[0]
    N = g.shape[1]
    dx = _block_gemm(_mxfp8_rows(g), w_rows, backend)[:, :K]
    dw = _block_gemm(xt_rows, _mxfp8_rows(g.T), backend)[:, :N]
    return dx.astype(xt.dtype), dw.astype(wt.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _mx_core(x, w, recipe, backend):
    return _mx_fwd(x, w, recipe, backend)[0]


_mx_core.defvjp(_mx_fwd, _mx_bwd)


def mxfp8_dot(x, w, recipe, backend=None):
    """``x[..., K] @ w[K, N]`` with OCP MXFP8 (E4M3 elements, one E8M0 scale per 32 along the
    contraction axis of each GEMM) in all three GEMMs.

    Gradients are E4M3 too (Transformer Engine's MXFP8BlockScaling default; block scales give
    the range that per-tensor FP8 needed E5M2 for). Axes that are not multiples of 32 are
    zero-padded (exact: zeros change neither products nor block maxima). ``backend``: None
    (detect), "native" (``jax.nn.scaled_matmul``) or "emulated".
    """
    recipe = validate.recipe_for(recipe, ("mxfp8",), "mxfp8_dot")
    w = _check_2d_weight(w, "mxfp8_dot")
    x2 = _flatten_lhs(x, w, "mxfp8_dot")
    y = _mx_core(x2, w, recipe, _resolve_backend(backend, "mxfp8_dot"))
    return y.reshape(*x.shape[:-1], w.shape[1])


# ---------------------------------------------------------------------- block FP8 (1x128)


def _b8(a, block):
    """``a`` through block FP8 (``repro.precision.blockfp8``: E4M3, FP32 scales), back in BF16."""
    return B.dequantize(B.quantize(a, block), jnp.bfloat16)


def _b8_fwd(x, w, recipe):
    # forward: x[M,K] in 1x128 blocks along K, w[K,N] in 128x128 tiles (transpose-symmetric:
    # the dgrad reuses the same quantized weight); wgrad operand x^T[K,M] in 1x128 blocks along M.
    wd = _b8(w, (128, 128))
    y = lax.dot_general(_b8(x, (1, 128)), wd, (((1,), (0,)), ((), ())),
                        preferred_element_type=jnp.float32)
    return y.astype(recipe.dtype), (wd, _b8(x.T, (1, 128)), _token(x), _token(w))


def _b8_bwd(recipe, res, g):
    # every GEMM's operands in blocks along its contraction axis: g[M,N] along N for the dgrad,
    # g^T[N,M] along M for the wgrad
    wd, xt_d, xt, wt = res
    dx = lax.dot_general(_b8(g, (1, 128)), wd, (((1,), (1,)), ((), ())),
                         preferred_element_type=jnp.float32)
    dw = lax.dot_general(xt_d, _b8(g.T, (1, 128)), (((1,), (1,)), ((), ())),
                         preferred_element_type=jnp.float32)
    return dx.astype(xt.dtype), dw.astype(wt.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _b8_core(x, w, recipe):
    return _b8_fwd(x, w, recipe)[0]


_b8_core.defvjp(_b8_fwd, _b8_bwd)


def fp8block_dot(x, w, recipe):
    """``x[..., K] @ w[K, N]`` with DeepSeek-V3's block-scaled FP8 in all three GEMMs
    (Transformer Engine's Float8BlockScaling): E4M3 everywhere, one FP32 scale per 128x128
    weight tile and per 1x128 block of activations and gradients, each block along its
    GEMM's contraction axis.

    Emulated on every device this repository runs (Hopper has no block-scaled FP8 GEMM): each
    operand is quantized, dequantized to BF16 (the block product exact to BF16's rounding,
    relative 2**-9) and multiplied with FP32 accumulation. It measures accuracy, never speed.
    """
    recipe = validate.recipe_for(recipe, ("fp8block",), "fp8block_dot")
    w = _check_2d_weight(w, "fp8block_dot")
    x2 = _flatten_lhs(x, w, "fp8block_dot")
    y = _b8_core(x2, w, recipe)
    return y.reshape(*x.shape[:-1], w.shape[1])


# ------------------------------------------------------------------------------- NVFP4


def _nvfp4_keys(key):
    k_dgrad, k_wgrad, k_rht = jax.random.split(key, 3)
    return k_dgrad, k_wgrad, k_rht


def _nvfp4_weight(w, recipe):
    """(forward operand w^T[N,K], dgrad operand w[K,N]) as row-block tuples."""
    if recipe.weight_block_2d:
        wp = _pad_axis(_pad_axis(w, 0, 16), 1, 16)
        t = F.nvfp4_quantize(wp, (16, 16))  # the SAME quantized weight in both passes
        return _rows_from_2d(t, transpose=True), _rows_from_2d(t, transpose=False)
    return _nvfp4_rows(w.T), _nvfp4_rows(w)


def _wgrad_operand(a_t, recipe, k_rht, rounding="nearest", key=None):
    """NVFP4 wgrad operand from a^T[C, M]: optional RHT along M (the contraction), then 1x16."""
    a_t = _pad_axis(a_t.astype(jnp.float32), 1, 16)
    if recipe.rht:
        a_t = F.random_hadamard_transform(a_t, k_rht, axis=-1, n=16)
    return _nvfp4_rows(a_t, rounding, key)


def _nv_fwd(x, w, key, counter, recipe, backend):
    w_fwd, w_dgrad = _nvfp4_weight(w, recipe)
    N = w.shape[1]
    y = _block_gemm(_nvfp4_rows(x), w_fwd, backend)[:, :N]
    k_rht = _nvfp4_keys(key)[2]
    x_wgrad = _wgrad_operand(x.T, recipe, k_rht)  # activations: round to nearest
    res = (w_dgrad, x_wgrad, key, counter, _token(x), _token(w))
    return y.astype(recipe.dtype), res


def _nv_bwd(recipe, backend, res, g):
    w_dgrad, x_wgrad, key, counter, xt, wt = res
    k_dgrad, k_wgrad, k_rht = _nvfp4_keys(key)
    sr = recipe.stochastic_rounding
    rounding = "stochastic" if sr else "nearest"
    K = x_wgrad[0].shape[0]
    N = g.shape[1]
    g_dgrad = _nvfp4_rows(g, rounding, k_dgrad if sr else None)
    dx = _block_gemm(g_dgrad, w_dgrad, backend)[:, :K]
    g_wgrad = _wgrad_operand(g.T, recipe, k_rht, rounding, k_wgrad if sr else None)
    dw = _block_gemm(x_wgrad, g_wgrad, backend)[:, :N]
    counter_ct = None if counter is None else jax.tree.map(lambda c: c + 1, counter)
    return dx.astype(xt.dtype), dw.astype(wt.dtype), None, counter_ct


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _nv_core(x, w, key, counter, recipe, backend):
    return _nv_fwd(x, w, key, counter, recipe, backend)[0]


_nv_core.defvjp(_nv_fwd, _nv_bwd)


def nvfp4_dot(x, w, recipe, key=None, meta=None, backend=None):
    """``x[..., K] @ w[K, N]`` with NVIDIA's NVFP4 training recipe in all three GEMMs.

    E2M1 elements, E4M3 scales per 16 elements, an FP32 scale per tensor (arXiv 2509.25149):
    weights in 16x16 blocks (``recipe.weight_block_2d``; else 1x16 along each GEMM's
    contraction axis), activations and gradients 1x16 along the contraction axis of each GEMM;
    a random Hadamard transform (16-point, one random sign vector) on both inputs of the wgrad
    GEMM along its contraction (token) axis (``recipe.rht``); stochastic rounding of the
    gradients only (``recipe.stochastic_rounding``). Padding as in :func:`mxfp8_dot` (to 16).

    ``key``: PRNG key for the RHT signs and the stochastic rounding (required when either is
    on). ``meta``: optional ``{"step": float32 scalar}``; its gradient is ``step + 1`` (the
    layers use it to derive a fresh key each step without an rng stream).
    """
    recipe = validate.recipe_for(recipe, ("nvfp4",), "nvfp4_dot")
    w = _check_2d_weight(w, "nvfp4_dot")
    x2 = _flatten_lhs(x, w, "nvfp4_dot")
    backend = _resolve_backend(backend, "nvfp4_dot")
    if key is None:
        if recipe.rht or recipe.stochastic_rounding:
            raise ValueError("nvfp4_dot: recipe uses RHT / stochastic rounding: pass a PRNG key")
        key = jax.random.key(0)  # unused by the computation
    validate.key(key, "nvfp4_dot")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)  # raw uint32: plain arrays through the custom_vjp
    y = _nv_core(x2, w, key, meta, recipe, backend)
    return y.reshape(*x.shape[:-1], w.shape[1])


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
        from repro.precision import int8

        _flatten_lhs(x, _check_2d_weight(w, "dot"), "dot")
        return int8.int8_dot(x, w, recipe)
    raise ValueError(f"unknown gemm {recipe.gemm!r} in recipe {recipe.name!r}")
