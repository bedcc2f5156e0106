"""Block-scaled FP8 (DeepSeek-V3; NeMo RL's FP8 rollouts): E4M3 elements with one FP32
dequantize scale per 1x128 block (activations and gradients) or 128x128 tile (weights).

Hopper has no block-scaled FP8 GEMM: products of these tensors are emulated (dequantize, then
the GEMM in a wider type), so they measure accuracy, never speed. The elementwise arithmetic
is :mod:`repro.precision.formats`' (the same E4M3 cast, saturation and scale floor).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from repro.precision import validate
from repro.precision.formats import E4M3, _check_floating, _straight_through, cast

BLOCKS = ((1, 128), (128, 128))


class BlockFP8Tensor(NamedTuple):
    q: jax.Array  # E4M3 elements, same shape as the input
    scale: jax.Array  # float32, [..., ceil(N/128)] (1x128) or [..., ceil(M/128), ceil(N/128)]
    block: Any  # (1, 128) or (128, 128); informational, dequantize infers it from shapes


def _tiles(x, block):
    """Zero-pad the blocked axes of ``x`` to multiples of 128 and reshape
    [..., M, N] -> [..., M'/br, br, N'/bc, bc] (1x128 blocks: a helper row axis, br = 1)."""
    br, bc = block
    x2 = x if br > 1 else x[..., None, :]
    m, n = x2.shape[-2:]
    pad = [(0, 0)] * (x2.ndim - 2) + [(0, -m % br), (0, -n % bc)]
    x2 = jnp.pad(x2, pad)
    mp, np_ = x2.shape[-2:]
    return x2.reshape(*x2.shape[:-2], mp // br, br, np_ // bc, bc)


def quantize(x, block=(1, 128)) -> BlockFP8Tensor:
    """DeepSeek-V3's block-scaled FP8 (as NeMo RL's FP8 rollouts): E4M3 elements, one FP32
    dequantize scale per block, ``scale = block_amax * fl32(1 / 448)``.

    ``block=(1, 128)``: 128 consecutive elements of the last axis (activations and gradients,
    per token); ``(128, 128)``: tiles of the last two axes (weights). Elements are
    ``e4m3_rne(clip(x * (1 / scale), -448, 448))``, the arithmetic of :func:`repro.precision.formats.fp8_quantize`
    with a per-block scale.

    Sizes not divisible by 128 are zero-padded up to whole blocks: an edge block's scale is
    the amax of the elements it really holds (zeros never raise an amax), the output has the
    input's shape and the scale ``ceil(size / 128)`` entries along each blocked axis.

    Edge cases. An all-zero block (or one whose scale would underflow FP32's normal range, as
    in :func:`repro.precision.formats.compute_scale`) gets scale 1.0. Amaxes ignore NaN and
    +-inf, so one bad value cannot change its neighbours' scale; +-inf saturates to +-448
    (times the block's scale) and NaN stays NaN (E4M3's NaN encoding).
    """
    _check_floating(x, "blockfp8.quantize")
    if not (isinstance(block, (tuple, list)) and tuple(block) in BLOCKS
            and all(validate._is_int(b) for b in block)):
        raise ValueError(f"blockfp8.quantize: block must be one of {BLOCKS} (ints), "
                         f"got {block!r}")
    block = tuple(int(b) for b in block)
    x = validate.operand(x, "blockfp8.quantize", min_ndim=2 if block[0] > 1 else 1)
    t = _tiles(x.astype(jnp.float32), block)  # [..., M'/br, br, N'/bc, bc]
    amax = jnp.max(jnp.where(jnp.isfinite(t), jnp.abs(t), 0.0), axis=(-3, -1), keepdims=True)
    # amax * fl(1/448): what XLA makes of amax / 448 (it rewrites a division by a constant),
    # written out so that every backend rounds the scale alike.
    scale = amax * jnp.float32(1.0 / 448.0)
    scale = jnp.where((amax > 0) & (scale >= jnp.finfo(jnp.float32).tiny), scale, 1.0)
    y = t * (jnp.float32(1.0) / scale)
    q = cast(jnp.clip(y, -448.0, 448.0), E4M3)  # clip turns +-inf into +-448; NaN stays
    q = q.reshape(*q.shape[:-4], q.shape[-4] * q.shape[-3], q.shape[-2] * q.shape[-1])
    q = q[..., : (x.shape[-2] if block[0] > 1 else 1), : x.shape[-1]].reshape(x.shape)
    scale = scale[..., 0, :, 0]  # [..., M'/br, N'/bc]
    if block[0] == 1:
        scale = scale[..., 0, :]
    return BlockFP8Tensor(q, scale, block)


def dequantize(t: BlockFP8Tensor, dtype=jnp.float32):
    """``q * scale`` with each scale broadcast over its (possibly partial) block."""
    validate.out_dtype(dtype, "blockfp8.dequantize")
    q, s = t.q, t.scale.astype(jnp.float32)
    tiles = q.ndim >= 2 and s.ndim == q.ndim and s.shape[-2] != q.shape[-2]  # 128x128
    want = (*q.shape[:-2], -(-q.shape[-2] // 128), -(-q.shape[-1] // 128)) if tiles else (
        *q.shape[:-1], -(-q.shape[-1] // 128))
    if s.shape != want:
        raise ValueError(f"blockfp8.dequantize: inconsistent shapes q{q.shape} "
                         f"scale{s.shape}")
    s = jnp.repeat(s, 128, axis=-1)[..., : q.shape[-1]]
    if tiles:
        s = jnp.repeat(s, 128, axis=-2)[..., : q.shape[-2], :]
    return (q.astype(jnp.float32) * s).astype(dtype)


def fake_quantize(x, block=(1, 128)):
    """Quantize then dequantize ``x`` (its dtype back); gradients pass straight through."""
    y = dequantize(quantize(x, block), jnp.float32)
    return _straight_through(x, jax.lax.stop_gradient(y.astype(jnp.asarray(x).dtype)))
