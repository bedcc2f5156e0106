"""Block-scaled GEMMs: MXFP8 (:func:`mxfp8_dot`), NVFP4 (:func:`nvfp4_dot`) and DeepSeek-V3's
block FP8 (:func:`fp8block_dot`), all three GEMMs of a layer each. The "native" backend
(compute capability >= 10: :func:`block_scaled_backend`) runs ``jax.nn.scaled_matmul`` on the
quantized elements and block scales; the "emulated" backend the same quantized values
dequantized to BF16 (exact) and an ordinary dot with FP32 accumulation
(:mod:`repro.precision.ops` says more).
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

from repro.precision import blockfp8 as B
from repro.precision import formats as F
from repro.precision import validate
from repro.precision.gemm import _DN_TN, _check_2d_weight, _flatten_lhs, _pad_axis, _token


def block_scaled_backend(hardware=None) -> Literal["native", "emulated"]:
    """"native" where block-scaled FP4/MXFP8 tensor cores exist (compute capability >= 10)."""
    if hardware is None:
        from repro.hardware import current

        hardware = current()
    return "native" if hardware.has_fp4 else "emulated"


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
