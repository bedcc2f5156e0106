"""One-pass FP8 quantization of a GEMM operand: mask, cast, transpose, amax and column sums.

cuBLASLt's FP8 GEMMs on Hopper want the contraction dimension minor in both operands, so the
weight-gradient GEMM ``dw = x^T g`` needs transposed FP8 copies of the layer input ``x`` and of
the output gradient ``g``. XLA makes them with separate passes: the cast (with the amax
reduction of delayed scaling), a transpose of the FP8 copy, and for ``g`` the ReLU mask and the
bias gradient's column sums. :func:`cast_transpose` reads each tile of the source once and
writes all of them (Transformer Engine's cast-transpose-dbias), or a part of them: ``parts="t"``
(``q^T``, amax, sums) and ``parts="q"`` (``q`` alone) let the backward pass quantize the output
gradient in two passes, the second after the weight-gradient GEMM has consumed ``q^T``, so
that the source, ``q`` and ``q^T`` are never alive together.

On a GPU, for shapes that are multiples of :data:`BLOCK`, it is a Pallas kernel (Triton
backend); elsewhere :func:`cast_transpose_reference`, the same in plain JAX. The two are equal
bit for bit except the column sums, which add in another order (FP32): tested in interpret mode
on the CPU (``tests/test_fp8_fused.py``) and on the GPU by the benchmarks' checks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from repro import hardware

BLOCK = (64, 128)  # rows, columns of one tile


def _unpack(mask, n):
    """Packed bits along the last axis (``jnp.packbits``) -> bool, last axis ``n``."""
    return jnp.unpackbits(mask, axis=-1, count=n).astype(bool)


PARTS = ("qt", "q", "t")


def _check_parts(parts):
    if parts not in PARTS:
        raise ValueError(f"cast_transpose: parts must be one of {PARTS}, got {parts!r}")


def cast_transpose_reference(x, dtype, scale, mask=None, parts="qt"):
    """``(q, q^T, amax, column sums)`` of ``x[M, N]``: ``q`` the saturating cast of
    ``x / scale`` to ``dtype``; ``mask`` (bits packed along N, ``jnp.packbits``) zeroes
    elements first (the ReLU gradient). amax and sums in FP32. ``parts``: "qt" all four;
    "t" no ``q`` (None in its place); "q" ``q`` alone (the other three None)."""
    _check_parts(parts)
    xf = x.astype(jnp.float32)
    if mask is not None:
        xf = jnp.where(_unpack(mask, x.shape[-1]), xf, 0.0)
    fmax = float(jnp.finfo(dtype).max)
    q = jnp.clip(xf * (jnp.float32(1.0) / scale), -fmax, fmax).astype(dtype)
    if parts == "q":
        return q, None, None, None
    return (q if parts == "qt" else None), q.T, jnp.max(jnp.abs(xf)), jnp.sum(xf, axis=0)


def _kernel(*refs, dtype, fmax, masked, parts):
    refs = list(refs)
    x_ref = refs.pop(0)
    m_ref = refs.pop(0) if masked else None
    inv_ref = refs.pop(0)
    q_ref = refs.pop(0) if "q" in parts else None
    qt_ref, amax_ref, sum_ref = refs if "t" in parts else (None, None, None)
    x = x_ref[...].astype(jnp.float32)
    if masked:
        bm, bn = x.shape
        packed = m_ref[...].astype(jnp.int32)                      # [bm, bn // 8]
        wide = jnp.broadcast_to(packed[:, :, None], (bm, bn // 8, 8)).reshape(bm, bn)
        shift = 7 - jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 1) % 8  # packbits: MSB first
        x = jnp.where(((wide >> shift) & 1) == 1, x, 0.0)
    q = jnp.clip(x * inv_ref[0], -fmax, fmax).astype(dtype)
    if q_ref is not None:
        q_ref[...] = q
    if qt_ref is not None:
        qt_ref[...] = q.T
        amax_ref[...] = jnp.max(jnp.abs(x), axis=0, keepdims=True)
        sum_ref[...] = jnp.sum(x, axis=0, keepdims=True)


@functools.partial(jax.jit, static_argnames=("dtype", "parts", "interpret"))
def cast_transpose_pallas(x, dtype, scale, mask=None, parts="qt", interpret: bool = False):
    """:func:`cast_transpose_reference` as one Pallas kernel (shape: a multiple of BLOCK)."""
    from jax.experimental import pallas as pl

    _check_parts(parts)
    m, n = x.shape
    bm, bn = BLOCK
    if m % bm or n % bn:
        raise ValueError(f"cast_transpose: shape {x.shape} is not a multiple of {BLOCK}")
    dtype = jnp.dtype(dtype)
    grid = (m // bm, n // bn)
    inv = (jnp.float32(1.0) / jnp.asarray(scale, jnp.float32)).reshape(1)
    tile = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    ins, args = [tile], [x]
    if mask is not None:
        ins.append(pl.BlockSpec((bm, bn // 8), lambda i, j: (i, j)))
        args.append(mask)
    ins.append(pl.BlockSpec((1,), lambda i, j: (0,)))
    kernel = functools.partial(_kernel, dtype=dtype, fmax=float(jnp.finfo(dtype).max),
                               masked=mask is not None, parts=parts)
    specs, shapes = [], []
    if "q" in parts:
        specs.append(tile)
        shapes.append(jax.ShapeDtypeStruct((m, n), dtype))
    if "t" in parts:
        row = pl.BlockSpec((1, bn), lambda i, j: (i, j))
        specs += [pl.BlockSpec((bn, bm), lambda i, j: (j, i)), row, row]
        shapes += [jax.ShapeDtypeStruct((n, m), dtype),
                   jax.ShapeDtypeStruct((grid[0], n), jnp.float32),
                   jax.ShapeDtypeStruct((grid[0], n), jnp.float32)]
    out = list(pl.pallas_call(kernel, grid=grid, interpret=interpret, in_specs=ins,
                              out_specs=specs, out_shape=shapes)(*args, inv))
    if parts == "q":
        return out[0], None, None, None
    q = out.pop(0) if parts == "qt" else None
    qt, amax, sums = out
    return q, qt, jnp.max(amax), jnp.sum(sums, axis=0)


def fits(shape) -> bool:
    """Whether the Pallas kernel runs here for an operand of ``shape``: on a GPU, 2-D, a
    multiple of :data:`BLOCK`."""
    return (hardware.platform() == "gpu" and len(shape) == 2
            and shape[0] % BLOCK[0] == 0 and shape[1] % BLOCK[1] == 0)


def cast_transpose(x, dtype, scale, mask=None, parts="qt"):
    """The Pallas kernel where it runs (:func:`fits`), else the plain-JAX reference."""
    if fits(x.shape):
        return cast_transpose_pallas(x, dtype, scale, mask, parts)
    return cast_transpose_reference(x, dtype, scale, mask, parts)
