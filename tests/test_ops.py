"""repro.precision.ops against independent numpy/ml_dtypes references (CPU).

Quantized references are rebuilt here from ml_dtypes casts (not from repro.precision.formats), and
products are taken in float64.
"""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro.hardware import lookup
from repro.precision import block_scaled, gemm, ops
from repro.precision.recipes import resolve
from repro.precision.scaling import DelayedScalingState

E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
E2M1 = ml_dtypes.float4_e2m1fn

# An FP8 (per-tensor scaled, e4m3) GEMM on N(0,1) data has relative Frobenius error ~0.04
# against the exact product (3 mantissa bits: each operand element is rounded by up to 2**-4
# of its value); e5m2 gradients (2 mantissa bits) ~2x that. The tolerances leave room.
FP8_FWD_TOL = 0.08
FP8_GRAD_TOL = 0.1


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def randn(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------- numpy references


def np_fp8(a, dtype, scale):
    """Saturating RNE cast of a / scale, dequantized to float64 (scale not applied)."""
    fmax = float(ml_dtypes.finfo(dtype).max)
    y = np.clip(np.asarray(a, np.float32) / np.float32(scale), -fmax, fmax)
    return y.astype(dtype).astype(np.float64)


def np_scale(a, dtype):
    return np.float32(np.max(np.abs(a))) / np.float32(ml_dtypes.finfo(dtype).max)


def np_nvfp4(a, block):
    """NVFP4 (arXiv 2509.25149) quantize-dequantize of a 2-D float32 array, float64 out."""
    a = np.asarray(a, np.float32)
    R, C = a.shape
    br, bc = block
    amax = np.abs(a).max()
    gs = np.float32(amax / np.float32(448.0 * 6.0)) if amax > 0 else np.float32(1.0)
    t = a.reshape(R // br, br, C // bc, bc)
    bmax = np.abs(t).max(axis=(1, 3), keepdims=True)
    bs = ((bmax / np.float32(6.0)) / gs).astype(E4M3).astype(np.float32)
    denom = bs * gs
    y = np.where(denom > 0, t / np.where(denom > 0, denom, 1), 0).astype(np.float32)
    q = np.clip(y, -6, 6).astype(E2M1).astype(np.float32)
    return ((q * bs).astype(np.float64) * np.float64(gs)).reshape(R, C)


def np_mxfp8(a):
    """OCP MXFP8 quantize-dequantize along the last axis (blocks of 32), float64 out."""
    a = np.asarray(a, np.float32)
    R, C = a.shape
    t = a.reshape(R, C // 32, 32)
    bmax = np.abs(t).max(-1, keepdims=True).astype(np.float64)
    e = np.where(bmax > 0, np.floor(np.log2(np.where(bmax > 0, bmax, 1))) - 8, 0)
    q = np.clip(t * np.exp2(-e), -448, 448).astype(np.float32).astype(E4M3)
    return (q.astype(np.float64) * np.exp2(e)).reshape(R, C)


# ---------------------------------------------------------------------------- FP8


def _fp8_grads(recipe, x, w, c, meta=None):
    def loss(x, w, meta):
        return jnp.sum(ops.fp8_dot(x, w, recipe, meta).astype(jnp.float32) * c)

    y, (gx, gw, gm) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(x, w, meta)
    return ops.fp8_dot(x, w, recipe, meta), gx, gw, gm


def test_fp8_dot_current_matches_quantized_reference_and_exact_product():
    x, w, c = randn(0, (2, 24, 64)), randn(1, (64, 48), 0.1), randn(2, (2, 24, 48))
    r32 = resolve("fp8-current", compute_dtype="float32")  # f32 output: tight comparison
    y, gx, gw, _ = _fp8_grads(r32, x, w, c)

    x2, c2 = x.reshape(-1, 64), c.reshape(-1, 48)
    sx, sw, sg = np_scale(x, E4M3), np_scale(w, E4M3), np_scale(c, E5M2)
    xq, wq, gq = np_fp8(x2, E4M3, sx), np_fp8(w, E4M3, sw), np_fp8(c2, E5M2, sg)
    y_ref = (xq @ wq) * (float(sx) * float(sw))
    gx_ref = (gq @ wq.T) * (float(sg) * float(sw))
    gw_ref = (xq.T @ gq) * (float(sx) * float(sg))
    for got, ref in ((y.reshape(-1, 48), y_ref), (gx.reshape(-1, 64), gx_ref), (gw, gw_ref)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())

    # Against the unquantized float64 products: FP8 tolerance.
    x64, w64, c64 = (a.astype(np.float64) for a in (x2, w, c2))
    assert rel(y.reshape(-1, 48), x64 @ w64) < FP8_FWD_TOL
    assert rel(gx.reshape(-1, 64), c64 @ w64.T) < FP8_GRAD_TOL
    assert rel(gw, x64.T @ c64) < FP8_GRAD_TOL
    # ...and it really is quantized (a BF16 GEMM would be ~0.003)
    assert rel(y.reshape(-1, 48), x64 @ w64) > 0.01


def test_fp8_dot_default_recipe_dtypes():
    r = resolve("fp8-current")
    x = jnp.asarray(randn(3, (8, 32))).astype(jnp.bfloat16)
    w = jnp.asarray(randn(4, (32, 16), 0.1))
    y = ops.fp8_dot(x, w, r)
    assert y.dtype == jnp.bfloat16 and y.shape == (8, 16)
    gx, gw = jax.grad(lambda x, w: jnp.sum(ops.fp8_dot(x, w, r).astype(jnp.float32)),
                      argnums=(0, 1))(x, w)
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.float32
    assert rel(y.astype(np.float32), np.asarray(x, np.float64) @ np.asarray(w)) < FP8_FWD_TOL


_DOT_RE = re.compile(r"stablehlo\.dot_general.*?:\s*\(tensor<[0-9x]*x?(\w+)>,\s*tensor<[0-9x]*x?(\w+)>\)")


def _dot_operand_types(text):
    return [m.groups() for m in _DOT_RE.finditer(text)]


@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_fp8_dot_hlo_feeds_fp8_operands_to_all_three_gemms(scaling):
    r = resolve(f"fp8-{scaling}", amax_history_len=4)
    x, w = jnp.ones((16, 32), jnp.bfloat16), jnp.ones((32, 8), jnp.float32)
    meta = ops.init_meta(4)
    fwd = jax.jit(lambda x, w, m: ops.fp8_dot(x, w, r, m)).lower(x, w, meta).as_text()
    assert _dot_operand_types(fwd) == [("f8E4M3FN", "f8E4M3FN")]

    def loss(x, w, m):
        return jnp.sum(ops.fp8_dot(x, w, r, m).astype(jnp.float32))

    # value_and_grad: under plain grad the forward GEMM is dead code (its output is unused)
    bwd = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(x, w, meta).as_text()
    types = _dot_operand_types(bwd)
    assert len(types) == 3, types  # no extra (BF16) GEMM anywhere
    assert ("f8E4M3FN", "f8E4M3FN") in types  # forward
    assert ("f8E5M2", "f8E4M3FN") in types  # dgrad: g . w^T
    assert ("f8E4M3FN", "f8E5M2") in types  # wgrad: x^T . g


def test_fp8_dot_delayed_uses_stored_scales_and_returns_updated_meta():
    L = 4
    r = resolve("fp8-delayed", compute_dtype="float32", amax_history_len=L)
    x, w, c = randn(5, (16, 32), 3.0), randn(6, (32, 24), 0.1), randn(7, (16, 24), 1e-3)
    hist = {"input": [2.0, 9.0, 1.0, 5.0], "kernel": [0.3, 0.1, 0.2, 0.7],
            "output_grad": [1e-3, 2e-3, 0.0, 0.0]}
    scales = {"input": 0.02, "kernel": 0.001, "output_grad": 1e-7}
    meta = {k: DelayedScalingState(jnp.asarray(hist[k], jnp.float32), jnp.float32(scales[k]))
            for k in ops.META_KEYS}
    y, gx, gw, gm = _fp8_grads(r, x, w, c, meta)

    # forward and gradients quantized with the STORED scales, not the current amaxes
    sx, sw, sg = (np.float32(scales[k]) for k in ops.META_KEYS)
    xq, wq, gq = np_fp8(x, E4M3, sx), np_fp8(w, E4M3, sw), np_fp8(c, E5M2, sg)
    np.testing.assert_allclose(y, (xq @ wq) * (float(sx) * float(sw)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw, (xq.T @ gq) * (float(sx) * float(sg)), rtol=1e-5, atol=1e-9)

    # the meta "gradient" is the updated state: history rolled by one, newest amax in front
    amaxes = {"input": np.abs(x).max(), "kernel": np.abs(w).max(), "output_grad": np.abs(c).max()}
    fmax = {"input": 448.0, "kernel": 448.0, "output_grad": 57344.0}
    for k in ops.META_KEYS:
        expect = np.array([amaxes[k]] + hist[k][:-1], np.float32)
        np.testing.assert_allclose(gm[k].amax_history, expect, rtol=1e-6)
        np.testing.assert_allclose(gm[k].scale, expect.max() / fmax[k], rtol=1e-6)


def test_fp8_dot_delayed_most_recent_and_margin():
    r = resolve("fp8-delayed", amax_history_len=3, amax_compute_algo="most_recent", margin=1)
    x, w = randn(8, (8, 16)), randn(9, (16, 8), 0.1)
    meta = {k: DelayedScalingState(jnp.asarray([100.0, 100.0, 100.0]), jnp.float32(1.0))
            for k in ops.META_KEYS}
    gm = jax.grad(lambda m: jnp.sum(ops.fp8_dot(x, w, r, m).astype(jnp.float32)))(meta)
    np.testing.assert_allclose(gm["input"].scale, np.abs(x).max() / 448.0 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(gm["kernel"].amax_history, [np.abs(w).max(), 100.0, 100.0])


@pytest.mark.parametrize("scaling", ["current", "delayed", "none"])
def test_fp8_dot_nan_propagates(scaling):
    r = resolve(f"fp8-{scaling}" if scaling != "none" else "fp8-noscale", amax_history_len=2)
    x = randn(10, (4, 16))
    x[1, 3] = np.nan
    y = np.asarray(ops.fp8_dot(x, randn(11, (16, 8), 0.1), r, ops.init_meta(2)), np.float32)
    assert np.isnan(y[1]).all()
    assert np.isfinite(np.delete(y, 1, axis=0)).all()


def test_fp8_noscale_saturates_and_underflows_current_does_not():
    x = np.array([[1000.0, -3000.0, 1e-4, 2.0] * 4], np.float32)  # [1, 16]
    w = np.eye(16, dtype=np.float32)
    y = np.asarray(ops.fp8_dot(x, w, resolve("fp8-noscale", compute_dtype="float32")))
    np.testing.assert_array_equal(y[0, :4], [448.0, -448.0, 0.0, 2.0])
    y = np.asarray(ops.fp8_dot(x, w, resolve("fp8-current", compute_dtype="float32")))
    np.testing.assert_allclose(y[0, :2], [1000.0, -3000.0], rtol=0.07)


def test_fp8_dot_rejects_bad_inputs():
    x, w = np.ones((4, 16), np.float32), np.ones((16, 8), np.float32)
    with pytest.raises(ValueError, match="meta"):
        ops.fp8_dot(x, w, resolve("fp8-delayed"))
    with pytest.raises(ValueError, match="gemm=.mxfp8., not .fp8."):
        ops.fp8_dot(x, w, resolve("mxfp8"))
    with pytest.raises(ValueError, match="contraction"):
        ops.fp8_dot(x, w.T, resolve("fp8-current"))


# ----------------------------------------------------------------------- MXFP8


def test_mxfp8_dot_forward_and_grads_match_references():
    r = resolve("mxfp8", compute_dtype="float32")
    x, w, c = randn(12, (32, 64)), randn(13, (64, 40), 0.1), randn(14, (32, 40))
    y = jax.jit(lambda x, w: ops.mxfp8_dot(x, w, r, backend="emulated"))(x, w)
    # forward: x blocks along K, w blocks along K (rows of w^T)
    y_ref = np_mxfp8(x) @ np_mxfp8(w.T).T
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5 * np.abs(y_ref).max())
    assert rel(y, x.astype(np.float64) @ w) < 0.08

    gx, gw = jax.jit(jax.grad(lambda x, w: jnp.sum(ops.mxfp8_dot(x, w, r) * c), (0, 1)))(x, w)
    # dgrad: g and w blocked along N (N=40 is zero-padded to 64)
    pad = lambda a: np.pad(a, ((0, 0), (0, 64 - a.shape[1])))  # noqa: E731
    gx_ref = np_mxfp8(pad(c)) @ np_mxfp8(pad(w)).T
    np.testing.assert_allclose(gx, gx_ref, rtol=1e-5, atol=1e-5 * np.abs(gx_ref).max())
    # wgrad: x^T and g^T blocked along M
    gw_ref = np_mxfp8(x.T) @ np_mxfp8(c.T).T
    np.testing.assert_allclose(gw, gw_ref, rtol=1e-5, atol=1e-5 * np.abs(gw_ref).max())


# ----------------------------------------------------------------------- NVFP4

NV_KEY = jax.random.PRNGKey(42)


@pytest.mark.parametrize("block_2d", [True, False])
def test_nvfp4_dot_forward_matches_reference(block_2d):
    r = resolve("nvfp4", compute_dtype="float32", weight_block_2d=block_2d)
    x, w = randn(15, (2, 16, 64)), randn(16, (64, 32), 0.1)
    y = jax.jit(lambda x, w: ops.nvfp4_dot(x, w, r, NV_KEY, backend="emulated"))(x, w)
    wd = np_nvfp4(w, (16, 16)) if block_2d else np_nvfp4(w.T, (1, 16)).T
    y_ref = np_nvfp4(x.reshape(-1, 64), (1, 16)) @ wd
    np.testing.assert_allclose(y.reshape(-1, 32), y_ref, rtol=1e-5,
                               atol=1e-5 * np.abs(y_ref).max())
    assert rel(y.reshape(-1, 32), x.reshape(-1, 64).astype(np.float64) @ w) < 0.2


def test_nvfp4_dgrad_uses_same_2d_weight_and_nearest_reference():
    r = resolve("nvfp4", compute_dtype="float32", stochastic_rounding=False, rht=False)
    x, w, c = randn(17, (32, 48), 1.0), randn(18, (48, 32), 0.1), randn(19, (32, 32))
    gx, gw = jax.jit(jax.grad(lambda x, w: jnp.sum(ops.nvfp4_dot(x, w, r) * c), (0, 1)))(x, w)
    # w is 48 x 32: 16x16 blocks; K=48 on the dgrad output
    gx_ref = np_nvfp4(c, (1, 16)) @ np_nvfp4(w, (16, 16)).T
    np.testing.assert_allclose(gx, gx_ref, rtol=1e-5, atol=1e-5 * np.abs(gx_ref).max())
    gw_ref = np_nvfp4(x.T, (1, 16)) @ np_nvfp4(c.T, (1, 16)).T
    np.testing.assert_allclose(gw, gw_ref, rtol=1e-5, atol=1e-5 * np.abs(gw_ref).max())


def _nvfp4_wgrad(recipe, x, w, c, key):
    return jax.jit(jax.grad(lambda w: jnp.sum(ops.nvfp4_dot(x, w, recipe, key) * c)))(w)


def test_nvfp4_rht_is_exact_without_quantization(monkeypatch):
    """With identity 'quantization', RHT on both wgrad inputs leaves x^T g unchanged."""

    def identity_rows(a, rounding="nearest", key=None):
        a = gemm._pad_axis(jnp.asarray(a, jnp.float32), 1, 16)
        return a, jnp.ones((a.shape[0], a.shape[1] // 16), jnp.float32), None

    monkeypatch.setattr(block_scaled, "_nvfp4_rows", identity_rows)
    monkeypatch.setattr(block_scaled, "_dequant_rows", lambda q, s: q)
    x, w, c = randn(20, (40, 16)), randn(21, (16, 16)), randn(22, (40, 16))  # M=40: padded
    exact = x.astype(np.float64).T @ c
    for rht in (True, False):
        r = resolve("nvfp4", compute_dtype="float32", weight_block_2d=False, rht=rht)
        gw = _nvfp4_wgrad(r, x, w, c, NV_KEY)
        np.testing.assert_allclose(gw, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())


def test_nvfp4_rht_changes_quantized_wgrad_within_bounds():
    x, w, c = randn(23, (64, 32)), randn(24, (32, 16), 0.1), randn(25, (64, 16))
    exact = x.astype(np.float64).T @ c
    base = resolve("nvfp4", compute_dtype="float32", stochastic_rounding=False)
    gw_rht = np.asarray(_nvfp4_wgrad(base, x, w, c, NV_KEY))
    gw_plain = np.asarray(_nvfp4_wgrad(base.replace(rht=False), x, w, c, NV_KEY))
    assert not np.allclose(gw_rht, gw_plain)  # the transform is really applied
    assert rel(gw_rht, exact) < 0.25 and rel(gw_plain, exact) < 0.25


def test_nvfp4_stochastic_rounding_makes_wgrad_unbiased():
    M, K, N = 32, 16, 16
    x, w = randn(26, (M, K)), randn(27, (K, N), 0.1)
    c = np.clip(randn(28, (M, N), 0.4), -0.9, 0.9)
    c[::16, :] = 1.0  # every 16-block of g^T holds the tensor amax: exact E4M3 block scales
    r = resolve("nvfp4", compute_dtype="float32", rht=False)
    target = np_nvfp4(x.T, (1, 16)) @ c.astype(np.float64)  # x rounded to nearest, g exact

    keys = jax.random.split(jax.random.PRNGKey(0), 256)
    gws = np.asarray(jax.jit(jax.vmap(lambda k: _nvfp4_wgrad(r, x, w, c, k)))(keys))
    gw_nearest = np.asarray(_nvfp4_wgrad(r.replace(stochastic_rounding=False), x, w, c, None))
    err_mean, err_one = rel(gws.mean(0), target), rel(gws[0], target)
    err_nearest = rel(gw_nearest, target)
    assert err_nearest > 0.005  # round-to-nearest of g is biased here...
    assert err_mean < 0.3 * err_nearest  # ...the mean of stochastic roundings is not
    assert err_mean < 0.25 * err_one  # noise averages out (~1/sqrt(256))
    assert len({float(g[0, 0]) for g in gws[:8]}) > 1  # different keys, different roundings


def test_nvfp4_needs_key_when_random():
    x, w = np.ones((16, 16), np.float32), np.ones((16, 16), np.float32)
    with pytest.raises(ValueError, match="key"):
        ops.nvfp4_dot(x, w, resolve("nvfp4"))
    jax.jit(lambda x, w: ops.nvfp4_dot(x, w, resolve("nvfp4", rht=False,
                                                        stochastic_rounding=False)))(x, w)


def test_nvfp4_meta_step_gradient_counts():
    r = resolve("nvfp4")
    x, w = randn(29, (16, 16)), randn(30, (16, 16))
    g = jax.jit(jax.grad(lambda m: jnp.sum(ops.nvfp4_dot(x, w, r, NV_KEY, m)
                                           .astype(jnp.float32))))({"step": jnp.float32(7.0)})
    assert float(g["step"]) == 8.0


def test_block_scaled_native_path_traces():
    """The native path builds jax.nn.scaled_matmul calls (no CPU lowering: trace only)."""
    x, w = jnp.ones((32, 64)), jnp.ones((64, 32))
    for fn in (lambda x, w: ops.mxfp8_dot(x, w, resolve("mxfp8"), backend="native"),
               lambda x, w: ops.nvfp4_dot(x, w, resolve("nvfp4"), NV_KEY, backend="native")):
        jaxpr = str(jax.make_jaxpr(jax.grad(lambda x, w: jnp.sum(fn(x, w)), (0, 1)))(x, w))
        assert jaxpr.count("scaled_matmul") >= 3


# ---------------------------------------------------------------- dispatch and dot()


def test_dispatch_by_hardware():
    b200, h200, cpu = lookup("b200"), lookup("h200"), lookup("cpu")
    assert ops.block_scaled_backend(b200) == "native"
    assert ops.block_scaled_backend(h200) == "emulated"
    assert ops.block_scaled_backend(cpu) == "emulated"
    assert ops.is_emulated(resolve("nvfp4"), h200) and ops.is_emulated(resolve("mxfp8"), cpu)
    assert not ops.is_emulated(resolve("nvfp4"), b200)
    assert not ops.is_emulated(resolve("fp8-current"), h200)
    assert ops.is_emulated(resolve("fp8-delayed"), cpu)
    assert not ops.is_emulated(resolve("bf16"), cpu)


def test_dot_dense_recipes():
    x, w = randn(31, (3, 8, 32)), randn(32, (32, 16))
    exact = x.astype(np.float64) @ w
    y = ops.dot(x, w, resolve("fp32"))
    assert y.dtype == jnp.float32 and rel(y, exact) < 1e-6
    y = ops.dot(x, w, resolve("bf16"))
    assert y.dtype == jnp.bfloat16 and 1e-4 < rel(y.astype(np.float32), exact) < 0.01
    y = ops.dot(x, w, resolve("fp16"))
    assert y.dtype == jnp.float16 and rel(y.astype(np.float32), exact) < 0.002


def test_bf16_dense_backward_gemms_stay_bf16():
    """The BF16 baseline must not fall back to FP32 GEMMs in its backward pass."""
    import re

    from repro.precision.recipes import resolve

    r = resolve("bf16")
    x = jnp.ones((8, 16), jnp.bfloat16)
    w = jnp.ones((16, 4), jnp.float32)

    def f(x, w):
        return ops.dense_dot(x, w, r).astype(jnp.float32).sum()

    txt = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, w).as_text()
    dots = re.findall(r"dot_general.*", txt)
    assert len(dots) == 2
    assert all(re.search(r"\(tensor<[0-9x]+xbf16>, tensor<[0-9x]+xbf16>\) -> tensor<[0-9x]+xbf16>", d)
               for d in dots), dots
