"""Tests for repro.precision.formats against independent references.

References are numpy + ml_dtypes casts, literal hand-computed numbers, or
closed-form definitions written out here; never the code under test.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from repro.precision import formats as F

SETTINGS = settings(max_examples=40, deadline=None)
NP_DT = {F.E4M3: ml_dtypes.float8_e4m3fn, F.E5M2: ml_dtypes.float8_e5m2, F.E2M1: ml_dtypes.float4_e2m1fn}
MAXES = {F.E4M3: 448.0, F.E5M2: 57344.0, F.E2M1: 6.0}

_fp8_q = jax.jit(F.fp8_quantize, static_argnums=1)
_fq = jax.jit(F.fake_quantize, static_argnames=("fmt", "block", "rounding"))
_nv_roundtrip = jax.jit(lambda x, block: F.nvfp4_dequantize(F.nvfp4_quantize(x, block)), static_argnums=1)


def bits(a):
    return np.asarray(a).view(np.uint8)


def ref_fp8(x, dtype, scale):
    """numpy/ml_dtypes reference: saturate then RNE cast of x * (1/scale) in float32."""
    inv = np.float32(1.0) / np.float32(scale)
    m = MAXES[dtype]
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(x, np.float32) * inv).clip(-m, m).astype(NP_DT[dtype])


def assert_same_fp8(got, want):
    """Bit-exact, except that any NaN encoding matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(bits(got)[~gn], bits(want)[~wn])


def grid(dtype):
    """All finite values of a format, from ml_dtypes bit patterns (sorted, one zero)."""
    n = 16 if dtype is F.E2M1 else 256
    v = np.arange(n, dtype=np.uint8).view(NP_DT[dtype]).astype(np.float64)
    return np.unique(v[np.isfinite(v)] + 0.0)  # + 0.0 turns -0 into 0


# ----------------------------------------------------------------------- FP8


def near_grid(dtype):
    """Values on, between, and exactly half-way between representable values (ties)."""
    g = grid(dtype)
    pos = g[g >= 0]
    return st.builds(
        lambda i, frac, sign: np.float32(sign * (pos[i] + frac * (pos[i + 1] - pos[i]))),
        st.integers(0, len(pos) - 2),
        st.sampled_from([0.0, 0.5, 0.5, 0.25, 0.75, 0.4999, 0.5001]),
        st.sampled_from([1.0, -1.0]),
    )


any_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=False)


@pytest.mark.parametrize("dtype", [F.E4M3, F.E5M2])
@SETTINGS
@given(data=st.data())
def test_fp8_quantize_matches_ml_dtypes(dtype, data):
    elems = st.one_of(any_f32, near_grid(dtype), st.floats(-1e6, 1e6, width=32))
    x = data.draw(hnp.arrays(np.float32, (64,), elements=elems))
    scale = data.draw(st.sampled_from([1.0, 0.5, 4.0, 0.3, 3.0 / 448.0, 1e-3, 2.0**-20]))
    assert_same_fp8(_fp8_q(x, dtype, np.float32(scale)), ref_fp8(x, dtype, scale))


@pytest.mark.parametrize("dtype", [F.E4M3, F.E5M2])
@SETTINGS
@given(data=st.data())
def test_fp8_ties_and_grid_with_scale_one(dtype, data):
    x = data.draw(hnp.arrays(np.float32, (32,), elements=near_grid(dtype)))
    assert_same_fp8(_fp8_q(x, dtype, 1.0), ref_fp8(x, dtype, 1.0))


def test_fp8_e4m3_literal_edge_cases():
    # Expected values written out by hand from the E4M3 definition
    # (3 mantissa bits, bias 7, max 448, min subnormal 2**-9, RNE).
    s = 2.0**-9
    cases = [
        (0.0, 0.0),
        (s, s),  # smallest subnormal
        (3 * s, 3 * s),  # subnormal
        (s / 2, 0.0),  # tie between 0 and 2**-9 -> even (0)
        (1.5 * s, 2 * s),  # tie between 1 and 2 ulps -> even (2)
        (2.5 * s, 2 * s),  # tie between 2 and 3 ulps -> even (2)
        (1 + 1 / 16, 1.0),  # tie between 1 and 1.125 -> even mantissa (1)
        (1 + 3 / 16, 1.25),  # tie between 1.125 and 1.25 -> 1.25
        (1.1, 1.125),
        (416.0, 416.0),
        (432.0, 448.0),  # tie between 416 (odd) and 448 (even)
        (449.0, 448.0),  # saturate
        (500.0, 448.0),
        (1e30, 448.0),
        (np.inf, 448.0),  # no inf in e4m3fn: saturates
        (-np.inf, -448.0),
        (-1.1, -1.125),
    ]
    x = np.array([c[0] for c in cases], np.float32)
    want = np.array([c[1] for c in cases], np.float32)
    got = np.asarray(F.fp8_quantize(x, F.E4M3, 1.0)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.signbit(np.asarray(F.fp8_quantize(np.float32(-0.0), F.E4M3, 1.0)).astype(np.float32))
    nan = F.fp8_quantize(jnp.array([np.nan, -np.nan]), F.E4M3, 1.0)
    assert np.isnan(np.asarray(nan).astype(np.float32)).all()


def test_fp8_e5m2_literal_edge_cases():
    s = 2.0**-16  # e5m2 min subnormal
    x = np.array([s, s / 2, 1.5 * s, 1.125, 1.375, 57344.0, 60000.0, 61440.0, np.inf, 1e9], np.float32)
    want = np.array([s, 0.0, 2 * s, 1.0, 1.5, 57344.0, 57344.0, 57344.0, 57344.0, 57344.0], np.float32)
    np.testing.assert_array_equal(np.asarray(F.fp8_quantize(x, F.E5M2, 1.0)).astype(np.float32), want)


def test_fp8_quantize_scale_and_dtype():
    x = jnp.array([1.0, -2.0, 96.0], jnp.bfloat16)
    q = F.fp8_quantize(x, F.E4M3, 0.5)
    assert q.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(q).astype(np.float32), [2.0, -4.0, 192.0])
    d = F.fp8_dequantize(q, 0.5)
    assert d.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(d), [1.0, -2.0, 96.0])
    assert F.fp8_dequantize(q, 0.5, jnp.bfloat16).dtype == jnp.bfloat16


def test_fp8_quantize_rejects_integers():
    with pytest.raises(TypeError, match="must be floating"):
        F.fp8_quantize(jnp.arange(4), F.E4M3, 1.0)
    with pytest.raises(TypeError, match="must be floating"):
        jax.jit(lambda v: F.fp8_quantize(v, F.E4M3, 1.0))(jnp.arange(4, dtype=jnp.int8))


# ------------------------------------------------------------- compute_scale


def test_compute_scale_values_and_margin():
    assert float(F.compute_scale(448.0, 448.0)) == 1.0
    assert float(F.compute_scale(448.0, 448.0, margin=1)) == 2.0
    assert float(F.compute_scale(448.0, 448.0, margin=-2)) == 0.25
    np.testing.assert_allclose(float(F.compute_scale(3.0, 448.0)), 3.0 / 448.0, rtol=2e-7)
    np.testing.assert_allclose(float(F.compute_scale(1e4, 57344.0, 3)), 1e4 / 57344 * 8, rtol=2e-7)
    assert F.compute_scale(3.0, 448.0).dtype == jnp.float32


@pytest.mark.parametrize("bad", [0.0, -0.0, np.inf, -np.inf, np.nan])
def test_compute_scale_degenerate_amax_is_one(bad):
    assert float(F.compute_scale(bad, 448.0)) == 1.0
    assert float(jax.jit(F.compute_scale)(jnp.float32(bad), 448.0)) == 1.0


# ------------------------------------------------------- representable values


def test_representable_values():
    np.testing.assert_array_equal(F.representable_values(F.E2M1), [0, 0.5, 1, 1.5, 2, 3, 4, 6])
    e4 = F.representable_values(F.E4M3)
    # 0x00..0x7E are finite non-negative e4m3fn codes (0x7F is NaN): 127 values.
    assert len(e4) == 127 and e4[0] == 0 and e4[1] == 2.0**-9 and e4[-1] == 448.0
    e5 = F.representable_values(F.E5M2)
    # 0x00..0x7B finite (0x7C is inf): 124 values.
    assert len(e5) == 124 and e5[1] == 2.0**-16 and e5[-1] == 57344.0
    assert np.all(np.diff(e4) > 0)
    e8 = F.representable_values(F.E8M0)  # 2**-127 .. 2**127
    assert len(e8) == 255 and e8[0] == 2.0**-127 and e8[-1] == 2.0**127


# ---------------------------------------------------------- stochastic round


def neighbours(x, dtype):
    g = grid(dtype)
    i = np.searchsorted(g, x, side="right") - 1
    i = np.clip(i, 0, len(g) - 2)
    lo, hi = g[i], g[i + 1]
    lo = np.where(x == g[i + 1], hi, lo)
    return lo, hi


@pytest.mark.parametrize("dtype", [F.E2M1, F.E4M3, F.E5M2])
def test_stochastic_round_is_unbiased(dtype):
    m = MAXES[dtype]
    x = np.array([0.3, -0.7, 1.2, 0.1, 0.9 * m, -0.51 * m, 0.33 * m, 0.013 * m], np.float32)
    n = 4000
    r = F.stochastic_round_to(jnp.broadcast_to(x, (n, x.size)), dtype, jax.random.key(0))
    r = np.asarray(r).astype(np.float64)
    lo, hi = neighbours(x.astype(np.float64), dtype)
    # Every draw is one of the two neighbours.
    assert np.all((r == lo) | (r == hi))
    # Mean within 5 binomial standard deviations of x.
    p = (x - lo) / (hi - lo)
    sd = (hi - lo) * np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(r.mean(0) - x) <= 5 * sd + 1e-6 * np.abs(x))
    # Both neighbours actually occur (not just always rounding one way).
    assert np.all((r == lo).any(0) & (r == hi).any(0))


@pytest.mark.parametrize("dtype", [F.E2M1, F.E4M3, F.E5M2])
def test_stochastic_round_keeps_representable_and_saturates(dtype):
    g = grid(dtype).astype(np.float32)
    r = F.stochastic_round_to(jnp.asarray(g), dtype, jax.random.key(3))
    assert r.dtype == dtype
    np.testing.assert_array_equal(np.asarray(r).astype(np.float32), g)
    m = MAXES[dtype]
    sat = np.asarray(F.stochastic_round_to(jnp.array([2 * m, -np.inf, np.inf]), dtype, jax.random.key(1)))
    np.testing.assert_array_equal(sat.astype(np.float32), [m, -m, m])


@SETTINGS
@given(hnp.arrays(np.float32, (16,), elements=st.floats(-6, 6, width=32)), st.integers(0, 2**31 - 1))
def test_stochastic_round_e2m1_neighbours_property(x, seed):
    r = np.asarray(F.stochastic_round_to(x, F.E2M1, jax.random.key(seed))).astype(np.float64)
    lo, hi = neighbours(x.astype(np.float64), F.E2M1)
    assert np.all((r == lo) | (r == hi))


# ---------------------------------------------------------------------- MXFP8


def ref_mxfp8(x, axis):
    """Independent OCP MX rule in float64 numpy: scale 2**(floor(log2 amax) - 8)."""
    xm = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    b = xm.reshape(*xm.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 8, 0.0)
    e = np.clip(e, -127, 127)
    q = np.clip(b / 2.0**e, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    q = np.moveaxis(q.reshape(xm.shape), -1, axis)
    return q, np.moveaxis(2.0 ** e[..., 0], -1, axis)


def mx_data(seed, shape=(4, 256)):
    rng = np.random.default_rng(seed)
    nb = shape[-1] // 32
    mag = 2.0 ** rng.integers(-30, 30, size=(*shape[:-1], nb, 1))  # per-block magnitudes
    x = (rng.standard_normal((*shape[:-1], nb, 32)) * mag).reshape(shape)
    if shape[-1] >= 128:
        # Blocks whose amax sits exactly on, just below, and in the saturating
        # range above a power-of-two boundary, and an all-zero block.
        x[0, :128] = rng.uniform(-0.5, 0.5, 128)
        x[0, 0] = 1.0  # shared exp 0 - 8
        x[0, 32] = np.nextafter(np.float32(2.0), np.float32(0))  # floor(log2) = 0, not 1
        x[0, 64] = 500.0  # floor(log2 500) = 8 -> shared exp 0 -> 500 saturates to 448
        x[0, 96:128] = 0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0])
def test_mxfp8_matches_independent_numpy(seed, axis):
    x = mx_data(seed, (64, 256))
    t = jax.jit(F.mxfp8_quantize, static_argnums=(1, 2))(x, axis, 32)
    q_ref, s_ref = ref_mxfp8(x, axis)
    np.testing.assert_array_equal(bits(t.q), bits(q_ref))
    np.testing.assert_array_equal(np.asarray(t.scale).astype(np.float64), s_ref)
    assert t.q.dtype == jnp.float8_e4m3fn


def test_mxfp8_scales_are_e8m0_powers_of_two_and_error_bound():
    x = mx_data(2)
    t = F.mxfp8_quantize(x)
    s = np.asarray(t.scale)
    assert s.dtype == ml_dtypes.float8_e8m0fnu and s.shape == (4, 8)
    s64 = s.astype(np.float64)
    mant, _ = np.frexp(s64)
    assert np.all(mant == 0.5)  # exact powers of two
    np.testing.assert_array_equal(s64.astype(ml_dtypes.float8_e8m0fnu).astype(np.float64), s64)
    np.testing.assert_array_equal(s64[0, :4], [2.0**-8, 2.0**-8, 1.0, 1.0])  # 1.0, 2-ulp, 500, zeros
    d = np.asarray(F.mxfp8_dequantize(t)).astype(np.float64)
    xb, db = x.reshape(4, 8, 32).astype(np.float64), d.reshape(4, 8, 32)
    err = np.abs(db - xb)
    amax = np.abs(xb).max(-1, keepdims=True)
    sc = s64[..., None]
    # Saturation is the worst case: [448, 512) * scale -> 448 * scale, < 1/8 of block amax.
    assert np.all(err <= amax / 8)
    # Unsaturated elements: 3 mantissa bits (rel 2**-4), or half a subnormal step (2**-10 * scale).
    ok = np.abs(xb) <= 448 * sc
    assert np.all((err <= np.maximum(np.abs(xb) * 2.0**-4, 2.0**-10 * sc))[ok])


def test_mxfp8_dequantize_axis0_jit_and_nonfinite_blocks():
    x = mx_data(3, (64, 32))
    x[5, 3] = np.nan
    t = jax.jit(lambda v: F.mxfp8_quantize(v, axis=0))(x)
    assert t.scale.shape == (2, 32)
    d = np.asarray(F.mxfp8_dequantize(t))
    assert np.isnan(d[:32, 3]).all()  # the NaN's block
    assert np.isfinite(np.delete(d, 3, axis=1)).all() and np.isfinite(d[32:, 3]).all()
    with pytest.raises(ValueError, match="size 40"):
        F.mxfp8_quantize(jnp.ones((4, 40)))


# ---------------------------------------------------------------------- NVFP4

# Hand-computed example. Tensor amax 10.5 makes the encode scale 448*6/10.5 =
# 256 and the global scale exactly 2**-8. Block scale = e4m3(block_amax/6 * 256):
#   A: amax 10.5 -> 448       elements x / 1.75
#   B: amax 1.5  -> 64        elements x * 4   (ties are exact here)
#   C: amax 1.3  -> 55.47 -> e4m3 56 (grid step 4 in [32, 64))  elements x / 0.21875
#   D: zeros     -> 0         elements 0
HAND_X = np.array(
    [
        [10.5, -10.5, 0.0, 1.0, 2.0, -3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, -0.5, 0.3, 1.5, 2.8],
        [1.5, -1.5, 0.0625, 0.1875, 0.3125, 0.4375, 0.625, 0.875, 1.25, -0.0625, -0.625, -1.25, 0.1, 0.6, 0.7, 1.1],
        [1.3, 0.4, -0.7, 0.11, 0.2, 1.0, 0.6, 0.05, -0.08, 0.0, 0.9, -1.2, 0.25, 0.33, 0.77, -0.5],
        [0.0] * 16,
    ],
    np.float32,
)
HAND_Q = np.array(
    [
        # x/1.75 = 6, -6, 0, .571, 1.14, -1.71, 2.29, 2.86, 3.43, 4, 4.57, 5.14, -.286, .171, .857, 1.6
        [6, -6, 0, 0.5, 1, -1.5, 2, 3, 3, 4, 4, 6, -0.5, 0, 1, 1.5],
        # 4x = 6, -6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5 (ties -> even), -.25, -2.5, -5, .4, 2.4, 2.8, 4.4
        [6, -6, 0, 1, 1, 2, 2, 4, 4, -0.0, -2, -4, 0.5, 2, 3, 4],
        # x/0.21875 = 5.94, 1.83, -3.2, .503, .914, 4.57, 2.74, .229, -.366, 0, 4.11, -5.49, 1.14, 1.51, 3.52, -2.29
        [6, 2, -3, 0.5, 1, 4, 3, 0, -0.5, 0, 4, -6, 1, 1.5, 4, -2],
        [0] * 16,
    ],
    np.float32,
)


def test_nvfp4_hand_computed_1d():
    t = F.nvfp4_quantize(HAND_X)
    assert t.q.dtype == jnp.float4_e2m1fn and t.block_scale.dtype == jnp.float8_e4m3fn
    assert t.global_scale.dtype == jnp.float32 and t.global_scale.shape == ()
    assert float(t.global_scale) == 2.0**-8
    np.testing.assert_array_equal(np.asarray(t.block_scale).astype(np.float32), [[448], [64], [56], [0]])
    np.testing.assert_array_equal(np.asarray(t.q).astype(np.float32), HAND_Q)
    deq = np.asarray(F.nvfp4_dequantize(t))
    np.testing.assert_array_equal(deq, HAND_Q * np.array([[1.75], [0.25], [0.21875], [0.0]], np.float32))


def test_nvfp4_hand_computed_2d_tiles():
    # 32x32 weight, 4 tiles: amaxes 10.5, 1.5, 1.3, 0 -> block scales 448, 64, 56, 0.
    w = np.zeros((32, 32), np.float32)
    w[:16, :16] = 3.5  # 3.5 / 1.75 = 2
    w[3, 7] = 10.5
    w[:16, 16:] = 0.7  # 0.7 * 4 = 2.8 -> 3
    w[15, 31] = -1.5
    w[16:, :16] = 0.6  # 0.6 / 0.21875 = 2.74 -> 3
    w[20, 0] = 1.3
    t = F.nvfp4_quantize(w, block=(16, 16))
    assert float(t.global_scale) == 2.0**-8
    np.testing.assert_array_equal(np.asarray(t.block_scale).astype(np.float32), [[448, 64], [56, 0]])
    q = np.asarray(t.q).astype(np.float32)
    want = np.zeros((32, 32), np.float32)
    want[:16, :16], want[3, 7] = 2, 6
    want[:16, 16:], want[15, 31] = 3, -6
    want[16:, :16], want[20, 0] = 3, 6
    np.testing.assert_array_equal(q, want)


def ref_nvfp4(x, block):
    """numpy/ml_dtypes transcription of TE's NVFP4 reference quantizer (float32 ops)."""
    x = np.asarray(x, np.float32)
    br, bc = block
    x2 = x if br > 1 else x[..., None, :]
    m, n = x2.shape[-2:]
    t = x2.reshape(*x2.shape[:-2], m // br, br, n // bc, bc)
    a = np.where(np.isfinite(t), np.abs(t), np.float32(0)).astype(np.float32)
    f32max = np.finfo(np.float32).max
    amax = a.max()
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.minimum(np.float32(2688.0) / amax, f32max) if amax > 0 else np.float32(1.0)
        g = np.float32(1.0) / s_enc
        bmax = a.max(axis=(-3, -1), keepdims=True)
        bs = np.minimum(bmax * (s_enc * np.float32(1 / 6)), np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
        enc = np.minimum(np.float32(1.0) / (bs.astype(np.float32) * g), f32max)
    q = np.clip(t * enc, -6, 6).astype(ml_dtypes.float4_e2m1fn).reshape(x.shape)
    bs = bs[..., 0, :, 0]
    return q, (bs[..., 0, :] if br == 1 else bs), g


def nv_data(seed, shape):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4, size=shape[:-1] + (1,)))
    x[..., :16] *= rng.uniform(0.001, 10)  # one block far from the others
    return x.astype(np.float32)


@pytest.mark.parametrize("block,shape", [((1, 16), (8, 64)), ((1, 16), (2, 3, 32)), ((16, 16), (32, 48)), ((16, 16), (2, 16, 32))])
@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_matches_numpy_reference(block, shape, seed):
    x = nv_data(seed, shape)
    t = jax.jit(F.nvfp4_quantize, static_argnums=1)(x, block)
    q, bs, g = ref_nvfp4(x, block)
    assert float(t.global_scale) == float(g)
    np.testing.assert_allclose(float(t.global_scale), np.abs(x).max() / 2688, rtol=3e-7)
    np.testing.assert_array_equal(bits(t.block_scale), bits(bs))
    np.testing.assert_array_equal(bits(t.q), bits(q))
    # Dequantization: E2M1 code * block scale * global scale.
    want = q.astype(np.float32).reshape(x.shape)
    s = bs.astype(np.float32).repeat(16, -1)
    if block[0] == 16:
        s = s.repeat(16, -2)
    np.testing.assert_array_equal(np.asarray(F.nvfp4_dequantize(t)), want * s * g)


@SETTINGS
@given(hnp.arrays(np.float32, (2, 32), elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False)))
def test_nvfp4_property_matches_reference(x):
    t = F.nvfp4_quantize(x)
    q, bs, _ = ref_nvfp4(x, (1, 16))
    np.testing.assert_array_equal(bits(t.q), bits(q))
    np.testing.assert_array_equal(bits(t.block_scale), bits(bs))


def test_nvfp4_2d_weight_and_transpose_agree():
    w = nv_data(5, (48, 32))
    deq = lambda a, b: np.asarray(_nv_roundtrip(a, b))
    np.testing.assert_array_equal(deq(w, (16, 16)).T, deq(w.T, (16, 16)))
    # 1D blocks do not have this property (blocks run along different axes).
    assert not np.array_equal(deq(w, (1, 16)).T, deq(w.T, (1, 16)))


def test_nvfp4_all_equal_and_zero_blocks():
    x = np.zeros((3, 32), np.float32)
    x[0] = 3.0
    x[1, :16] = -0.37  # all-equal block, not the tensor amax
    t = F.nvfp4_quantize(x)
    q = np.asarray(t.q).astype(np.float32)
    d = np.asarray(F.nvfp4_dequantize(t))
    np.testing.assert_array_equal(q[0], 6.0)
    np.testing.assert_allclose(d[0], 3.0, rtol=1e-6)
    assert len(np.unique(q[1, :16])) == 1 and np.all(np.abs(d[1, :16] + 0.37) <= 0.37 / 16)
    assert np.all(d[1, 16:] == 0) and np.all(d[2] == 0) and np.isfinite(d).all()
    z = F.nvfp4_quantize(jnp.zeros((4, 16)))
    assert float(z.global_scale) == 1.0
    assert np.all(np.asarray(F.nvfp4_dequantize(z)) == 0)


def test_nvfp4_nan_and_inf_stay_local():
    x = nv_data(7, (4, 32))
    x[1, 20] = np.nan
    x[2, 3] = np.inf
    t = F.nvfp4_quantize(x)
    d = np.asarray(F.nvfp4_dequantize(t))
    assert np.isnan(d[1, 20]) and np.isnan(d[1, 16:]).all()  # the NaN's block
    assert np.isnan(np.asarray(t.block_scale[1, 1]).astype(np.float32))  # carried by the E4M3 scale
    assert np.all(bits(t.q)[1, 16:] == 0)  # E2M1 has no NaN: elements stored as +0
    mask = np.ones_like(d, bool)
    mask[1, 16:] = False
    assert np.isfinite(d[mask]).all()
    # The other blocks are exactly what they would be without the bad values.
    clean = x.copy()
    clean[1, 20], clean[2, 3] = 0.0, 0.0
    dc = np.asarray(_nv_roundtrip(clean, (1, 16)))
    keep = mask.copy()
    keep[2, :16] = False
    np.testing.assert_array_equal(d[keep], dc[keep])
    # +inf saturates to the top of its block: 6 * block_scale * global_scale.
    assert d[2, 3] > 0 and d[2, 3] == np.abs(d[2, :16]).max()


@pytest.mark.parametrize("k", [-100, 100])
def test_nvfp4_huge_and_tiny_are_scale_invariant(k):
    x = nv_data(9, (4, 32))
    t0, t1 = F.nvfp4_quantize(x), F.nvfp4_quantize(x * np.float32(2.0**k))
    np.testing.assert_array_equal(bits(t0.q), bits(t1.q))
    np.testing.assert_array_equal(bits(t0.block_scale), bits(t1.block_scale))
    assert float(t1.global_scale) == float(t0.global_scale) * 2.0**k


def test_nvfp4_near_float32_max():
    x = nv_data(11, (2, 32))
    x = x / np.abs(x).max() * np.float32(3e38)
    d = np.asarray(F.nvfp4_dequantize(F.nvfp4_quantize(x)))
    assert np.isfinite(d).all()
    assert np.linalg.norm(d.astype(np.float64) - x) / np.linalg.norm(x.astype(np.float64)) < 0.2


def test_nvfp4_bad_arguments():
    with pytest.raises(ValueError, match="last dimension has size 20"):
        F.nvfp4_quantize(jnp.ones((4, 20)))
    with pytest.raises(ValueError, match="second-to-last dimension has size 15"):
        F.nvfp4_quantize(jnp.ones((15, 16)), block=(16, 16))
    with pytest.raises(ValueError, match="last dimension has size 24"):
        F.nvfp4_quantize(jnp.ones((16, 24)), block=(16, 16))
    with pytest.raises(ValueError, match="key"):
        F.nvfp4_quantize(jnp.ones((4, 16)), rounding="stochastic")
    with pytest.raises(ValueError, match="rounding"):
        F.nvfp4_quantize(jnp.ones((4, 16)), rounding="up")
    with pytest.raises(ValueError, match="block"):
        F.nvfp4_quantize(jnp.ones((4, 32)), block=(1, 32))
    with pytest.raises(TypeError, match="must be floating"):
        F.nvfp4_quantize(jnp.ones((4, 16), jnp.int32))


def test_nvfp4_stochastic_is_unbiased_given_scales():
    # Block A of the hand example: global scale 2**-8, block scale 448, so the
    # E2M1 grid in x units is 1.75 * {0, .5, 1, 1.5, 2, 3, 4, 6}.
    row = HAND_X[0] * np.float32(0.97)
    row[0] = 10.5  # keep the amax, hence the scales, fixed
    n = 2000
    x = np.broadcast_to(row, (n, 16))
    t = F.nvfp4_quantize(x, rounding="stochastic", key=jax.random.key(4))
    np.testing.assert_array_equal(np.asarray(t.block_scale).astype(np.float32), 448.0)
    d = np.asarray(F.nvfp4_dequantize(t)).astype(np.float64)
    g = 1.75 * grid(F.E2M1)
    lo, hi = neighbours(row.astype(np.float64) / 1.75, F.E2M1)
    lo, hi = lo * 1.75, hi * 1.75  # E2M1 neighbours of x / 1.75, back in x units
    assert np.all(np.isin(d, g))
    assert np.all((d == lo) | (d == hi))
    p = np.where(hi > lo, (row - lo) / np.where(hi > lo, hi - lo, 1), 0)  # x on the grid: p = 0
    sd = (hi - lo) * np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(d.mean(0) - row) <= 5 * sd + 1e-5)


def test_nvfp4_jit_pytree_roundtrip():
    x = nv_data(2, (32, 32))
    for block in [(1, 16), (16, 16)]:
        t = jax.jit(lambda v, b=block: F.nvfp4_quantize(v, block=b))(x)
        # block becomes arrays under jit; dequantize must not depend on it.
        d = jax.jit(F.nvfp4_dequantize)(t)
        np.testing.assert_array_equal(np.asarray(d), np.asarray(F.nvfp4_dequantize(F.nvfp4_quantize(x, block))))


# ------------------------------------------------------------------------ RHT


@pytest.mark.parametrize("n", [2, 4, 16, 64])
def test_hadamard_matrix_definition_and_orthonormal(n):
    h = np.asarray(F.hadamard_matrix(n), np.float64)
    # Sylvester: H[i, j] = (-1)**popcount(i & j) / sqrt(n)
    i, j = np.indices((n, n))
    want = (-1.0) ** np.vectorize(lambda v: bin(v).count("1"))(i & j) / np.sqrt(n)
    np.testing.assert_allclose(h, want, rtol=1e-7)
    np.testing.assert_allclose(h @ h.T, np.eye(n), atol=1e-6)
    with pytest.raises(ValueError):
        F.hadamard_matrix(12)


def test_rht_is_orthonormal_map():
    k = jax.random.key(0)
    # Group i of eye(16) is e_i, so output row i is (H diag(s) e_i)^T = s_i * H[i, :].
    m = np.asarray(F.random_hadamard_transform(jnp.eye(16), k), np.float64)
    np.testing.assert_allclose(m @ m.T, np.eye(16), atol=1e-6)
    ratio = m / np.asarray(F.hadamard_matrix(16), np.float64)
    np.testing.assert_allclose(ratio, np.repeat(ratio[:, :1], 16, 1), rtol=1e-6)
    assert set(np.round(ratio[:, 0]).tolist()) == {-1.0, 1.0}  # real random signs


def test_rht_preserves_gemm_along_contraction_axis():
    ka, kb, k = jax.random.split(jax.random.key(1), 3)
    a = jax.random.normal(ka, (8, 64))
    b = jax.random.normal(kb, (64, 12))
    ra = np.asarray(F.random_hadamard_transform(a, k, axis=1), np.float64)
    rb = np.asarray(F.random_hadamard_transform(b, k, axis=0), np.float64)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    tol = 1e-5 * np.sqrt(64) * np.abs(np.asarray(a)).max() * np.abs(np.asarray(b)).max()
    np.testing.assert_allclose(ra @ rb, exact, atol=tol)
    # Different keys on the two operands do not cancel.
    rb2 = np.asarray(F.random_hadamard_transform(b, jax.random.key(99), axis=0), np.float64)
    assert np.abs(ra @ rb2 - exact).max() > 100 * tol


def test_rht_inverse_and_single_sign_vector():
    k = jax.random.key(2)
    x = jax.random.normal(jax.random.key(3), (3, 48, 5))
    y = F.random_hadamard_transform(x, k, axis=1)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_allclose(np.asarray(F.inverse_random_hadamard_transform(y, k, axis=1)), np.asarray(x), atol=2e-6)
    # One sign vector for the whole tensor: identical groups map identically.
    g = jnp.tile(jnp.arange(16.0), 4)
    yg = np.asarray(F.random_hadamard_transform(g, k)).reshape(4, 16)
    assert np.all(yg == yg[0])
    assert not np.allclose(np.asarray(F.random_hadamard_transform(g, jax.random.key(5))), np.asarray(yg.ravel()))
    with pytest.raises(ValueError, match="size 20"):
        F.random_hadamard_transform(jnp.ones((20,)), k)


# --------------------------------------------------------------- fake_quantize


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_fake_quantize_relative_error_and_dtype():
    x = jax.random.normal(jax.random.key(0), (64, 256))
    assert rel_err(_fq(x, "e4m3"), x) < 0.07
    assert rel_err(_fq(x, "e5m2"), x) < 0.15
    assert rel_err(_fq(x, "mxfp8"), x) < 0.07
    assert rel_err(_fq(x, "nvfp4"), x) < 0.2
    assert rel_err(_fq(x, "nvfp4", block=(16, 16)), x) < 0.2
    assert rel_err(_fq(x, "nvfp4", rounding="stochastic", key=jax.random.key(1)), x) < 0.3
    xb = x.astype(jnp.bfloat16)
    for fmt in ["e4m3", "e5m2", "mxfp8", "nvfp4"]:
        assert _fq(xb, fmt).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="fmt"):
        F.fake_quantize(x, "int8")


def test_fake_quantize_e4m3_matches_reference_and_ste_grad():
    x = np.asarray(jax.random.normal(jax.random.key(1), (4, 64)))
    scale = float(F.compute_scale(np.abs(x).max(), 448.0))  # compute_scale is tested above
    np.testing.assert_allclose(scale, np.abs(x).max() / 448, rtol=2e-7)
    want = ref_fp8(x, F.E4M3, scale).astype(np.float32) * np.float32(scale)
    np.testing.assert_array_equal(np.asarray(F.fake_quantize(x, "e4m3")), want)
    w = jax.random.normal(jax.random.key(2), x.shape)
    for fmt in ["e4m3", "nvfp4"]:
        g = jax.jit(jax.grad(lambda v: jnp.sum(F.fake_quantize(v, fmt) * w)))(jnp.asarray(x))
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))  # straight-through


def test_compute_scale_never_subnormal():
    """A subnormal scale would give inf = 1/scale on a GPU (subnormals kept): fall back to 1."""
    tiny = np.float32(np.finfo(np.float32).tiny)
    s = np.asarray(F.compute_scale(jnp.float32(tiny * 448 / 4), 448.0))
    assert s == 1.0
    ok = np.asarray(F.compute_scale(jnp.float32(tiny * 448 * 4), 448.0))
    assert ok == np.float32(tiny * 4)
