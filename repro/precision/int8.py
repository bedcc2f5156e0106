"""INT8 training: symmetric INT8 operands, INT32 accumulation and FP32 scales in all three GEMMs
of a layer (the forward product, the data gradient and the weight gradient).

Where a chip's fast narrow format is INT8 rather than FP8 (a TPU v5e's matrix units multiply
``s8 x s8 -> s32`` at twice their BF16 rate and have no FP8 arithmetic), 8-bit training means
INT8 GEMMs. This module is that recipe family's format and ops, on the same floors as the FP8
path (:mod:`repro.precision.formats`, :mod:`repro.precision.scaling`, the ``custom_vjp`` of
:mod:`repro.precision.ops`); recipes ``int8`` and ``int8-auto`` (``repro recipes``) select it.

The format. A tensor ``x`` with dequantize scale ``s`` (``x ~= q * s``, the convention of
``formats``) is stored as ``q = clip(round(x * (1 / s)), -127, 127)`` in ``int8``: symmetric
(-128 is never used, so ``-q`` is always representable), rounded half to even (``jnp.round``),
saturating (values beyond the range, and +-inf, become +-127). The product of the multiply by
the reciprocal is float32, as for FP8, so bf16 inputs behave like their float32 values. Scales
come from the amax: ``s = amax / 127 * 2**margin`` (:func:`repro.precision.formats.compute_scale`:
1.0 where the amax is 0 or not finite).

INT8 has no NaN. A NaN in an operand is not cast (it would become an arbitrary integer): it
quantizes to 0, and the operand's dequantize scale becomes NaN, so the whole product is NaN
(FP8 keeps the NaN in the rows and columns it reaches; INT8 spreads it to the product: the
signal survives, a training loop's non-finite check still fires). An infinite amax gives the
scale 1.0, as for FP8: +-inf saturates to +-127.

The GEMMs (``x[M, K] @ w[K, N]``, output gradient ``g[M, N]``):

* forward: ``y = dot(xq, wq) -> s32``, times ``sx * sw``. ``x`` per tensor; ``w`` per output
  channel (a scale per column ``n``: it multiplies output column ``n``, exact; recipe field
  ``int8_weight_scale`` "channel", the default) or per tensor ("tensor");
* data gradient ``dx = g @ w^T`` contracts over ``N``, where the weight's per-channel scales
  lie: they are moved onto the gradient first (``g * sw``, per column: exact), which is then
  quantized per tensor, so the forward's INT8 weight is reused and never quantized twice
  (qwix's scale shifting). Per-tensor weights share the weight gradient's INT8 copy of ``g``;
* weight gradient ``dw = x^T @ g`` contracts over the ``M`` rows of both: the forward's INT8
  ``x`` (saved for the backward pass instead of a BF16 copy) and ``g`` per tensor.

Every GEMM is ``lax.dot_general(int8, int8, preferred_element_type=int32)``: exact integer
products and sums (no overflow below ``K = 2**31 / 127**2``, about 133,000), converted to
float32 and multiplied by the product of the two scales (float32), then cast to the output
dtype. Bias and activation run inside the ``custom_vjp`` as in ``repro.precision.ops.fp8_dense``
(a 1-bit mask for ReLU, :mod:`repro.precision.gemm`). Scaling is current (each tensor's amax now); delayed scaling is not
offered: INT8's 255 levels leave no room for an amax that lags the tensor.

Which products are INT8 on the device is read from the compiled program
(:mod:`repro.studies.lowering`: ``s8 x s8 -> s32`` dots); where the device has no INT8 matrix
arithmetic (:attr:`repro.hardware.HardwareInfo.has_int8`: a CPU) the numbers are the same and
records say ``emulated``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from repro.precision import formats as F
from repro.precision import scaling as S
from repro.precision import validate
from repro.precision.gemm import (ACTIVATIONS, _check_2d_weight, _epilogue, _epilogue_grad,
                                  _flatten_lhs, _token)

__all__ = ["INT8_MAX", "int8_scale", "int8_quantize", "int8_dequantize", "int8_dot",
           "int8_dense", "layer_recipe", "is_emulated"]

INT8_MAX = 127.0

_DN_FWD = (((1,), (0,)), ((), ()))  # xq[M,K] . wq[K,N] -> [M,N]
_DN_DGRAD = (((1,), (1,)), ((), ()))  # gq[M,N] . wq[K,N] -> [M,K]
_DN_WGRAD = (((0,), (0,)), ((), ()))  # xq[M,K] . gq[M,N] -> [K,N]


# ------------------------------------------------------------------------------ format


def int8_scale(amax, margin: int = 0):
    """Dequantize scale(s) ``amax / 127 * 2**margin`` (float32, elementwise: a per-channel
    amax gives per-channel scales); 1.0 where the amax is 0 or not finite."""
    return F.compute_scale(amax, INT8_MAX, margin)


def int8_quantize(x, scale):
    """``clip(round_half_even(x * (1 / scale)), -127, 127)`` as ``int8``; NaN -> 0 (see the
    module docstring). ``scale`` broadcasts against ``x`` (a scalar, or a per-column vector
    for a 2-D ``x``); a concrete scale must be positive and finite."""
    validate.scale(scale, "int8_quantize")
    dt = x.dtype if hasattr(x, "dtype") else jnp.asarray(x).dtype
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"int8_quantize: input must be floating, got dtype {dt}")
    inv = jnp.float32(1.0) / jnp.asarray(scale, jnp.float32)
    y = jnp.asarray(x).astype(jnp.float32) * inv
    y = jnp.clip(jnp.where(jnp.isnan(y), jnp.float32(0), y), -INT8_MAX, INT8_MAX)
    return jnp.round(y).astype(jnp.int8)


def int8_dequantize(q, scale, dtype=jnp.float32):
    """``q * scale`` in ``dtype`` (the product in float32)."""
    validate.out_dtype(dtype, "int8_dequantize")
    return (q.astype(jnp.float32) * jnp.asarray(scale, jnp.float32)).astype(dtype)


def _nan_flag(amax):
    """NaN where ``amax`` is NaN (the tensor held a NaN), else 1.0: a factor of the tensor's
    dequantize scale that carries its NaN into the product."""
    return jnp.where(jnp.isnan(amax), jnp.float32(jnp.nan), jnp.float32(1.0))


def _per_tensor(x, margin):
    """``(q, scale, flag)`` of ``x`` with one scale; ``flag`` (:func:`_nan_flag`) is NaN where
    ``x`` held a NaN: the product's scale is ``scale * flag``."""
    a = S.amax(x)
    s = int8_scale(a, margin)
    return int8_quantize(x, s), s, _nan_flag(a)


def _weight(w, recipe):
    """The weight's ``(q, scale, flag)``: one scale per output channel (a ``[N]`` vector) or
    per tensor (``recipe.int8_weight_scale``); ``flag`` NaN where ``w`` held a NaN."""
    if recipe.int8_weight_scale == "tensor":
        return _per_tensor(w, recipe.margin)
    a = jnp.max(jnp.abs(w.astype(jnp.float32)), axis=0)  # [N]; NaN propagates
    s = int8_scale(a, recipe.margin)
    return int8_quantize(w, s[None, :]), s, _nan_flag(jnp.max(a))


def _igemm(a, b, dn):
    return lax.dot_general(a, b, dn, preferred_element_type=jnp.int32)


def _rescale(acc, scale, dtype):
    """``acc`` (INT32) as float32 times ``scale`` (float32, broadcast), cast to ``dtype``."""
    return (acc.astype(jnp.float32) * scale).astype(dtype)


# ------------------------------------------------------------------------------ the ops


def _fwd(x, w, b, recipe, act):
    xq, sx, fx = _per_tensor(x, recipe.margin)
    wq, sw, fw = _weight(w, recipe)
    acc = _igemm(xq, wq, _DN_FWD)
    y, act_res = _epilogue(_rescale(acc, (sx * fx) * (sw * fw), recipe.dtype), b, act)
    bt = None if b is None else _token(b)
    return y, (xq, sx * fx, wq, sw, fw, act_res, _token(x), _token(w), bt)


def _bwd(recipe, act, res, g):
    xq, sx, wq, sw, fw, act_res, xt, wt, bt = res
    g = _epilogue_grad(g, act_res, act, g.shape[-1])
    gq, sg, fg = _per_tensor(g, recipe.margin)
    dw = _rescale(_igemm(xq, gq, _DN_WGRAD), sx * (sg * fg), wt.dtype)
    if recipe.int8_weight_scale == "tensor":  # the weight gradient's copy of g serves too
        dx = _rescale(_igemm(gq, wq, _DN_DGRAD), (sg * fg) * (sw * fw), xt.dtype)
    else:  # the weight's column scales moved onto g (exact), then g quantized per tensor
        g1q, sg1, fg1 = _per_tensor(g.astype(jnp.float32) * sw[None, :], recipe.margin)
        dx = _rescale(_igemm(g1q, wq, _DN_DGRAD), (sg1 * fg1) * fw, xt.dtype)
    db = None if bt is None else jnp.sum(g.astype(jnp.float32), axis=0).astype(bt.dtype)
    return dx, dw, db


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _core(x, w, b, recipe, act):
    return _fwd(x, w, b, recipe, act)[0]


_core.defvjp(_fwd, _bwd)


def _dense(x, w, b, recipe, activation, what):
    recipe = validate.recipe_for(recipe, ("int8",), what)
    if recipe.scaling != "current":
        raise ValueError(f"{what}: recipe {recipe.name!r} has scaling={recipe.scaling!r}; INT8 "
                         "scaling is 'current' (each tensor's amax now)")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{what}: activation must be one of {list(ACTIVATIONS)}, "
                         f"got {activation!r}")
    w = _check_2d_weight(w, what)
    x2 = _flatten_lhs(x, w, what)
    if b is not None and jnp.shape(b) != (w.shape[1],):
        raise ValueError(f"{what}: bias shape {jnp.shape(b)} does not match the "
                         f"{w.shape[1]} outputs of w {w.shape}")
    y = _core(x2, w, b, recipe, activation)
    return y.reshape(*x.shape[:-1], w.shape[1])


def int8_dot(x, w, recipe):
    """``x[..., K] @ w[K, N] -> [..., N]`` in ``recipe.dtype``, all three GEMMs in INT8 (see
    the module docstring). ``recipe``: an INT8 recipe of this repository (``gemm="int8"``).
    Gradients come back in x's and w's dtypes."""
    return _dense(x, w, None, recipe, None, "int8_dot")


def int8_dense(x, w, b, recipe, activation: str | None = None):
    """``activation(x[..., K] @ w[K, N] + b[N])`` with all three GEMMs in INT8, bias and
    activation inside the ``custom_vjp`` (what the backward pass keeps: the INT8 input and
    weight, their scales, a 1-bit ReLU mask or the tanh output). ``b`` may be None;
    ``activation`` one of None, "relu", "tanh"."""
    return _dense(x, w, b, recipe, activation, "int8_dense")


# ------------------------------------------------------------------------ policy, labels


def layer_recipe(recipe, kernel_shape):
    """The recipe a layer of weight ``kernel_shape`` [K, N] runs under for an INT8 recipe: the
    recipe itself, or, for a per-layer policy (``int8_min_dim > 0``: ``int8-auto``), a dense
    GEMM in the compute dtype where K or N is below ``int8_min_dim`` or where the device code
    paths are chosen for has no INT8 matrix arithmetic that beats its BF16
    (:func:`repro.hardware.int8_pays`). Depends on the weight and the device alone, so ``init``
    and ``apply`` agree."""
    from repro import hardware

    if recipe.gemm == "int8" and recipe.int8_min_dim > 0 and (
            min(kernel_shape) < recipe.int8_min_dim or not hardware.int8_pays()):
        return recipe.replace(name=f"{recipe.name}/dense", gemm="dense", scaling="none")
    return recipe


def is_emulated(hardware) -> bool:
    """Whether INT8 GEMMs have no matrix-unit support on ``hardware`` (a CPU; GPUs of compute
    capability >= 7.5 and TPUs with an INT8 rate in the registry have it)."""
    return not hardware.has_int8
