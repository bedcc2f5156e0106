"""Low-precision number formats: FP8 (E4M3/E5M2), MXFP8 and NVFP4, in pure JAX.

Convention used everywhere in this module: a *scale* is the DEQUANTIZE
multiplier, ``x ~= q * scale``. (Transformer Engine's ``scale`` is the
reciprocal, its ``scale_inv`` is ours.)

All functions are jit-able and keep no global state. Quantized tensors are
NamedTuples, hence pytrees; their metadata fields (``axis``, ``block``) are
informational only, because under ``jit`` they turn into arrays. The
dequantize functions therefore infer the block layout from array shapes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from repro.precision import validate

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
E2M1 = jnp.float4_e2m1fn
E8M0 = jnp.float8_e8m0fnu
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
E2M1_MAX = 6.0

NVFP4_BLOCKS = ((1, 16), (16, 16))


def _fmax(dtype) -> float:
    """Largest finite value of a low-precision float dtype."""
    return float(jnp.finfo(dtype).max)


def _check_floating(x, name: str):
    # Trace-time check: quantizing integers is always a caller bug.
    dt = x.dtype if hasattr(x, "dtype") else jnp.asarray(x).dtype
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"{name}: input must be floating, got dtype {dt}")


# ------------------------------------------------------------------- exact rounding


def round_to(x, dtype):
    """``x`` rounded to the nearest value of float ``dtype`` (ties to even), kept float32.

    Why not ``x.astype(dtype).astype(jnp.float32)``: XLA may drop such a round trip. With
    ``xla_allow_excess_precision`` (on by default) the GPU compiler runs
    ``SimplifyFPConversions``, which collapses any chain of float converts ``A -> B -> C`` into
    ``A -> C`` (openxla/xla#41605); a quantize-then-dequantize then silently skips the rounding,
    on the GPU only (the CPU keeps it). Rounding with ``lax.reduce_precision``, which XLA keeps,
    makes the value exactly representable first, so a later cast to ``dtype`` is exact and it
    no longer matters whether XLA keeps or drops it.

    ``reduce_precision`` flushes the format's subnormals and treats the top exponent as inf,
    so: normal values are rounded with one spare exponent bit, values below the smallest
    normal on the subnormal grid (spacing ``2**(minexp - nmant)``). Saturation is the caller's
    job (every quantizer here clips first); NaN stays NaN. Exact against ml_dtypes' casts for
    bfloat16, float16, E4M3, E5M2 and E2M1 (``tests/test_fold_converts.py``).
    """
    info = ml_dtypes.finfo(validate.float_dtype(dtype, "round_to"))
    x = jnp.asarray(x).astype(jnp.float32)
    if info.nexp >= 8:  # bfloat16: float32's exponent range, only the mantissa shrinks
        return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=int(info.nmant))
    normal = jax.lax.reduce_precision(x, exponent_bits=int(info.nexp) + 1,
                                      mantissa_bits=int(info.nmant))
    inv_ulp = np.float32(2.0 ** (int(info.nmant) - int(info.minexp)))  # 1 / subnormal spacing
    sub = jnp.round(x * inv_ulp) / inv_ulp  # exact: power-of-two scaling, |x * inv_ulp| < 2**nmant
    return jnp.where(jnp.abs(x) < np.float32(2.0 ** int(info.minexp)), sub, normal)


def cast(x, dtype):
    """Round ``x`` to ``dtype`` (ties to even) and return it in ``dtype``: :func:`round_to`,
    then a cast that is exact, so XLA's convert folding cannot change the values."""
    return round_to(x, dtype).astype(dtype)


# --------------------------------------------------------------------------- FP8


def fp8_quantize(x, dtype, scale):
    """Quantize ``x`` to an FP8 dtype: ``cast_rne(clip(x * (1 / scale), -max, max))``.

    Saturating (clip before the cast), like Transformer Engine's casts:
    out-of-range values, including +-inf, become +-max of the format.
    NaN stays NaN (e4m3fn has a NaN encoding but no inf).
    We multiply by the reciprocal rather than divide, as TE does (it multiplies
    by its encode scale). XLA rewrites ``x / scalar`` into exactly this anyway,
    so writing it out makes the rounding explicit and the same on CPU and GPU.
    Arithmetic is float32, so bf16/f16 inputs behave like their f32 values.

    ``scale`` must be a positive finite number: a concrete one is checked (a one-line
    ``ValueError``); a scale traced under ``jax.jit`` cannot be, and a zero, negative or
    non-finite traced scale gives NaN, +-max or flipped signs. ``compute_scale`` never
    returns one.
    """
    _check_floating(x, "fp8_quantize")
    validate.scale(scale, "fp8_quantize")
    fmax = _fmax(validate.fp8_dtype(dtype, "fp8_quantize"))
    inv = jnp.float32(1.0) / jnp.asarray(scale, jnp.float32)
    y = jnp.asarray(x).astype(jnp.float32) * inv
    return cast(jnp.clip(y, -fmax, fmax), dtype)


def fp8_cast(x, dtype, scale):
    """:func:`fp8_quantize` as the hardware does it: ``clip(x * (1 / scale)).astype(dtype)``.

    One saturating round-to-nearest-even convert per element instead of the ~25 operations of
    :func:`cast`'s explicit rounding, and bit-identical to :func:`fp8_quantize` (tested over
    every bfloat16 value and at the halfway points of every FP8 value on the CPU; ``repro
    check`` tests it on the device before anything is recorded). Use it only for FP8 arrays
    that go straight into an FP8 GEMM or convolution: an FP8 array later converted back to a
    wider type is a round trip that XLA's GPU compiler may fold away (see :func:`round_to`),
    so quantize-dequantize paths keep :func:`fp8_quantize`. ``scale``: as there (a concrete
    one must be positive and finite).
    """
    _check_floating(x, "fp8_cast")
    validate.scale(scale, "fp8_cast")
    fmax = _fmax(validate.fp8_dtype(dtype, "fp8_cast"))
    inv = jnp.float32(1.0) / jnp.asarray(scale, jnp.float32)
    y = jnp.asarray(x).astype(jnp.float32) * inv
    return jnp.clip(y, -fmax, fmax).astype(dtype)


def fp8_dequantize(q, scale, dtype=jnp.float32):
    """Inverse of :func:`fp8_quantize` (up to rounding): ``q * scale``."""
    validate.out_dtype(dtype, "fp8_dequantize")
    return (q.astype(jnp.float32) * jnp.asarray(scale, jnp.float32)).astype(dtype)


def compute_scale(amax, fmax, margin=0):
    """Per-tensor dequantize scale ``amax / fmax * 2**margin`` (float32).

    ``margin`` is Transformer Engine's power-of-two headroom: a larger margin
    maps amax below fmax, leaving room for growth before saturating.
    If amax is 0 or not finite (or the scale would underflow to 0) the scale is
    1.0: there is nothing sensible to adapt to, and 1.0 never produces inf/NaN.
    """
    validate.int_value(margin, "compute_scale", "margin")
    amax = jnp.asarray(amax, jnp.float32)
    # ldexp, not exp2: XLA's exp2 is not exact for integer arguments on CPU.
    scale = jnp.ldexp(amax / jnp.float32(fmax), jnp.asarray(margin, jnp.int32))
    # A subnormal scale would make 1/scale inf (and 0 * inf NaN) on GPUs, which keep
    # subnormals; CPUs flush them to zero. Transformer Engine clamps likewise.
    ok = (jnp.isfinite(amax) & (amax > 0) & jnp.isfinite(scale)
          & (scale >= jnp.finfo(jnp.float32).tiny))
    return jnp.where(ok, scale, jnp.float32(1.0))


def representable_values(dtype) -> np.ndarray:
    """All finite non-negative values of a <= 8-bit float format, sorted (float64)."""
    dt = np.dtype(dtype)
    n = 16 if dt == np.dtype(ml_dtypes.float4_e2m1fn) else 256
    v = np.arange(n, dtype=np.uint8).view(dt).astype(np.float64)
    return np.unique(np.abs(v[np.isfinite(v)]))  # abs merges -0 into 0


def stochastic_round_to(x, dtype, key):
    """Stochastically round float32 ``x`` to ``dtype`` (any <= 8-bit float).

    Returns the lower or upper representable neighbour of x with probability
    proportional to proximity, so ``E[result] == x`` for |x| <= max. Exactly
    representable values are returned unchanged. Values beyond +-max (and inf)
    saturate to +-max; NaN stays NaN where the format has a NaN (it does not in
    E2M1, where the cast gives an unspecified finite value).
    The neighbours come from arithmetic, not a table search (a searchsorted over the value
    table made NVFP4 training ~4x slower on an H200): below the format's max, representable
    values near |x| are spaced ``ulp = 2**(max(e, emin) - nmant)`` with ``e = floor(log2|x|)``
    read from the float32 exponent bits, so ``lo = floor(|x| / ulp) * ulp`` and
    ``hi = lo + ulp``, all exact in float32 (ulp is a power of two).
    """
    _check_floating(x, "stochastic_round_to")
    validate.key(key, "stochastic_round_to")
    info = ml_dtypes.finfo(validate.float_dtype(dtype, "stochastic_round_to", max_bits=8))
    x = jnp.asarray(x).astype(jnp.float32)
    fmax = float(info.max)
    ax = jnp.minimum(jnp.abs(x), fmax)  # saturate; NaN handled at the end
    bits = jax.lax.bitcast_convert_type(ax, jnp.uint32)
    e = (bits >> 23).astype(jnp.int32) - 127  # floor(log2|x|) for normal float32 values
    ulp_exp = jnp.maximum(e, info.minexp) - info.nmant  # >= -16 for every <= 8-bit format
    ulp = jax.lax.bitcast_convert_type(((ulp_exp + 127) << 23).astype(jnp.uint32), jnp.float32)
    lo = jnp.floor(ax / ulp) * ulp
    p_up = (ax - lo) / ulp  # in [0, 1); exactly 0 when |x| is representable
    u = jax.random.uniform(key, x.shape, jnp.float32)
    r = jnp.where(u < p_up, lo + ulp, lo)
    r = jnp.copysign(r, x)  # keep the sign of zero results (-tiny -> -0)
    return jnp.where(jnp.isnan(x), x, r).astype(dtype)


# ------------------------------------------------------------------------ MXFP8


class MXTensor(NamedTuple):
    q: jax.Array  # E4M3 elements, same shape as the input
    scale: jax.Array  # E8M0, the input shape with `axis` divided by the block
    axis: Any  # informational; mxfp8_dequantize infers it from the shapes


def _blocked(x, axis: int, block: int, what: str):
    """Move `axis` last and split it into [n // block, block]."""
    x = jnp.moveaxis(x, axis, -1)
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"{what}: dimension {axis} has size {n}, not divisible by {block}")
    return x.reshape(*x.shape[:-1], n // block, block)


def mxfp8_quantize(x, axis=-1, block=32) -> MXTensor:
    """OCP MX (v1.0) MXFP8: E4M3 elements, one E8M0 scale per `block` along `axis`.

    Per the spec: shared_exp = floor(log2(block_amax)) - emax(E4M3), emax = 8,
    clamped to the E8M0 range [-127, 127]; elements = x / 2**shared_exp,
    saturate-cast to E4M3 (so the block max lands in [256, 512) before
    saturation, i.e. values in [448, 512) saturate to 448, as the spec says).
    All-zero blocks get scale 1. A block containing NaN or +-inf gets the E8M0
    NaN scale, so the whole block dequantizes to NaN (the spec's NaN rule).
    """
    _check_floating(x, "mxfp8_quantize")
    x = validate.operand(x, "mxfp8_quantize")
    block = validate.positive_int(block, "mxfp8_quantize", "block", " (32 in the spec)")
    axis = validate.axis(axis, x.ndim, "mxfp8_quantize")
    xb = _blocked(x.astype(jnp.float32), axis, block, "mxfp8_quantize")
    bmax = jnp.max(jnp.abs(xb), axis=-1, keepdims=True)  # NaN propagates
    # frexp: bmax = m * 2**e with m in [0.5, 1), so floor(log2(bmax)) = e - 1, exactly.
    _, e = jnp.frexp(bmax)
    shared = jnp.where(bmax > 0, e - 1 - 8, 0)
    shared = jnp.clip(shared, -127, 127)
    finite = jnp.isfinite(bmax)
    # Exact power-of-two scaling (ldexp: XLA's exp2 is inexact on CPU).
    y = jnp.ldexp(xb, -shared)
    q = cast(jnp.clip(y, -448.0, 448.0), E4M3)
    # Build E8M0 from its biased exponent bits (0xFF is NaN): exact, no float detour.
    bits = jnp.where(finite, shared + 127, 255).astype(jnp.uint8)
    scale = jax.lax.bitcast_convert_type(bits[..., 0], E8M0)
    q = jnp.moveaxis(q.reshape(*q.shape[:-2], -1), -1, axis)
    scale = jnp.moveaxis(scale, -1, axis)
    return MXTensor(q, scale, axis)


def mxfp8_dequantize(t: MXTensor, dtype=jnp.float32):
    """``q * scale`` with each scale broadcast over its block."""
    validate.out_dtype(dtype, "mxfp8_dequantize")
    q, scale = t.q, t.scale
    diff = [i for i, (a, b) in enumerate(zip(q.shape, scale.shape)) if a != b]
    if len(diff) != 1 or q.ndim != scale.ndim:
        raise ValueError(f"mxfp8_dequantize: inconsistent shapes q{q.shape} scale{scale.shape}")
    axis = diff[0]
    s = jnp.repeat(scale.astype(jnp.float32), q.shape[axis] // scale.shape[axis], axis=axis)
    return (q.astype(jnp.float32) * s).astype(dtype)


# ------------------------------------------------------------------------ NVFP4


class NVFP4Tensor(NamedTuple):
    q: jax.Array  # E2M1 elements, same shape as the input
    block_scale: jax.Array  # E4M3, shape [..., M / br, N / bc] (br = 1 for 1D blocks)
    global_scale: jax.Array  # float32 scalar (per tensor)
    block: Any  # (1, 16) or (16, 16); informational, dequantize infers it from shapes


def _nvfp4_tiles(x, block):
    """Reshape [..., M, N] -> [..., M/br, br, N/bc, bc] (1D blocks: br == 1)."""
    br, bc = block
    if block not in NVFP4_BLOCKS:
        raise ValueError(f"nvfp4: block must be one of {NVFP4_BLOCKS}, got {block}")
    if br > 1 and x.ndim < 2:
        raise ValueError(f"nvfp4: 2D blocks {block} need ndim >= 2, got shape {x.shape}")
    if x.ndim == 0:
        raise ValueError("nvfp4: cannot block-quantize a scalar")
    x2 = x if br > 1 else x[..., None, :]  # 1D: treat as rows of a [..., 1, N] matrix
    m, n = x2.shape[-2:]
    for name, size, b in (("second-to-last", m, br), ("last", n, bc)):
        if size % b:
            raise ValueError(f"nvfp4: {name} dimension has size {size}, not divisible by {b}")
    return x2.reshape(*x2.shape[:-2], m // br, br, n // bc, bc)


def nvfp4_quantize(x, block=(1, 16), rounding="nearest", key=None) -> NVFP4Tensor:
    """NVIDIA's NVFP4 recipe (arXiv 2509.25149; TE ``NVFP4BlockScaling``).

    Two-level scaling. A float32 per-tensor ``global_scale = amax / (448 * 6)``
    puts every block scale inside the E4M3 range; each block then gets
    ``block_scale = e4m3_rne((block_amax / 6) / global_scale)`` and its
    elements ``e2m1(clip(x / (block_scale * global_scale), -6, 6))``.
    The float32 operations follow TE's reference quantizer
    (``quantization_ref_nvfp4.py``) op for op, so the rounding matches it:
    encode scale ``S = min(2688 / amax, f32max)``, ``global_scale = 1 / S``,
    ``block_scale = e4m3(min(block_amax * (S * fl(1/6)), 448))``,
    ``elements = e2m1(clip(x * min(1 / (block_scale * global_scale), f32max)))``.
    (global_scale is therefore amax / 2688 to within an ulp.)

    ``block=(16, 16)`` tiles the last two axes (weights: W and W.T then see the
    same quantized values); ``(1, 16)`` blocks 16 consecutive elements of the
    last axis. ``rounding`` is "nearest" (RNE) or "stochastic" (needs ``key``).

    Edge cases: an all-zero tensor gets global_scale 1.0. Amaxes ignore NaN and
    +-inf, so one bad value cannot poison other blocks. +-inf saturates: its
    block gets the largest block scale (448), so it dequantizes to
    +-6 * 448 * global_scale, the largest magnitude the tensor can hold (its
    finite amax; 2688 for a tensor of infinities, whose global scale is 1).
    E2M1 has no NaN, so a block containing NaN gets the E4M3
    NaN block scale (its elements are stored as 0): the whole block
    dequantizes to NaN, other blocks are intact. Blocks whose E4M3 scale is 0
    (all zero, or < ~2e-6 of the tensor amax) dequantize to exact zeros.
    """
    _check_floating(x, "nvfp4_quantize")
    if not (isinstance(block, (tuple, list)) and tuple(block) in NVFP4_BLOCKS
            and all(validate._is_int(b) for b in block)):
        raise ValueError(f"nvfp4_quantize: block must be one of {NVFP4_BLOCKS} (ints), "
                         f"got {block!r}")
    block = tuple(int(b) for b in block)
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"nvfp4_quantize: rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if rounding == "stochastic":
        if key is None:
            raise ValueError("nvfp4_quantize: rounding='stochastic' requires a PRNG key")
        validate.key(key, "nvfp4_quantize")
    x = validate.operand(x, "nvfp4_quantize")
    shape = x.shape
    f32max = jnp.float32(np.finfo(np.float32).max)
    t = _nvfp4_tiles(x.astype(jnp.float32), block)  # [..., M/br, br, N/bc, bc]
    a = jnp.where(jnp.isfinite(t), jnp.abs(t), 0.0)

    amax = jnp.max(a)
    s_enc = jnp.minimum(jnp.float32(448.0 * E2M1_MAX) / amax, f32max)  # global encode scale
    s_enc = jnp.where(amax > 0, s_enc, jnp.float32(1.0))
    gs = jnp.float32(1.0) / s_enc  # global (dequantize) scale

    bmax = jnp.max(a, axis=(-3, -1), keepdims=True)
    bs = cast(jnp.minimum(bmax * (s_enc * jnp.float32(1.0 / E2M1_MAX)), 448.0), E4M3)
    has_inf = jnp.any(jnp.isinf(t), axis=(-3, -1), keepdims=True)
    bs = jnp.where(has_inf, jnp.float32(448.0), bs.astype(jnp.float32)).astype(E4M3)
    has_nan = jnp.any(jnp.isnan(t), axis=(-3, -1), keepdims=True)
    bs = jnp.where(has_nan, jnp.nan, bs.astype(jnp.float32)).astype(E4M3)

    enc = jnp.minimum(jnp.float32(1.0) / (bs.astype(jnp.float32) * gs), f32max)  # 1/0 -> f32max
    y = t * enc
    y = jnp.where(jnp.isnan(y), 0.0, y)  # NaN blocks: the NaN block scale carries the NaN
    y = jnp.clip(y, -E2M1_MAX, E2M1_MAX)  # saturate (also turns +-inf into +-6)
    if rounding == "stochastic":
        q = stochastic_round_to(y, E2M1, key)
    else:
        q = cast(y, E2M1)

    q = q.reshape(shape)
    bs = bs[..., 0, :, 0]  # drop the in-block axes -> [..., M/br, N/bc]
    if block[0] == 1:
        bs = bs[..., 0, :]  # drop the helper row axis: x.shape[:-1] + (N/16,)
    return NVFP4Tensor(q, bs, gs, block)


def nvfp4_dequantize(t: NVFP4Tensor, dtype=jnp.float32):
    """``q * block_scale * global_scale`` with block scales broadcast over blocks."""
    validate.out_dtype(dtype, "nvfp4_dequantize")
    q, bs = t.q, t.block_scale.astype(jnp.float32)
    bc = q.shape[-1] // bs.shape[-1]
    br = q.shape[-2] // bs.shape[-2] if q.ndim >= 2 else 1
    s = jnp.repeat(bs, bc, axis=-1)
    if br > 1:
        s = jnp.repeat(s, br, axis=-2)
    return (q.astype(jnp.float32) * s * jnp.asarray(t.global_scale, jnp.float32)).astype(dtype)


# ------------------------------------------------------------ Hadamard transform


def hadamard_matrix(n=16):
    """Orthonormal Sylvester Hadamard matrix (entries +-1/sqrt(n)), float32."""
    if not validate._is_int(n) or n < 1 or n & (n - 1):
        raise ValueError(f"hadamard_matrix: n must be a power of two, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return jnp.asarray(h / np.sqrt(n), jnp.float32)


def _rht_matrix(key, n):
    """M = H @ diag(s): one random sign vector s for the whole tensor."""
    s = jax.random.rademacher(key, (n,), jnp.float32)
    return hadamard_matrix(n) * s[None, :]


def _apply_groups(x, m, axis, n, what):
    """Multiply each consecutive length-n group along `axis` (a column vector g) by m."""
    _check_floating(x, what)
    x = validate.operand(x, what)
    axis = validate.axis(axis, x.ndim, what)
    g = _blocked(x.astype(jnp.float32), axis, n, what)
    # HIGHEST: on GPU the default f32 matmul may use TF32, which breaks orthogonality.
    y = jnp.einsum("...kj,ij->...ki", g, m, precision=jax.lax.Precision.HIGHEST)
    y = y.reshape(*y.shape[:-2], -1)
    return jnp.moveaxis(y, -1, axis).astype(x.dtype)


def _check_group(n, what):
    if not validate._is_int(n) or n < 1 or n & (n - 1):
        raise ValueError(f"{what}: n (the group size) must be a power-of-two int, got {n!r}")


def random_hadamard_transform(x, key, axis=-1, n=16):
    """Random Hadamard transform (RHT) of groups of `n` along `axis`: g -> H diag(s) g.

    M = H diag(s) is orthogonal (M^T M = I), so transforming BOTH GEMM operands
    along the contraction axis with the same key leaves the product unchanged in
    exact arithmetic: (M a) . (M b) = a^T M^T M b = a . b. It spreads outliers
    across the group, which shrinks block amaxes before NVFP4 quantization.
    """
    validate.key(key, "random_hadamard_transform")
    _check_group(n, "random_hadamard_transform")
    return _apply_groups(x, _rht_matrix(key, n), axis, n, "random_hadamard_transform")


def inverse_random_hadamard_transform(x, key, axis=-1, n=16):
    """Inverse of :func:`random_hadamard_transform` with the same key: g -> M^T g."""
    validate.key(key, "inverse_random_hadamard_transform")
    _check_group(n, "inverse_random_hadamard_transform")
    return _apply_groups(x, _rht_matrix(key, n).T, axis, n, "inverse_random_hadamard_transform")


# ---------------------------------------------------------------- fake quantize


@jax.custom_jvp
def _straight_through(x, y):
    """Returns y; derivative is the identity w.r.t. x (straight-through estimator)."""
    return y


@_straight_through.defjvp
def _straight_through_jvp(primals, tangents):
    return primals[1], tangents[0]


_FAKE_QUANTIZE_KW = {"e4m3": ("margin",), "e5m2": ("margin",), "mxfp8": ("axis", "block"),
                     "nvfp4": ("block", "rounding", "key")}


def fake_quantize(x, fmt, **kw):
    """Quantize then dequantize ``x`` in format `fmt`; returns ``x.dtype``.

    fmt: "e4m3" / "e5m2" (current per-tensor scaling, kw: margin),
    "mxfp8" (kw: axis, block), "nvfp4" (kw: block, rounding, key).
    Gradients use the straight-through estimator (identity): differentiating
    through the casts would quantize the cotangents themselves to the format.
    """
    _check_floating(x, "fake_quantize")
    takes = _FAKE_QUANTIZE_KW.get(fmt)
    if takes is not None and set(kw) - set(takes):
        raise TypeError(f"fake_quantize: fmt {fmt!r} takes {', '.join(takes)}, got "
                        f"{', '.join(sorted(set(kw) - set(takes)))}")
    x = jnp.asarray(x)
    if fmt in ("e4m3", "e5m2"):
        dtype = E4M3 if fmt == "e4m3" else E5M2
        xf = x.astype(jnp.float32)
        amax = jnp.max(jnp.abs(xf))
        scale = compute_scale(amax, _fmax(dtype), kw.get("margin", 0))
        y = fp8_dequantize(fp8_quantize(xf, dtype, scale), scale)
    elif fmt == "mxfp8":
        y = mxfp8_dequantize(mxfp8_quantize(x, **kw))
    elif fmt == "nvfp4":
        y = nvfp4_dequantize(nvfp4_quantize(x, **kw))
    else:
        raise ValueError(f"fake_quantize: fmt must be one of e4m3, e5m2, mxfp8, nvfp4; got {fmt!r}")
    return _straight_through(x, jax.lax.stop_gradient(y.astype(x.dtype)))
