"""The native FP8 cast and the fused FP8 layer (bias and activation inside the custom_vjp).

References are independent of repro.precision.formats: ml_dtypes casts on the host, float64
products, and the unfused path (``activation(fp8_dot(x, w) + b)``) for bit-equality.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro.precision import formats as F
from repro.precision import fp8 as fp8_ops, ops
from repro.precision import scaling as S
from repro.precision.recipes import resolve

FP8 = [(ml_dtypes.float8_e4m3fn, jnp.float8_e4m3fn), (ml_dtypes.float8_e5m2, jnp.float8_e5m2)]
SCALES = [1.0, 2.0 ** -7, 3.7e-3, 0.5, 1.25, 7.0, 1e3, 2.0 ** 20]


def host_cast(x, np_dtype, scale):
    """The reference: saturating round-to-nearest-even cast of x / scale by ml_dtypes."""
    fmax = float(ml_dtypes.finfo(np_dtype).max)
    inv = np.float32(1.0) / np.float32(scale)
    with np.errstate(all="ignore"):
        y = np.asarray(x, np.float32) * inv
    return np.clip(y, -fmax, fmax).astype(np_dtype).view(np.uint8)


def same_bits(a, b, x):
    """Bitwise equal where x is not NaN (NaN payloads are the format's business)."""
    keep = ~np.isnan(np.asarray(x, np.float32))
    return np.array_equal(np.asarray(a)[keep], np.asarray(b)[keep])


@pytest.mark.parametrize("np_dtype,jdtype", FP8)
def test_native_cast_equals_rounding_cast_on_every_bfloat16(np_dtype, jdtype):
    x = jnp.asarray(np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16))
    native = jax.jit(lambda v, s: F.fp8_cast(v, jdtype, s))
    rounding = jax.jit(lambda v, s: F.fp8_quantize(v, jdtype, s))
    for s in SCALES:
        a = np.asarray(native(x, s)).view(np.uint8)
        assert same_bits(a, host_cast(x, np_dtype, s), x), s
        assert same_bits(a, np.asarray(rounding(x, s)).view(np.uint8), x), s
        nan = np.isnan(np.asarray(x, np.float32))
        assert np.isnan(np.asarray(native(x, s)[nan], np.float32)).all()  # NaN stays NaN


@pytest.mark.parametrize("np_dtype,jdtype", FP8)
def test_native_cast_rounds_float32_halfway_points_to_even(np_dtype, jdtype):
    """Every midpoint between neighbouring FP8 values (ties), one float32 ulp either side,
    the subnormal range, saturation and infinities."""
    v = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(np_dtype).astype(np.float64)))
    v = v[np.isfinite(v)]
    mids = ((v[1:] + v[:-1]) / 2).astype(np.float32)
    near = np.concatenate([mids, np.nextafter(mids, np.float32(0)),
                           np.nextafter(mids, np.float32(np.inf)), v.astype(np.float32)])
    fmax = float(v.max())
    x = np.concatenate([near, -near, [fmax * 1.5, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0]]
                       ).astype(np.float32)
    for s in (1.0, 2.0 ** -3, 2.0 ** 9):
        xs = (x * np.float32(s)).astype(np.float32)
        got = np.asarray(jax.jit(lambda t: F.fp8_cast(t, jdtype, s))(xs)).view(np.uint8)
        assert same_bits(got, host_cast(xs, np_dtype, s), xs), s


def test_recipes_cast_natively_except_convolutions():
    r = resolve("fp8-delayed")
    assert r.fp8_cast == "native" and fp8_ops._caster(r, ("dot",)) is F.fp8_cast
    assert fp8_ops._caster(r, ("conv", None, None, None)) is F.fp8_quantize  # folds otherwise
    assert fp8_ops._caster(resolve("fp8-delayed:fp8_cast=rounding"), ("dot",)) is F.fp8_quantize


# ------------------------------------------------------------------------- fused epilogue

M, K, N = 96, 64, 40  # N not a multiple of 8: the packed mask's padding is exercised


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((K, N)) * 0.1, jnp.float32)
    b = jnp.asarray(rng.standard_normal(N) * 0.1, jnp.float32)
    c = jnp.asarray(rng.standard_normal((M, N)), jnp.float32)
    return x, w, b, c


def meta_for(recipe):
    if resolve(recipe).scaling != "delayed":
        return None
    m = ops.init_meta(4)
    return {k: S.delayed_update(m[k], a, 448.0 if k != "output_grad" else 57344.0)
            for k, a in zip(m, (4.0, 0.3, 0.05))}


def grads(f, x, w, b, meta, c):
    def loss(x, w, b, meta):
        return jnp.sum(f(x, w, b, meta).astype(jnp.float32) * c)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(x, w, b, meta)


@pytest.mark.parametrize("recipe", ["fp8-delayed", "fp8-current"])
@pytest.mark.parametrize("act", ["relu", "tanh", None])
def test_fused_layer_equals_unfused_bitwise_but_the_bias_gradient(recipe, act):
    x, w, b, c = data()
    meta = meta_for(recipe)
    sep = resolve(recipe)

    def fused(x, w, b, m):
        return ops.fp8_dense(x, w, b, sep, m, act)

    def unfused(x, w, b, m):
        y = ops.fp8_dot(x, w, sep, m) + b.astype(sep.dtype)
        return {None: lambda v: v, "relu": jax.nn.relu, "tanh": jnp.tanh}[act](y)

    (_, gf), (_, gu) = grads(fused, x, w, b, meta, c), grads(unfused, x, w, b, meta, c)
    assert np.array_equal(np.asarray(jax.jit(fused)(x, w, b, meta)),
                          np.asarray(jax.jit(unfused)(x, w, b, meta)))
    if act != "tanh":  # tanh's derivative is taken in FP32 in the fused path
        for a, u in ((gf[0], gu[0]), (gf[1], gu[1])):
            assert np.array_equal(np.asarray(a), np.asarray(u))
        assert jax.tree.all(jax.tree.map(lambda p, q: np.array_equal(p, q), gf[3], gu[3]))
    # the bias gradient: an FP32 sum of the masked output gradient (float64 reference)
    y = np.asarray(jax.jit(fused)(x, w, b, meta), np.float64)
    g = np.asarray(c, np.float64)
    if act == "relu":
        g = g * (y > 0)
    elif act == "tanh":
        g = g * (1 - y * y)
    ref = g.sum(0)
    assert np.allclose(np.asarray(gf[2], np.float64), ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def grads_of_fixed_input(f, x, w, b, meta, c):
    """As :func:`grads`, the input ``x`` not differentiated (a network's input batch)."""
    def loss(w, b, meta):
        return jnp.sum(f(x, w, b, meta).astype(jnp.float32) * c)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(w, b, meta)


def same_tree(a, b):
    return jax.tree.all(jax.tree.map(lambda p, q: np.array_equal(np.asarray(p), np.asarray(q)),
                                     a, b))


@pytest.mark.parametrize("recipe", ["fp8-delayed", "fp8-current", "fp8-delayed:fp8_layout=tn"])
def test_an_input_not_differentiated_gives_the_same_loss_and_gradients(recipe):
    """Saved as it is and quantized again in the backward pass: the same FP8 values, so the
    loss and the gradients of the weight, bias and state are those of a differentiated
    input, bit for bit."""
    x, w, b, c = data()
    meta = meta_for(recipe)

    def f(x, w, b, m):
        return ops.fp8_dense(x, w, b, resolve(recipe), m, "relu")

    (lk, gk), (ld, gd) = grads_of_fixed_input(f, x, w, b, meta, c), grads(f, x, w, b, meta, c)
    assert float(lk) == float(ld)
    assert same_tree(gk, gd[1:])


@pytest.mark.parametrize("perturbed,saved", [(True, jnp.float8_e4m3fn), (False, jnp.bfloat16)])
def test_only_an_input_not_differentiated_is_saved_as_it_is(perturbed, saved):
    from jax.custom_derivatives import CustomVJPPrimal

    x, w, b, _ = data()
    r = resolve("fp8-delayed")
    diff = jax.tree.map(lambda a: CustomVJPPrimal(a, True), (w, b, meta_for(r)))
    _, res = fp8_ops._fp8_fwd_rule(CustomVJPPrimal(x, perturbed), *diff, r, ("dot",), "relu")
    assert res[0].dtype == saved and res[0].shape == (M, K)
    if not perturbed:
        assert res[0] is x


def test_fused_relu_keeps_fp8_operands_and_a_one_bit_mask():
    x, w, b, _ = data()
    r = resolve("fp8-delayed")
    _, res = fp8_ops._fp8_fwd(x, w, b, meta_for(r), r, ("dot",), "relu")
    big = [a for a in jax.tree.leaves(res) if a.size >= M * N // 8]
    assert sorted((a.dtype.name, a.shape) for a in big) == sorted(
        [("float8_e4m3fn", (M, K)), ("uint8", (M, (N + 7) // 8)), ("float8_e4m3fn", (K, N))])
    # the mask holds exactly the positive pre-activations
    z = np.asarray(ops.fp8_dense(x, w, b, r, meta_for(r)), np.float32)
    mask = np.unpackbits(np.asarray(res[8]), axis=-1, count=N).astype(bool)
    assert np.array_equal(mask, z > 0)


def test_fused_layer_matches_float64_within_fp8_error():
    x, w, b, _ = data(3)
    y = np.asarray(ops.fp8_dense(x, w, b, resolve("fp8-current"), None, "relu"), np.float64)
    ref = np.maximum(np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(b), 0)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.08


@pytest.mark.parametrize("bad,match", [
    (dict(activation="gelu"), "activation must be one of"),
    (dict(b=jnp.zeros(N + 1)), "bias shape"),
])
def test_fused_layer_rejects_bad_arguments(bad, match):
    x, w, b, _ = data()
    kw = dict(b=b, activation="relu") | bad
    with pytest.raises(ValueError, match=match):
        ops.fp8_dense(x, w, kw["b"], resolve("fp8-current"), None, kw["activation"])


# --------------------------------------------------------------- the one-pass Pallas kernel

KM, KN = 128, 256  # a multiple of kernels.BLOCK


@pytest.mark.parametrize("parts", ["qt", "t", "q"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("jdtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_cast_transpose_kernel_equals_reference(jdtype, masked, parts):
    """Interpret mode on the CPU: q, q^T and amax bit for bit; the column sums to FP32
    rounding (another order of addition); the parts not asked for are None in both."""
    from repro.precision import kernels

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((KM, KN)) * 30, jnp.bfloat16)
    mask = jnp.packbits(jnp.asarray(rng.random((KM, KN)) > 0.4), axis=-1) if masked else None
    got = kernels.cast_transpose_pallas(x, jdtype, 0.05, mask, parts, interpret=True)
    ref = kernels.cast_transpose_reference(x, jdtype, jnp.float32(0.05), mask, parts)
    assert [a is None for a in got] == [a is None for a in ref] == (
        [False] * 4 if parts == "qt" else [True] + [False] * 3 if parts == "t"
        else [False] + [True] * 3)
    keep = (np.unpackbits(np.asarray(mask), axis=-1).astype(bool) if masked
            else np.ones((KM, KN), bool))
    host = np.where(keep, np.asarray(x, np.float64), 0.0)
    fmax = float(ml_dtypes.finfo(jdtype.dtype).max)
    inv = np.float32(1.0) / np.float32(0.05)  # the kernel multiplies by the FP32 inverse
    q = np.clip(host.astype(np.float32) * inv, -fmax, fmax).astype(jdtype.dtype)
    for a, r, want in zip(got[:2], ref[:2], (q, q.T)):
        if a is not None:
            assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(r).view(np.uint8))
            assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(want).view(np.uint8))
    if parts != "q":
        assert float(got[2]) == float(ref[2]) == np.abs(host).max()
        assert np.allclose(np.asarray(got[3]), host.sum(0), rtol=1e-5, atol=1e-3)


def test_cast_transpose_refuses_unknown_parts():
    from repro.precision import kernels

    x = jnp.zeros((KM, KN), jnp.bfloat16)
    with pytest.raises(ValueError, match="parts must be one of"):
        kernels.cast_transpose_reference(x, jnp.float8_e4m3fn, 1.0, None, "tq")


@pytest.mark.parametrize("grad_cast", ["one-pass", "two-pass"])
@pytest.mark.parametrize("fixed_input", [False, True])
def test_tn_layout_through_the_kernel_equals_the_xla_path(monkeypatch, fixed_input, grad_cast):
    """The fused layer with the "tn" layout, once through XLA and once through the Pallas
    kernel (interpret mode standing in for the GPU): the same outputs and gradients, the
    output gradient quantized in one or two passes. ``fixed_input``: the input is not
    differentiated (saved as it is, its FP8 transpose made again in the backward pass)."""
    from repro.precision import kernels

    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.standard_normal((KM, KN)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((KN, KN)) * 0.05, jnp.float32)
    b = jnp.asarray(rng.standard_normal(KN) * 0.1, jnp.float32)
    c = jnp.asarray(rng.standard_normal((KM, KN)), jnp.float32)
    recipe = f"fp8-delayed:fp8_layout=tn,fp8_grad_cast={grad_cast}"
    meta = meta_for(recipe)

    def f(x, w, b, m):
        return ops.fp8_dense(x, w, b, resolve(recipe), m, "relu")

    how = grads_of_fixed_input if fixed_input else grads
    (_, xla) = grads(f, x, w, b, meta, c)
    monkeypatch.setattr(kernels, "fits", lambda shape: len(shape) == 2)
    calls = []

    def kernel(*a):
        calls.append(a[4] if len(a) > 4 else "qt")
        return kernels.cast_transpose_pallas(*a, interpret=True)

    monkeypatch.setattr(kernels, "cast_transpose", kernel)
    (_, pal) = how(f, x, w, b, meta, c)
    # forward: x "qt" (none when kept), w "qt"; backward: a kept x "t", then g: "t" alone
    # where no dx is wanted, else "qt" (one pass) or "t" then "q" (two passes)
    want = (["qt", "t", "t"] if fixed_input else
            ["qt", "qt", "qt"] if grad_cast == "one-pass" else ["qt", "qt", "t", "q"])
    assert calls == want
    if not fixed_input:
        assert np.array_equal(np.asarray(pal[0]), np.asarray(xla[0]))
    w_b_meta = pal[-3:]
    assert np.array_equal(np.asarray(w_b_meta[0]), np.asarray(xla[1]))
    assert np.allclose(np.asarray(w_b_meta[1]), np.asarray(xla[2]), rtol=1e-5, atol=1e-4)
    assert same_tree(w_b_meta[2], xla[3])


# ------------------------------------------------------------------ per-layer FP8 policy


def test_fp8_auto_runs_fp8_only_where_both_dimensions_reach_the_threshold():
    from repro.precision import layers
    from repro.precision.layers import FP8_META

    auto = resolve("fp8-auto:fp8_min_dim=64")
    assert layers.layer_recipe(auto, (64, 128)).gemm == "fp8"
    assert layers.layer_recipe(auto, (32, 128)).gemm == "dense"  # narrow input: BF16
    assert layers.layer_recipe(auto, (128, 8)).name.endswith("/dense")  # small head: BF16
    x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 64)), jnp.bfloat16)
    wide, head = layers.Dense(64, recipe=auto), layers.Dense(8, recipe=auto)
    for layer, fp8 in ((wide, True), (head, False)):
        v = layer.init(jax.random.key(0), x)
        assert (FP8_META in v) is fp8  # only FP8 layers carry FP8 state
        jaxpr = str(jax.make_jaxpr(lambda v: layer.apply(v, x))(v))
        assert ("f8_e4m3fn" in jaxpr) is fp8
        ref = resolve("fp8-delayed") if fp8 else resolve("bf16")
        v_ref = layers.Dense(layer.features, recipe=ref).init(jax.random.key(0), x)
        v_ref = {**v_ref, "params": v["params"], **({FP8_META: v[FP8_META]} if fp8 else {})}
        assert np.array_equal(np.asarray(layer.apply(v, x)),
                              np.asarray(layers.Dense(layer.features, recipe=ref).apply(v_ref, x)))
