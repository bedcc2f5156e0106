"""The weight-only GEMM without a dequantized weight: ``y = (x @ q) * scale``.

A weight-only format (``fp8-w``, ``int8-w`` of :mod:`repro.precision.export`) stores ``q[K, N]``
in one byte per weight (E4M3 or INT8) and ``scale[N]``, one per output channel. Dequantizing
first, ``x @ (q * scale)``, is what qwix does, and on the GPU XLA runs it as a separate kernel
that reads the byte, writes a BF16 weight and has the GEMM read that again: at decode (a few
rows of ``x``, the weights read once per token) 5 bytes move per weight instead of BF16's 2.

Here the scale is applied AFTER the product, ``y[m, n] = scale[n] * sum_k x[m, k] q[k, n]``.
That is exact for a scale per output channel (column ``n`` of the weight has the one factor
``scale[n]``, which leaves the sum over ``k``), and more accurate than dequantizing first:
every E4M3 and INT8 value is exact in BF16, so the GEMM multiplies the stored values
themselves instead of their products with the scale rounded to BF16. The forms, all for
2-D ``q[K, N]`` contracted along its first axis (or, with ``transposed=True``, ``q[N, K]``
stored with the contraction axis minor: the layout cuBLASLt's GEMMs read without a transpose
and a row reduction streams) with ``scale`` of shape ``[N]`` or ``[1, N]``:

* ``"xla"`` (:func:`dot_xla`): ``dot(x, convert(q))`` then the scale, for XLA to fuse: its
  GPU compiler's GEMM fusion can put the convert into a Triton GEMM that loads the 1-byte
  weight tile and widens it in registers. Whether it did is for the compiled program to say
  (``repro.studies.lowering.dequant_lowering_gpu``).
* ``"reduce"`` (:func:`dot_reduce`): for one row (:func:`dot` uses it for no more), the
  product as a multiply and a sum over the contraction, ``sum_k x[m, k] * convert(q[k, n])`` in FP32, with no GEMM at
  all: XLA fuses the convert and the multiply into one reduction kernel that streams the
  1-byte weight once, the way a GEMV is written for memory-bound decode.
* ``"pallas"`` (:func:`dot_pallas`): a Pallas kernel (Triton backend) that does that
  explicitly: a grid over blocks of rows and output columns, a loop over blocks of the
  contraction in each program: load the 1-byte weight tile, convert it to BF16 in
  registers, accumulate ``x_tile @ w_tile`` in FP32, multiply by the column scales once at
  the end. Rows are padded to a multiple of 16 (the tensor cores' smallest tile). With
  ``splits`` > 1 the contraction is split over that many programs too (split-K: wide
  column blocks for coalesced loads and still enough programs to fill the GPU), whose FP32
  partial products are summed after the kernel (:func:`dot` does not split; the probe
  ``scripts/probe_dequant_gemm.py`` compares it with the other forms). On a CPU it runs in
  Pallas' interpret mode (tests) or not at all (:func:`dot` falls back to "xla").
* ``"gemv"`` (:func:`dot_gemv`): for one row and ``q`` stored transposed, a Pallas (Triton)
  matrix-vector kernel without tensor cores: each program streams ``block_n`` rows of
  ``q[N, K]`` in contiguous pieces of ``block_k`` bytes, multiplies them by ``x`` in FP32
  lane by lane and sums once at the end (split-K over ``splits`` programs, their partial
  sums added after the kernel). How fast it is depends on the tiling, and for INT8 on how
  the bytes are widened to FP32 (:func:`widen`), far more than the GEMM's does, so
  :func:`dot` runs it only with the tiling and widening measured best for the device and
  the weight's shape (:data:`GEMV_TILES`), and :func:`dot_reduce` wherever the table has
  no entry or names the reduction as faster (another device, another shape, the CPU).

With many rows (prefill) the product is compute-bound and the scale on the output costs a
pass over the output instead of one over the weights: :func:`dot` keeps qwix's form,
dequantize then multiply, when ``rows > K / 2`` (see :func:`scale_on_output`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from repro import hardware

IMPLS = ("xla", "reduce", "pallas", "gemv")
# "reduce" for one row only: with more, the reduction reads the weight once per row (at 8
# rows several times slower than the GEMM of dot_xla, which "reduce" uses there)
REDUCE_MAX_ROWS = 1
ROW_TILE = 16  # rows of x are padded to a multiple of this for the Pallas kernel
PALLAS_MAX_ROWS = 256  # above this many rows the Pallas kernel is not used (compute-bound)



class Gemv(NamedTuple):
    """One tiling of :func:`dot_gemv` and how it widens INT8 (:func:`widen`; E4M3 ignores
    it)."""
    block_n: int
    block_k: int
    num_warps: int
    splits: int
    widen: str = "convert"


# The GEMV's tiling per device and weight, the way vLLM ships its Triton kernels' configs:
# {device_kind: {(q dtype, K, N): Gemv, or None where dot_reduce was faster}}, K and N of the
# [K, N] weight (stored [N, K]). Each entry is the fastest of a sweep at one row, beside
# dot_reduce, in one process on the device:
#     python3 scripts/probe_dequant_gemm.py --batches 1 --gemv-sweep --write-tiles FILE
# A shape missing here takes dot_reduce.
# The H200's, from sweeps at d_model 4096 and 8192: E4M3 over 24 tilings per weight, INT8
# over 30 tilings (4 and 8 warps, 128 and 256 bytes) with each integer widening.
_H200_FP8 = {(4096, 12288): (32, 256, 8, 1), (4096, 4096): (32, 256, 8, 4),
             (4096, 22016): None, (11008, 4096): (8, 256, 8, 1),
             (8192, 24576): (32, 256, 8, 2), (8192, 8192): (32, 256, 8, 2),
             (8192, 57344): (32, 256, 8, 2), (28672, 8192): (32, 256, 8, 2)}
_H200_INT8 = {(4096, 12288): (32, 256, 8, 1, "magic"), (4096, 4096): None,
              (4096, 22016): None, (11008, 4096): (8, 256, 8, 1, "prmt"),
              (8192, 24576): (64, 256, 8, 2, "prmt"), (8192, 8192): (64, 256, 8, 2, "prmt"),
              (8192, 57344): (16, 256, 4, 1, "prmt"), (28672, 8192): (64, 256, 8, 2, "prmt")}
GEMV_TILES: dict[str, dict[tuple[str, int, int], Gemv | None]] = {
    "NVIDIA H200": {
        **{("float8_e4m3fn", k, n): t and Gemv(*t) for (k, n), t in _H200_FP8.items()},
        **{("int8", k, n): t and Gemv(*t) for (k, n), t in _H200_INT8.items()}},
}
WIDENINGS = ("convert", "magic", "prmt")
# 1.5 * 2**23 as FP32 bits: adding an integer v (|v| < 2**22) to them gives 1.5 * 2**23 + v
INT_TO_F32_BITS, INT_TO_F32_BIAS = 0x4B400000, 12582912.0
# 2**23 as FP32 bits: OR-ing a byte u into them gives 2**23 + u; INT8 q is u = q XOR 0x80
BYTE_TO_F32_BITS, BYTE_TO_F32_BIAS = 0x4B000000, 8388736.0  # 2**23 + 128
# "prmt" in PTX, four bytes of one 32-bit register at a time: flip each byte's sign bit,
# place byte i under 0x4B0000 (PRMT's selector 0x754i), subtract 2**23 + 128
_PRMT_ASM = """{
.reg .b32 t;
xor.b32 t, $4, 0x80808080;
prmt.b32 $0, t, 0x4B000000, 0x7540;
prmt.b32 $1, t, 0x4B000000, 0x7541;
prmt.b32 $2, t, 0x4B000000, 0x7542;
prmt.b32 $3, t, 0x4B000000, 0x7543;
sub.f32 $0, $0, 0f4B000080;
sub.f32 $1, $1, 0f4B000080;
sub.f32 $2, $2, 0f4B000080;
sub.f32 $3, $3, 0f4B000080;
}"""


def widen(q, how: str = "convert", asm: bool = False):
    """The 1-byte values ``q`` as FP32, exactly. E4M3 always by a convert (Hopper widens it
    in hardware); INT8 by ``how``:

    * "convert": the int-to-float convert. On NVIDIA GPUs it runs at a quarter of the 32-bit
      integer add's rate (16 against 64 per clock and SM on compute capability 9.0, the CUDA
      C++ Programming Guide's throughput table), and a GEMV that widens every weight it
      streams can be bound by it;
    * "magic": ``bitcast_f32(int32(q) + 0x4B400000) - 1.5 * 2**23``, a magic-number
      conversion (a sign extension, an add, a subtract);
    * "prmt": ``bitcast_f32((q XOR 0x80) | 0x4B000000) - (2**23 + 128)``; with ``asm`` (inside
      a Pallas kernel on an NVIDIA GPU only) as inline PTX that widens four bytes with one XOR
      and four byte permutes (PRMT): the conversion of biased bytes to FP32 that
      FasterTransformer's weight-only GEMMs use for BF16 (their CUTLASS extension
      ``interleaved_numeric_conversion.h``).

    Which is fastest depends on the kernel and the weight's shape (measured per weight,
    :data:`GEMV_TILES`: on the H200 the GEMV with "prmt" at all four of d_model 8192's
    weights, 1.52-1.62x BF16's product, 1.58x per layer against the reduction's 1.43x); XLA's
    fused reduction (:func:`dot_reduce`) is fastest with the convert
    (``scripts/probe_int8_widen.py``)."""
    if jnp.dtype(q.dtype) != jnp.int8 or how == "convert":
        return q.astype(jnp.float32)
    if how == "magic":
        bits = q.astype(jnp.int32) + INT_TO_F32_BITS
        return lax.bitcast_convert_type(bits, jnp.float32) - INT_TO_F32_BIAS
    if how != "prmt":
        raise ValueError(f"dequant_gemm.widen: how must be one of {WIDENINGS}, got {how!r}")
    if asm:
        (out,) = plgpu.elementwise_inline_asm(
            _PRMT_ASM, args=[q], constraints="=r,=r,=r,=r,r", pack=4,
            result_shape_dtypes=[jax.ShapeDtypeStruct(q.shape, jnp.float32)])
        return out
    u = lax.bitcast_convert_type(q, jnp.uint8) ^ jnp.uint8(0x80)
    bits = u.astype(jnp.uint32) | jnp.uint32(BYTE_TO_F32_BITS)
    return lax.bitcast_convert_type(bits, jnp.float32) - BYTE_TO_F32_BIAS


def _check(x, q, scale, what, transposed=False):
    """``(K, N)`` of a valid product (one-line ValueError otherwise)."""
    if q.ndim != 2:
        raise ValueError(f"{what}: q must be 2-D [K, N] (or [N, K] transposed), got shape "
                         f"{q.shape}")
    n, k = q.shape if transposed else q.shape[::-1]
    if x.shape[-1] != k:
        raise ValueError(f"{what}: x {x.shape} does not contract with q {q.shape}")
    if math.prod(scale.shape) != n or (scale.ndim == 2 and scale.shape[0] != 1):
        raise ValueError(f"{what}: scale {scale.shape} is not one per output column of "
                         f"q {q.shape}")
    if jnp.dtype(q.dtype).itemsize != 1:
        raise ValueError(f"{what}: q must hold 1-byte values (int8 or float8), got {q.dtype}")
    return k, n


def scale_on_output(rows: int, k: int) -> bool:
    """Whether the scale goes after the product for ``rows`` rows of ``x`` and a contraction
    of ``k``: yes unless ``rows > k / 2``. If XLA does not fuse the column scale into the
    GEMM, scaling the output costs about 6 bytes per output element (write, read, write
    BF16), dequantizing first 3 per weight (read 1, write 2): over ``N`` columns
    ``6 * rows * N`` against ``3 * k * N``."""
    return 2 * rows <= k


def reference(x, q, scale, transposed=False):
    """qwix's order: the weight dequantized to ``x``'s dtype first, then the product."""
    w = (q.T if transposed else q).astype(x.dtype) * scale.reshape(1, -1).astype(x.dtype)
    return lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def dot_xla(x, q, scale, transposed=False):
    """``(x[..., K] @ q[K, N]) * scale[N]`` as a BF16 x BF16 product of ``x`` and
    ``convert(q)`` accumulated and scaled in FP32, the result in ``x``'s dtype."""
    k, n = _check(x, q, scale, "dot_xla", transposed)
    x2 = x.reshape(-1, k)
    acc = lax.dot_general(x2, q.astype(x.dtype), (((1,), (1 if transposed else 0,)), ((), ())),
                          preferred_element_type=jnp.float32)
    y = (acc * scale.reshape(1, n).astype(jnp.float32)).astype(x.dtype)
    return y.reshape(*x.shape[:-1], n)


def dot_reduce(x, q, scale, transposed=False):
    """:func:`dot_xla` as a multiply and a sum over the contraction in FP32 (no GEMM): for
    one row or a few of ``x`` (decode), where the product is a matrix-vector product that
    streams the weight once (a row reduction when ``q`` is stored transposed)."""
    k, n = _check(x, q, scale, "dot_reduce", transposed)
    x2 = x.reshape(-1, k).astype(jnp.float32)
    if transposed:
        acc = jnp.sum(x2[:, None, :] * widen(q)[None], axis=2)
    else:
        acc = jnp.sum(x2[:, :, None] * widen(q)[None], axis=1)
    y = (acc * scale.reshape(1, n).astype(jnp.float32)).astype(x.dtype)
    return y.reshape(*x.shape[:-1], n)


def _largest_block(dim: int, cap: int) -> int | None:
    """The largest power of two in [16, cap] dividing ``dim`` (None if there is none)."""
    b = cap
    while b >= 16:
        if dim % b == 0:
            return b
        b //= 2
    return None


def blocks(rows: int, k: int, n: int, block_n: int | None = None,
           block_k: int | None = None) -> tuple[int, int, int] | None:
    """``(block_m, block_n, block_k)`` of the Pallas kernel for a ``[rows, k] x [k, n]``
    product, or None where it does not fit (``k`` or ``n`` not a multiple of 16; Triton
    tiles are powers of two). Defaults: 16 to 64 rows a block; 32 columns for a few rows
    (decode: many programs, each streaming its columns' weights), 128 for more; 256 along
    the contraction for a few rows, 64 for more."""
    few = rows <= ROW_TILE
    bm = min(64, max(ROW_TILE, 1 << (max(rows, 1) - 1).bit_length()))
    bn = _largest_block(n, block_n or (32 if few else 128))
    bk = _largest_block(k, block_k or (256 if few else 64))
    if bn is None or bk is None:
        return None
    return bm, bn, bk


def _kernel(x_ref, q_ref, s_ref, o_ref, *, block_k: int, steps: int):
    bm, bn = o_ref.shape

    def body(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        x = x_ref[:, pl.ds(k0, block_k)]
        w = q_ref[pl.ds(k0, block_k), :].astype(x.dtype)  # 1 byte loaded, widened here
        return acc + jnp.dot(x, w, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, steps, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = (acc * s_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("interpret", "block_n", "block_k",
                                             "num_warps", "num_stages", "splits"))
def dot_pallas(x, q, scale, *, interpret: bool = False, block_n: int | None = None,
               block_k: int | None = None, num_warps: int | None = None,
               num_stages: int | None = None, splits: int = 1):
    """:func:`dot_xla` as one Pallas kernel (see the module docstring). ``block_n`` /
    ``block_k``: caps on the tile sizes (powers of two, default :func:`blocks`);
    ``num_warps``, ``num_stages``: Triton's (default 4 and 3); ``splits``: programs along
    the contraction (split-K; ``K / splits`` must be a power of two and a multiple of the
    contraction block). ``interpret``: Pallas' interpreter (CPU)."""
    k, n = _check(x, q, scale, "dot_pallas")
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if splits < 1 or (splits > 1 and (k % splits or (k // splits) & (k // splits - 1))):
        raise ValueError(f"dot_pallas: K={k} does not split into {splits} power-of-two parts")
    b = blocks(m, k // splits, n, block_n, block_k)
    if b is None:
        raise ValueError(f"dot_pallas: q {q.shape} is not a multiple of 16 along both axes")
    bm, bn, bk = b
    kc = k // splits
    mp = -(-m // bm) * bm
    if mp != m:
        x2 = jnp.pad(x2, ((0, mp - m), (0, 0)))
    params = {}
    if not interpret and (num_warps or num_stages):
        params["compiler_params"] = plgpu.CompilerParams(num_warps=num_warps,
                                                         num_stages=num_stages)
    # split-K: FP32 partial products (each already times the column scales), summed below
    part = splits > 1
    y = pl.pallas_call(
        functools.partial(_kernel, block_k=bk, steps=kc // bk),
        grid=(mp // bm, n // bn, splits),
        in_specs=[pl.BlockSpec((bm, kc), lambda i, j, s: (i, s)),
                  pl.BlockSpec((kc, bn), lambda i, j, s: (s, j)),
                  pl.BlockSpec((1, bn), lambda i, j, s: (0, j))],
        out_specs=pl.BlockSpec((pl.squeezed, bm, bn), lambda i, j, s: (s, i, j)),
        out_shape=jax.ShapeDtypeStruct((splits, mp, n), jnp.float32 if part else x.dtype),
        interpret=interpret, **params,
    )(x2, q, scale.reshape(1, n))
    y = jnp.sum(y, axis=0).astype(x.dtype) if part else y[0]
    return y[:m].reshape(*x.shape[:-1], n)


def _gemv_kernel(x_ref, q_ref, s_ref, o_ref, *, block_k: int, steps: int, how: str,
                 asm: bool):
    bn = q_ref.shape[0]

    def body(i, acc):
        k0 = pl.multiple_of(i * block_k, block_k)
        x = x_ref[:, pl.ds(k0, block_k)].astype(jnp.float32)  # [1, block_k]
        w = widen(q_ref[:, pl.ds(k0, block_k)], how, asm)  # [block_n, block_k], 1 byte read
        return acc + w * x

    acc = lax.fori_loop(0, steps, body, jnp.zeros((bn, block_k), jnp.float32))
    o_ref[...] = (jnp.sum(acc, axis=1)[None, :] * s_ref[...].astype(jnp.float32)
                  ).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("interpret", "block_n", "block_k", "num_warps",
                                             "splits", "widen"))
def dot_gemv(x, qt, scale, *, block_n: int = 16, block_k: int = 256, num_warps: int = 4,
             splits: int = 1, widen: str = "convert", interpret: bool = False):
    """:func:`dot_xla` for ``qt[N, K]`` (stored transposed) as the Pallas GEMV of the module
    docstring, one program grid over the rows of ``x`` (meant for one). ``block_n``: rows
    of ``qt`` per program (a power of two dividing N); ``block_k``: bytes per load, at most
    that (the largest power of two of 16 or more dividing ``K / splits``); ``splits``:
    programs along the contraction; ``widen``: how INT8 is widened (:func:`widen`; "prmt"
    runs as PTX on the GPU, its integer form in the interpreter); ``interpret``: Pallas'
    interpreter (CPU)."""
    k, n = _check(x, qt, scale, "dot_gemv", transposed=True)
    if widen not in WIDENINGS:
        raise ValueError(f"dot_gemv: widen must be one of {WIDENINGS}, got {widen!r}")
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if splits < 1 or k % splits:
        raise ValueError(f"dot_gemv: K={k} does not split into {splits} equal parts")
    kc = k // splits
    bk = _largest_block(kc, block_k)
    if bk is None or block_n < 1 or block_n & (block_n - 1) or n % block_n:
        raise ValueError(f"dot_gemv: q {qt.shape} does not tile into {block_n} rows and "
                         f"blocks of 16 or more of K / {splits}")
    params = {} if interpret else {
        "compiler_params": plgpu.CompilerParams(num_warps=num_warps)}
    part = splits > 1  # FP32 partial sums (each times the column scales), added below
    y = pl.pallas_call(
        functools.partial(_gemv_kernel, block_k=bk, steps=kc // bk, how=widen,
                          asm=not interpret),
        grid=(m, n // block_n, splits),
        in_specs=[pl.BlockSpec((1, kc), lambda r, j, s: (r, s)),
                  pl.BlockSpec((block_n, kc), lambda r, j, s: (j, s)),
                  pl.BlockSpec((1, block_n), lambda r, j, s: (0, j))],
        out_specs=pl.BlockSpec((pl.squeezed, 1, block_n), lambda r, j, s: (s, r, j)),
        out_shape=jax.ShapeDtypeStruct((splits, m, n), jnp.float32 if part else x.dtype),
        interpret=interpret, **params,
    )(x2, qt, scale.reshape(1, n))
    y = jnp.sum(y, axis=0).astype(x.dtype) if part else y[0]
    return y.reshape(*x.shape[:-1], n)


def gemv_tiles(k: int, n: int, dtype) -> Gemv | None:
    """The GEMV's tiling and widening (:class:`Gemv`) for a ``[K, N]`` weight of
    ``dtype`` on this process' default device (:data:`GEMV_TILES`), or None: no GEMV there."""
    if hardware.platform() != "gpu":
        return None
    table = GEMV_TILES.get(hardware.device_kind(), {})
    return table.get((jnp.dtype(dtype).name, k, n))


def pallas_fits(rows: int, k: int, n: int) -> bool:
    """Whether :func:`dot` runs the Pallas kernel: on a GPU, at most
    :data:`PALLAS_MAX_ROWS` rows, ``k`` and ``n`` multiples of 16."""
    return (hardware.platform() == "gpu" and rows <= PALLAS_MAX_ROWS
            and blocks(rows, k, n) is not None)


def dot(x, q, scale, impl: str = "xla", transposed: bool = False):
    """``x[..., K] @ (q[K, N] * scale[N])`` in ``x``'s dtype: for rows where the scale goes
    after the product (:func:`scale_on_output`) without a dequantized weight (``impl``
    "xla": :func:`dot_xla`; "reduce": :func:`dot_reduce` for up to :data:`REDUCE_MAX_ROWS`
    rows, else :func:`dot_xla`; "pallas": :func:`dot_pallas` where it runs,
    :func:`pallas_fits`, for ``q[K, N]``, else :func:`dot_xla`; "gemv": for one row of a
    transposed ``q``, :func:`dot_gemv` with the tiling of :func:`gemv_tiles` where it has
    one, else :func:`dot_reduce`, and :func:`dot_xla` for more rows); otherwise qwix's order
    (:func:`reference`). ``transposed``: ``q`` is stored ``[N, K]``."""
    if impl not in IMPLS:
        raise ValueError(f"dequant_gemm: impl must be one of {IMPLS}, got {impl!r}")
    k, n = _check(x, q, scale, "dequant_gemm.dot", transposed)
    rows = math.prod(x.shape[:-1])
    if not scale_on_output(rows, k):
        return reference(x, q, scale, transposed)
    if impl == "pallas" and not transposed and pallas_fits(rows, k, n):
        return dot_pallas(x, q, scale)
    if impl == "gemv" and transposed and rows <= REDUCE_MAX_ROWS:
        tiles = gemv_tiles(k, n, q.dtype)
        if tiles is not None:
            return dot_gemv(x, q, scale, **Gemv(*tiles)._asdict())
        return dot_reduce(x, q, scale, transposed)
    if impl in ("reduce", "gemv") and rows <= REDUCE_MAX_ROWS:
        return dot_reduce(x, q, scale, transposed)
    return dot_xla(x, q, scale, transposed)
