"""repro.precision.int8 against independent numpy references (CPU).

The quantizer is rebuilt here from numpy alone (float64 products rounded to float32, ``np.rint``
for ties to even); the integer GEMMs are int64 numpy products (exact), so every integer step is
compared bit for bit. The float epilogue (INT32 -> float32, times the product of the scales, cast
to the output dtype) is rebuilt in the same order, so outputs and gradients are bit-exact too,
except the bias gradient (a float sum, whose order XLA chooses). A float64 product of the
unquantized operands checks that the whole is the right product, not only a faithful copy.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro import hardware
from repro.hardware import lookup
from repro.precision import int8, layers, ops
from repro.precision.recipes import resolve, value_formats

BF16 = ml_dtypes.bfloat16


def randn(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------- numpy references


def np_scale(amax):
    """amax / 127 in float32; 1.0 where amax is 0 or not finite."""
    amax = np.asarray(amax, np.float32)
    with np.errstate(invalid="ignore"):
        s = amax / np.float32(127)
    return np.where(np.isfinite(amax) & (amax > 0), s, np.float32(1)).astype(np.float32)


def np_q(x, s):
    """Symmetric INT8: float32 product x * (1/s), NaN -> 0, clip to +-127, round half even."""
    inv = (np.float32(1) / np.asarray(s, np.float32)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (np.asarray(x, np.float32).astype(np.float64) * inv.astype(np.float64)).astype(
            np.float32)
    y = np.clip(np.where(np.isnan(y), np.float32(0), y), -127, 127)
    return np.rint(y).astype(np.int8)


def np_gemm(a, b):
    """Exact integer product (int64), as float32 (round to nearest even)."""
    return (a.astype(np.int64) @ b.astype(np.int64)).astype(np.float32)


def np_forward(x, w, per_channel=True):
    """(y float32 before the output cast, xq, sx, wq, sw) of the INT8 forward product."""
    sx = np_scale(np.max(np.abs(x)))
    xq = np_q(x, sx)
    sw = np_scale(np.max(np.abs(w), axis=0)) if per_channel else np_scale(np.max(np.abs(w)))
    wq = np_q(w, sw[None, :] if per_channel else sw)
    return np_gemm(xq, wq) * (sx * sw), xq, sx, wq, sw


def np_backward(x, w, g, per_channel=True):
    """(dx, dw) float32 of the INT8 backward products for output gradient ``g``."""
    _, xq, sx, wq, sw = np_forward(x, w, per_channel)
    g = np.asarray(g, np.float32)
    sg = np_scale(np.max(np.abs(g)))
    gq = np_q(g, sg)
    dw = np_gemm(xq.T, gq) * (sx * sg)
    if per_channel:
        g1 = (g * sw[None, :]).astype(np.float32)
        sg1 = np_scale(np.max(np.abs(g1)))
        dx = np_gemm(np_q(g1, sg1), wq.T) * sg1
    else:
        dx = np_gemm(gq, wq.T) * (sg * sw)
    return dx.astype(np.float32), dw.astype(np.float32)


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


# ------------------------------------------------------------------------ the format


def test_quantize_every_tie_saturation_zero_nan_and_inf_against_numpy():
    ks = np.arange(-140, 141, dtype=np.float32)
    x = np.concatenate([ks, ks + 0.5, ks - 0.5, ks + 0.25, [0.0, -0.0, 1e-45, -1e-45,
                        3e38, -3e38, np.inf, -np.inf, np.nan, -np.nan]]).astype(np.float32)
    for s in (1.0, 0.5, 2.0 ** -7, 3.7e-3, 1e3):
        got = np.asarray(jax.jit(int8.int8_quantize)(x, jnp.float32(s)))
        want = np_q(x, np.float32(s))
        assert got.dtype == np.int8 and np.array_equal(got, want), s
    got = np.asarray(int8.int8_quantize(x, 1.0))
    assert got[ks.size + 140 + 0] == 0 and got[ks.size + 141] == 2  # 0.5 -> 0, 1.5 -> 2: even
    assert got[-6:-4].tolist() == [127, -127] and got[-4:-2].tolist() == [127, -127]  # saturate
    assert got[-2:].tolist() == [0, 0]  # NaN has no INT8 value: 0, flagged by the scale
    assert np.abs(np.asarray(int8.int8_quantize(randn(0, (4096,), 1e4), 1.0))).max() == 127


def test_quantize_bf16_inputs_and_per_column_scales():
    x = randn(1, (64, 16), 3.0)
    xb = x.astype(BF16)
    s = np_scale(np.abs(x).max(axis=0))
    got = np.asarray(int8.int8_quantize(jnp.asarray(xb), jnp.asarray(s)[None, :]))
    assert np.array_equal(got, np_q(xb.astype(np.float32), s[None, :]))
    assert np.abs(got).max(axis=0).tolist() == [127] * 16  # each column's amax maps to 127


def test_scale_is_amax_over_127_and_one_where_nothing_can_be_adapted_to():
    a = np.asarray([0.0, 1.0, 127.0, 3e-30, np.inf, np.nan, 1e-44], np.float32)
    got = np.asarray(int8.int8_scale(jnp.asarray(a)))
    assert np.array_equal(got[:4], np_scale(a[:4]))
    assert got[4:].tolist() == [1.0, 1.0, 1.0]  # inf, NaN, and a subnormal scale: 1.0
    assert float(int8.int8_scale(127.0, margin=2)) == 4.0


def test_dequantize_and_bad_arguments():
    q = jnp.asarray([-127, 0, 5, 127], jnp.int8)
    assert np.asarray(int8.int8_dequantize(q, 0.5)).tolist() == [-63.5, 0.0, 2.5, 63.5]
    with pytest.raises(ValueError, match="int8_quantize: scale must be a positive"):
        int8.int8_quantize(jnp.ones(3), 0.0)
    with pytest.raises(TypeError, match="int8_quantize: input must be floating"):
        int8.int8_quantize(jnp.ones(3, jnp.int32), 1.0)


# ---------------------------------------------------------------------- the products


@pytest.mark.parametrize("per_channel", [True, False])
def test_forward_is_bit_exact_and_close_to_float64(per_channel):
    r = resolve("int8" if per_channel else "int8:int8_weight_scale=tensor")
    x, w = randn(2, (96, 128)), randn(3, (128, 80), 0.05)
    w[:, 7] *= 40  # one loud output channel: per-channel scales keep the others fine
    y = jax.jit(lambda a, b: int8.int8_dot(a, b, r))(jnp.asarray(x), jnp.asarray(w))
    ref, *_ = np_forward(x, w, per_channel)
    assert y.dtype == jnp.bfloat16
    assert np.array_equal(bits(y), bits(ref.astype(BF16)))
    exact = x.astype(np.float64) @ w.astype(np.float64)
    err = np.linalg.norm(np.asarray(y, np.float64) - exact) / np.linalg.norm(exact)
    assert err < (0.02 if per_channel else 0.2)


def test_per_channel_weights_beat_per_tensor_on_uneven_channels():
    x, w = randn(4, (64, 128)), randn(5, (128, 32), 0.02)
    w[:, 0] *= 100
    exact = (x.astype(np.float64) @ w.astype(np.float64))[:, 1:]
    errs = []
    for name in ("int8", "int8:int8_weight_scale=tensor"):
        y = np.asarray(int8.int8_dot(jnp.asarray(x), jnp.asarray(w), resolve(name)), np.float64)
        errs.append(np.linalg.norm(y[:, 1:] - exact) / np.linalg.norm(exact))
    assert errs[0] < 0.02 < errs[1]


@pytest.mark.parametrize("per_channel", [True, False])
def test_gradients_are_bit_exact_and_close_to_float64(per_channel):
    r = resolve("int8" if per_channel else "int8:int8_weight_scale=tensor")
    x, w, b = randn(6, (64, 96)), randn(7, (96, 48), 0.1), randn(8, (48,))
    g = randn(9, (64, 48)).astype(BF16)
    _, vjp = jax.vjp(lambda a, c, d: int8.int8_dense(a, c, d, r), jnp.asarray(x), jnp.asarray(w),
                     jnp.asarray(b))
    dx, dw, db = vjp(jnp.asarray(g))
    ref_dx, ref_dw = np_backward(x, w, g.astype(np.float32), per_channel)
    assert dx.dtype == dw.dtype == db.dtype == jnp.float32
    assert np.array_equal(bits(dx), bits(ref_dx)) and np.array_equal(bits(dw), bits(ref_dw))
    np.testing.assert_allclose(np.asarray(db), g.astype(np.float64).sum(0), rtol=1e-5,
                               atol=1e-5)
    g64 = g.astype(np.float64)
    for got, exact in ((dx, g64 @ w.T.astype(np.float64)), (dw, x.T.astype(np.float64) @ g64)):
        e = np.linalg.norm(np.asarray(got, np.float64) - exact) / np.linalg.norm(exact)
        assert e < 0.03


def test_bias_and_relu_inside_the_product_are_exact():
    r = resolve("int8")
    x, w, b = randn(10, (32, 64)), randn(11, (64, 40), 0.1), randn(12, (40,))
    y = int8.int8_dense(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), r, "relu")
    ref, *_ = np_forward(x, w)
    z = (ref.astype(BF16).astype(np.float32) + b.astype(BF16).astype(np.float32)).astype(BF16)
    assert np.array_equal(bits(y), bits(np.maximum(z, BF16(0))))
    # the ReLU's gradient masks exactly where the output was positive
    gx = jax.grad(lambda a: jnp.sum(int8.int8_dense(a, jnp.asarray(w), jnp.asarray(b), r,
                                                    "relu").astype(jnp.float32)))(jnp.asarray(x))
    g = (np.asarray(z, np.float32) > 0).astype(np.float32)
    ref_dx, _ = np_backward(x, w, g)
    assert np.array_equal(bits(gx), bits(ref_dx))


def test_nan_spreads_to_the_whole_product_and_inf_saturates():
    r = resolve("int8")
    x, w = randn(13, (16, 32)), randn(14, (32, 8))
    xn = x.copy()
    xn[3, 5] = np.nan
    assert np.isnan(np.asarray(int8.int8_dot(jnp.asarray(xn), jnp.asarray(w), r),
                               np.float32)).all()
    wn = w.copy()
    wn[0, 2] = np.nan
    assert np.isnan(np.asarray(int8.int8_dot(jnp.asarray(x), jnp.asarray(wn), r),
                               np.float32)).all()
    xi = x.copy()
    xi[0, 0] = np.inf  # amax inf: scale 1.0, inf saturates to 127, as the FP8 path does
    y = np.asarray(int8.int8_dot(jnp.asarray(xi), jnp.asarray(w), r), np.float32)
    assert np.isfinite(y).all()
    want = np_gemm(np_q(xi, np.float32(1)), np_q(w, np_scale(np.abs(w).max(0))[None, :])) \
        * np_scale(np.abs(w).max(0))
    assert np.array_equal(bits(y.astype(BF16)), bits(want.astype(BF16)))
    _, vjp = jax.vjp(lambda a, c: int8.int8_dot(a, c, r), jnp.asarray(x), jnp.asarray(w))
    gn = np.ones((16, 8), np.float32)
    gn[1, 1] = np.nan
    dx, dw = vjp(jnp.asarray(gn, jnp.bfloat16))
    assert np.isnan(np.asarray(dx)).all() and np.isnan(np.asarray(dw)).all()


def test_zeros_give_zeros():
    r = resolve("int8")
    y = int8.int8_dot(jnp.zeros((8, 16)), jnp.zeros((16, 4)), r)
    assert np.asarray(y, np.float32).tolist() == np.zeros((8, 4)).tolist()


def test_products_are_int8_times_int8_into_int32():
    r = resolve("int8")
    f = jax.grad(lambda a, c: jnp.sum(int8.int8_dot(a, c, r).astype(jnp.float32)), (0, 1))
    jaxpr = str(jax.make_jaxpr(f)(jnp.ones((8, 16)), jnp.ones((16, 4))))
    assert jaxpr.count("dot_general[") == 3  # forward, data gradient, weight gradient
    assert jaxpr.count("preferred_element_type=int32") == 3


def test_batched_inputs_flatten_and_errors_name_the_culprit():
    r = resolve("int8")
    x, w = randn(15, (2, 3, 16)), randn(16, (16, 8))
    y = int8.int8_dot(jnp.asarray(x), jnp.asarray(w), r)
    y2 = int8.int8_dot(jnp.asarray(x.reshape(6, 16)), jnp.asarray(w), r)
    assert y.shape == (2, 3, 8) and np.array_equal(bits(y.reshape(6, 8)), bits(y2))
    with pytest.raises(ValueError, match="int8_dot: recipe 'fp8-delayed' has gemm='fp8'"):
        int8.int8_dot(jnp.asarray(x), jnp.asarray(w), resolve("fp8-delayed"))
    with pytest.raises(ValueError, match="int8_dense: recipe .* scaling='delayed'; INT8 scaling"):
        int8.int8_dense(jnp.asarray(x), jnp.asarray(w), None, resolve("int8:scaling=delayed"))
    with pytest.raises(ValueError, match="int8_dense: bias shape"):
        int8.int8_dense(jnp.asarray(x), jnp.asarray(w), jnp.ones(3), resolve("int8"))
    with pytest.raises(ValueError, match="int8_weight_scale=.row. is not one of"):
        resolve("int8:int8_weight_scale=row")


# ---------------------------------------------------------- recipes, layers, the device


def test_dot_and_dense_layer_run_the_int8_ops():
    x, w = randn(17, (8, 32)), randn(18, (32, 16))
    r = resolve("int8")
    assert np.array_equal(bits(ops.dot(jnp.asarray(x), jnp.asarray(w), r)),
                          bits(int8.int8_dot(jnp.asarray(x), jnp.asarray(w), r)))
    m = layers.Dense(16, recipe=resolve("int8"), activation="relu")
    v = m.init(jax.random.key(0), x)
    k, b = v["params"]["kernel"], v["params"]["bias"]
    assert set(v) == {"params"}  # no quantization state
    assert np.array_equal(bits(m.apply(v, x)),
                          bits(int8.int8_dense(jnp.asarray(x), k, b, r, "relu")))


def test_emulated_where_the_device_has_no_int8_matrix_units():
    for slug, emulated in (("cpu", True), ("h200", False), ("tpu-v5e", False),
                           ("tpu-v6e", False)):
        assert ops.is_emulated(resolve("int8"), lookup(slug)) is emulated, slug
        assert ops.is_emulated(resolve("int8-auto"), lookup(slug)) is emulated, slug


def test_int8_auto_chooses_per_layer_from_the_device():
    auto = resolve("int8-auto")
    shapes = [(4096, 4096), (1024, 4096), (512, 4096), (4096, 8)]
    wide = [min(s) >= auto.int8_min_dim for s in shapes]
    assert wide == [True, True, False, False]
    for platform, kind in (("tpu", "TPU v5 lite"), ("tpu", "TPU v6 lite"), ("gpu", "NVIDIA H200"),
                           ("cpu", "cpu")):
        with hardware.target(platform, kind):
            assert hardware.int8_pays()
            assert [layers.layer_recipe(auto, s).gemm == "int8" for s in shapes] == wide
    with hardware.target("tpu", "TPU v9 unknown"):  # no INT8 rate in the registry: BF16
        assert not hardware.int8_pays()
        assert all(layers.layer_recipe(auto, s).gemm == "dense" for s in shapes)
        assert layers.layer_recipe(resolve("int8"), (8, 8)).gemm == "int8"  # no policy


def test_recipe_facts():
    r = resolve("int8")
    assert (r.number_format, r.quantizer, r.quantized, r.dtype) == \
        ("int8", "current", True, jnp.bfloat16)
    f = value_formats(resolve("int8"))
    assert f["weights (GEMM operand)"] == "int8 (per channel)"
    assert f["gradients (GEMM operand)"] == f["activations (GEMM operand)"] == "int8"
    assert f["GEMM accumulation"] == "int32" and f["first/last layers"] == "bf16"
    per_tensor = value_formats(resolve("int8:int8_weight_scale=tensor"))
    assert per_tensor["weights (GEMM operand)"] == "int8"
    assert resolve("int8-auto").family == "int8"


def test_the_device_check_catches_a_wrong_int8_rounding(monkeypatch):
    """``repro check`` (run before anything is recorded) compares the INT8 quantizer with
    numpy on every bfloat16 value: a quantizer that rounds down instead fails it."""
    from repro.precision import check

    assert all(r["ok"] and r["required"] for r in check._int8_rows())
    real = int8.int8_quantize

    def floor(x, scale):
        return jnp.clip(jnp.floor(jnp.asarray(x, jnp.float32) / scale), -127, 127).astype(
            jnp.int8)

    monkeypatch.setattr(int8, "int8_quantize", floor)
    rows = check._int8_rows()
    assert [r["ok"] for r in rows] == [False, True]
    monkeypatch.setattr(int8, "int8_quantize", real)
