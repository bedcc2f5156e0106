"""repro.precision.layers on CPU: every recipe against an FP32 reference, the FP8_META update path."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from repro.precision import layers as L
from repro.precision import ops
from repro.precision.recipes import REGISTRY, resolve

# this repository's own precision recipes (not the training-time variants nor the peers)
RECIPES = [n for n, r in REGISTRY.items() if r.backend == "repro" and r.base is None]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def randn(seed, shape, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32)


# (forward, kernel-gradient) relative-error bounds against FP32, per recipe. On CPU "tf32" is
# FP32. Quantized recipes must ALSO be off by more than 0.005 (they really quantize).
TOL = {"fp32": (1e-6, 1e-6), "tf32": (1e-6, 1e-6), "bf16": (0.01, 0.01), "fp16": (2e-3, 2e-3),
       "fp8-current": (0.08, 0.1), "fp8-delayed": (0.08, 0.1), "fp8-noscale": (0.08, 0.1),
       "mxfp8": (0.08, 0.1), "fp8-block": (0.08, 0.1), "nvfp4": (0.2, 0.25),
       "int8": (0.03, 0.05)}

X = randn(0, (16, 32))
T = randn(1, (16, 24))


def _mse(model, v, x, t):
    return jnp.mean((model.apply(v, x).astype(jnp.float32) - t) ** 2)


@pytest.fixture(scope="module")
def fp32_reference():
    ref = L.Dense(24, recipe=resolve("fp32"))
    v = ref.init(jax.random.PRNGKey(0), X)
    return v, ref.apply(v, X), jax.grad(lambda v: _mse(ref, v, X, T))(v)["params"]


def test_every_recipe_has_a_tolerance():
    assert set(TOL) == set(RECIPES)


@pytest.mark.parametrize("name", list(RECIPES))
def test_dense_each_recipe_matches_fp32(name, fp32_reference):
    v32, y32, g32 = fp32_reference
    model = L.Dense(24, recipe=resolve(name))
    v = model.init(jax.random.PRNGKey(0), X)
    assert jax.tree.map(jnp.shape, v["params"]) == jax.tree.map(jnp.shape, v32["params"])
    assert v["params"]["kernel"].dtype == jnp.float32  # FP32 master weights
    v = {**v, "params": v32["params"]}

    @jax.jit
    def step(v):
        return model.apply(v, X), jax.grad(lambda v: _mse(model, v, X, T))(v)

    y, g = step(v)
    assert y.dtype == resolve(name).dtype
    fwd_tol, grad_tol = TOL[name]
    e_fwd, e_grad = rel(y.astype(jnp.float32), y32), rel(g["params"]["kernel"], g32["kernel"])
    assert e_fwd < fwd_tol and e_grad < grad_tol, (e_fwd, e_grad)
    assert rel(g["params"]["bias"], g32["bias"]) < grad_tol
    if resolve(name).quantized:
        assert e_fwd > 5e-3 and e_grad > 5e-3
    assert (L.FP8_META in v) == (name in ("fp8-delayed", "nvfp4"))


def test_apply_gradients_fp8_delayed_updates_history():
    r = resolve("fp8-delayed", amax_history_len=8)
    model = L.Dense(24, recipe=r)
    v = model.init(jax.random.PRNGKey(0), X)
    meta = v[L.FP8_META]
    assert meta["input_amax_history"].shape == (8,) and float(meta["input_scale"]) == 1.0
    tx = optax.sgd(0.1)
    opt_state = tx.init(v["params"])

    @jax.jit
    def train_step(v, opt_state, x):
        y, vjp = jax.vjp(lambda v: model.apply(v, x), v)
        dy = jax.grad(lambda y: jnp.mean((y.astype(jnp.float32) - T) ** 2))(y)
        dy = dy.astype(y.dtype)  # the cotangent the layer sees
        (grads,) = vjp(dy)
        v, opt_state = L.apply_gradients(v, grads, tx, opt_state)
        return v, opt_state, dy

    kernel0 = np.asarray(v["params"]["kernel"])
    v1, opt_state, dy = train_step(v, opt_state, X)
    m1 = v1[L.FP8_META]
    amax = {"input": np.abs(np.asarray(X)).max(), "kernel": np.abs(kernel0).max(),
            "output_grad": np.abs(np.asarray(dy, np.float32)).max()}
    fmax = {"input": 448.0, "kernel": 448.0, "output_grad": 57344.0}
    for k in amax:
        np.testing.assert_allclose(m1[f"{k}_amax_history"], [amax[k]] + [0.0] * 7, rtol=1e-6)
        np.testing.assert_allclose(m1[f"{k}_scale"], amax[k] / fmax[k], rtol=1e-6)
    assert not np.allclose(v1["params"]["kernel"], kernel0)  # the optimizer ran too

    x2 = 2.0 * X
    v2, _, _ = train_step(v1, opt_state, x2)
    h = np.asarray(v2[L.FP8_META]["input_amax_history"])
    np.testing.assert_allclose(h[:2], [2 * amax["input"], amax["input"]], rtol=1e-6)
    np.testing.assert_allclose(v2[L.FP8_META]["input_scale"], 2 * amax["input"] / 448, rtol=1e-6)


def test_apply_gradients_without_fp8_meta_is_plain_optax():
    model = L.Dense(24, recipe=resolve("bf16"))
    v = model.init(jax.random.PRNGKey(0), X)
    tx = optax.adam(1e-2)
    opt_state = tx.init(v["params"])
    grads = jax.grad(lambda v: _mse(model, v, X, T))(v)
    new, _ = L.apply_gradients(v, grads, tx, opt_state)
    updates, _ = tx.update(grads["params"], tx.init(v["params"]), v["params"])
    expect = optax.apply_updates(v["params"], updates)
    jax.tree.map(np.testing.assert_array_equal, new["params"], expect)
    assert set(new) == {"params"}
    # params-only gradients leave an existing FP8_META untouched
    m = L.Dense(24, recipe=resolve("fp8-delayed"))
    v = m.init(jax.random.PRNGKey(0), X)
    g = jax.grad(lambda p: _mse(m, {**v, "params": p}, X, T))(v["params"])
    new, _ = L.apply_gradients(v, g, tx, tx.init(v["params"]))
    jax.tree.map(np.testing.assert_array_equal, new[L.FP8_META], v[L.FP8_META])


def test_nvfp4_dense_step_counter_and_quant_rng():
    model = L.Dense(32, recipe=resolve("nvfp4"))
    x = randn(2, (32, 32))
    v = model.init(jax.random.PRNGKey(0), x)
    assert float(v[L.FP8_META]["step"]) == 0.0
    loss = jax.jit(jax.grad(lambda v, k: jnp.sum(model.apply(v, x, rngs={"quant": k})
                                                 .astype(jnp.float32) ** 2)))
    loss_norng = jax.jit(jax.grad(lambda v: jnp.sum(model.apply(v, x).astype(jnp.float32) ** 2)))
    g = loss_norng(v)
    assert float(g[L.FP8_META]["step"]) == 1.0  # the counter's "gradient" is step + 1
    v1 = {**v, L.FP8_META: g[L.FP8_META]}
    g1 = loss_norng(v1)
    # a new step gives a new key (stochastic rounding differs), the same step the same key
    assert not np.array_equal(g["params"]["kernel"], g1["params"]["kernel"])
    np.testing.assert_array_equal(g["params"]["kernel"], loss_norng(v)["params"]["kernel"])
    ga, gb = loss(v, jax.random.PRNGKey(1)), loss(v, jax.random.PRNGKey(2))
    assert not np.array_equal(ga["params"]["kernel"], gb["params"]["kernel"])


def test_dense_general_matches_einsum():
    x = randn(3, (2, 5, 4, 16))  # [B, T, H, Dh]
    proj = L.DenseGeneral((3, 8), recipe=resolve("fp32"))  # [.., Dh=16] -> [.., 3, 8]
    v = proj.init(jax.random.PRNGKey(0), x)
    k, b = v["params"]["kernel"], v["params"]["bias"]
    assert k.shape == (16, 3, 8) and b.shape == (3, 8)
    np.testing.assert_allclose(proj.apply(v, x),
                               np.einsum("bthd,def->bthef", x, k) + np.asarray(b), rtol=1e-5,
                               atol=1e-5)
    out = L.DenseGeneral(12, axis=(-2, -1), recipe=resolve("fp8-delayed"), use_bias=False)
    v = out.init(jax.random.PRNGKey(1), x)
    assert v["params"]["kernel"].shape == (4, 16, 12)
    y = out.apply(v, x)
    exact = np.einsum("bthd,hdf->btf", np.asarray(x, np.float64), v["params"]["kernel"])
    assert y.shape == (2, 5, 12) and rel(y.astype(jnp.float32), exact) < 0.08
    with pytest.raises(ValueError, match="trailing"):
        L.DenseGeneral(4, axis=(0,)).init(jax.random.PRNGKey(0), x)


_CONV_RE = re.compile(r"stablehlo\.convolution.*?:\s*\(tensor<[0-9x]*x?(\w+)>,\s*tensor<[0-9x]*x?(\w+)>\)")


@pytest.mark.parametrize("name", ["fp8-current", "fp8-delayed"])
def test_conv_fp8_close_to_fp32(name):
    x = randn(4, (2, 10, 10, 4))
    ref = L.Conv(8, (3, 3), strides=2, recipe=resolve("fp32"))
    v32 = ref.init(jax.random.PRNGKey(0), x)
    conv = L.Conv(8, (3, 3), strides=2, recipe=resolve(name))
    v = {**conv.init(jax.random.PRNGKey(0), x), "params": v32["params"]}
    if name == "fp8-delayed":  # calibrated scales (a fresh state's scale 1.0 is "no scaling")
        meta = dict(v[L.FP8_META])
        meta["input_scale"] = jnp.float32(np.abs(np.asarray(x)).max() / 448)
        meta["kernel_scale"] = jnp.float32(np.abs(np.asarray(v32["params"]["kernel"])).max() / 448)
        meta["output_grad_scale"] = jnp.float32(1e-3)
        v = {**v, L.FP8_META: meta}
    y32, y = ref.apply(v32, x), conv.apply(v, x)
    assert y.shape == (2, 5, 5, 8) and y.dtype == jnp.bfloat16
    assert 1e-3 < rel(y.astype(jnp.float32), y32) < 0.08
    text = jax.jit(conv.apply).lower(v, x).as_text()
    assert _CONV_RE.findall(text) == [("f8E4M3FN", "f8E4M3FN")]
    t = randn(5, y32.shape)
    g32 = jax.grad(lambda v: _mse(ref, v, x, t))(v32)["params"]
    g = jax.jit(jax.grad(lambda v: _mse(conv, v, x, t)))(v)
    assert rel(g["params"]["kernel"], g32["kernel"]) < 0.1
    gx32 = jax.grad(lambda x: _mse(ref, v32, x, t))(x)
    gx = jax.grad(lambda x: _mse(conv, v, x, t))(x)
    assert rel(gx, gx32) < 0.1
    if name == "fp8-delayed":
        np.testing.assert_allclose(g[L.FP8_META]["input_amax_history"][0], np.abs(x).max())


def test_fp8_conv_pads_odd_channel_counts():
    """SpaceInvaders-MinAtar has 6 input channels: cuDNN on the H200 had no FP8 plan for them
    (seeds vmapped into a grouped convolution). The FP8 convolution must see a multiple of 16
    channels, give the unpadded answer and return gradients of the unpadded shapes."""
    x, w = randn(7, (2, 10, 10, 6)), 0.2 * randn(8, (3, 3, 6, 8))
    r = resolve("fp8-current")
    f = lambda x, w: ops.fp8_conv(x, w, r, strides=(1, 1), padding="SAME")
    text = jax.jit(f).lower(x, w).as_text()
    shapes = re.findall(r"stablehlo\.convolution.*?:\s*\(tensor<([0-9x]+)xf8E4M3FN>,\s*"
                        r"tensor<([0-9x]+)xf8E4M3FN>\)", text)
    assert shapes == [("2x10x10x16", "3x3x16x8")], shapes
    exact = lax.conv_general_dilated(x, w,
                                     (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = f(x, w)
    assert y.shape == (2, 10, 10, 8) and rel(y.astype(jnp.float32), exact) < 0.08
    t = randn(9, y.shape)
    gx, gw = jax.grad(lambda x, w: jnp.sum((f(x, w).astype(jnp.float32) - t) ** 2), (0, 1))(x, w)
    gx64, gw64 = jax.grad(lambda x, w: jnp.sum((lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) - t) ** 2),
        (0, 1))(x, w)
    assert gx.shape == x.shape and gw.shape == w.shape
    assert rel(gx, gx64) < 0.1 and rel(gw, gw64) < 0.1
    # seeds vmapped (the quality runs): a grouped convolution, still 16 channels per group
    ys = jax.vmap(f)(jnp.stack([x, 2 * x]), jnp.stack([w, w]))
    assert rel(ys[0].astype(jnp.float32), exact) < 0.08
