"""The precision API refuses what it cannot compute correctly: one line naming the function,
the argument and the valid values (fuzzed further in tests/test_fuzz.py)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from repro.precision import formats as F
from repro.precision import ops, peers

X, W = jnp.ones((4, 32), jnp.float32), jnp.ones((32, 16), jnp.float32)
KEY = jax.random.key(0)


@pytest.mark.parametrize("fn, recipe, want", [
    (lambda r: ops.fp8_dot(X, W, r), "bf16", "fp8_dot: recipe 'bf16' has gemm='dense'"),
    (lambda r: ops.fp8_dense(X, W, None, r), "nvfp4", "fp8_dense: recipe 'nvfp4'"),
    (lambda r: ops.nvfp4_dot(X, W, r, KEY), "fp8-current",
     "nvfp4_dot: recipe 'fp8-current' has gemm='fp8', not 'nvfp4'"),
    (lambda r: ops.mxfp8_dot(X, W, r), "nvfp4", "mxfp8_dot: recipe 'nvfp4' has gemm='nvfp4'"),
    (lambda r: ops.fp8_conv(jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 4)), r), "tf32",
     "fp8_conv: recipe 'tf32'"),
    (lambda r: ops.dot(X, W, r), "jax-nvfp4", "dot: recipe 'jax-nvfp4' runs on the 'jax'"),
    (lambda r: ops.fp8_dot(X, W, r), "flax-fp8", "fp8_dot: recipe 'flax-fp8' runs on the 'flax'"),
])
def test_a_recipe_of_another_format_or_library_is_refused(fn, recipe, want):
    with pytest.raises(ValueError) as e:
        fn(resolve(recipe))
    assert str(e.value).startswith(want) and "\n" not in str(e.value)


def test_the_refusal_lists_the_recipes_that_fit():
    with pytest.raises(ValueError, match=r"valid recipes: nvfp4, nvfp4-no-rht"):
        ops.nvfp4_dot(X, W, resolve("fp8-current"), KEY)


def test_conv_channel_mismatch_is_refused_where_lax_conv_refuses():
    x, w = jnp.ones((1, 8, 8, 3)), jnp.ones((3, 3, 5, 4))
    dn = ops.conv_dimension_numbers(4)
    with pytest.raises(ValueError, match="feature dimension"):  # the reference: lax refuses
        lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)
    with pytest.raises(ValueError, match=r"fp8_conv: channel mismatch: x \(1, 8, 8, 3\) has 3 "
                                         r"input channels, w \(3, 3, 5, 4\) expects 5"):
        ops.fp8_conv(x, w, resolve("fp8-current"))
    # matching channels that are not a multiple of 16 still run (and are padded)
    assert ops.fp8_conv(jnp.ones((1, 8, 8, 5)), w, resolve("fp8-current")).shape == (1, 8, 8, 4)


@pytest.mark.parametrize("kw, want", [
    (dict(strides=(0, 1)), "strides must be 2 positive ints"),
    (dict(strides=(1,)), "strides must be 2 positive ints"),
    (dict(padding="FULL"), "padding must be 'SAME', 'VALID', 'SAME_LOWER' or 2"),
    (dict(padding=[(1, 1)]), "padding must be"),
    (dict(padding=[(-1, 0), (0, 0)]), "padding must be"),
])
def test_conv_geometry_is_checked(kw, want):
    with pytest.raises(ValueError, match=want):
        ops.fp8_conv(jnp.ones((1, 8, 8, 4)), jnp.ones((3, 3, 4, 2)), resolve("fp8-current"), **kw)


@pytest.mark.parametrize("fn", [F.fp8_quantize, F.fp8_cast])
@pytest.mark.parametrize("scale", [0.0, -1.0, np.nan, np.inf, -np.inf,
                                   np.array([1.0, 0.0]), jnp.float32(0.0)])
def test_a_concrete_scale_must_be_positive_and_finite(fn, scale):
    with pytest.raises(ValueError, match=f"{fn.__name__}: scale must be a positive finite"):
        fn(X, F.E4M3, scale)


def test_a_traced_scale_is_documented_not_checked():
    # Under jit the scale is unknown while tracing: no error, the arithmetic's result, as the
    # docstring says (1 / 0 = inf -> every element saturates to +-max).
    out = jax.jit(lambda s: F.fp8_quantize(X, F.E4M3, s))(jnp.float32(0.0))
    assert np.all(np.asarray(out, np.float32) == 448.0)
    assert "traced" in F.fp8_quantize.__doc__


@pytest.mark.parametrize("scale", [1.0, 2.0 ** -20, np.float32(3.5), jnp.ones((4, 1))])
def test_a_good_scale_gives_the_reference_values(scale):
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32) * 300
    ref = np.clip(x.astype(np.float64) / np.asarray(scale, np.float64), -448, 448)
    want = ref.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)  # float64 -> e4m3: RNE
    got = np.asarray(F.fp8_quantize(jnp.asarray(x), F.E4M3, scale)).astype(np.float64)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, "e4m3", jnp.int8, None])
def test_the_fp8_dtype_must_be_an_fp8_format(dtype):
    with pytest.raises(ValueError, match="dtype must be an FP8 dtype"):
        F.fp8_quantize(X, dtype, 1.0)


@pytest.mark.parametrize("fn", [
    lambda x, w: ops.fp8_dot(x, w, resolve("fp8-current")),
    lambda x, w: ops.mxfp8_dot(x, w, resolve("mxfp8")),
    lambda x, w: ops.nvfp4_dot(x, w, resolve("nvfp4"), KEY),
    lambda x, w: ops.dot(x, w, resolve("bf16")),
])
@pytest.mark.parametrize("x, w, want", [
    (jnp.ones((0, 32)), W, r"x is empty \(shape \(0, 32\)\)"),
    (jnp.ones((4, 0)), jnp.ones((0, 16)), r"w is empty"),
    (X, jnp.ones((32, 0)), r"w is empty"),
    (jnp.float32(1.0), W, r"x needs at least 1 axis"),
    (X, jnp.ones((31, 16)), r"contraction mismatch, x \(4, 32\) vs w \(31, 16\)"),
    (X, jnp.ones((32,)), r"w must be 2-D"),
])
def test_empty_and_mismatched_operands_are_refused(fn, x, w, want):
    with pytest.raises(ValueError, match=want):
        fn(x, w)


def test_integer_operands_are_refused():
    with pytest.raises(TypeError, match="fp8_dot: x must be floating, got dtype int32"):
        ops.fp8_dot(jnp.ones((4, 32), jnp.int32), W, resolve("fp8-current"))


@pytest.mark.parametrize("key", [3, "k", jnp.ones((2,)), jnp.ones((3,), jnp.uint32)])
def test_a_key_that_is_not_a_prng_key_is_refused(key):
    with pytest.raises(TypeError, match="nvfp4_dot: key must be a PRNG key"):
        ops.nvfp4_dot(X, W, resolve("nvfp4"), key)
    with pytest.raises(TypeError, match="nvfp4_quantize: key must be a PRNG key"):
        F.nvfp4_quantize(X[:, :16], rounding="stochastic", key=key)
    with pytest.raises(TypeError, match="random_hadamard_transform: key must be a PRNG key"):
        F.random_hadamard_transform(X, key)


def test_typed_and_raw_keys_give_the_same_product():
    raw = jax.random.PRNGKey(3)
    a = ops.nvfp4_dot(X, W, resolve("nvfp4"), jax.random.wrap_key_data(raw))
    b = ops.nvfp4_dot(X, W, resolve("nvfp4"), raw)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_block_scaled_backend_must_be_known():
    with pytest.raises(ValueError, match="mxfp8_dot: backend must be None .*'native' or "
                                         "'emulated', got 'cuda'"):
        ops.mxfp8_dot(X, W, resolve("mxfp8"), backend="cuda")


def test_jax_nvfp4_says_which_platform_it_needs():
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match=r"recipe 'jax-nvfp4' needs a GPU .* CPU backend"):
        peers.jax_nvfp4_dot(X, W)


def test_mxfp8_block_must_be_positive():
    for block in (0, -32, 2.0, True):
        with pytest.raises(ValueError, match="mxfp8_quantize: block must be a positive int"):
            F.mxfp8_quantize(X, block=block)


# ------------------------------------------------------------------ NVFP4 infinities


def test_an_all_inf_tensor_saturates_as_documented():
    """Hand-computed: no finite value, so the global scale is 1; a block holding +-inf gets
    the largest E4M3 block scale, 448; +-inf clips to +-6 (E2M1's max). Dequantized:
    +-6 * 448 * 1 = +-2688, the largest magnitude NVFP4 holds under a global scale of 1."""
    x = jnp.array([[np.inf, -np.inf] * 8], jnp.float32)
    t = F.nvfp4_quantize(x)
    assert float(t.global_scale) == 1.0
    assert np.asarray(t.block_scale, np.float32).tolist() == [[448.0]]
    assert np.asarray(t.q, np.float32).tolist() == [[6.0, -6.0] * 8]
    assert np.asarray(F.nvfp4_dequantize(t)).tolist() == [[2688.0, -2688.0] * 8]


def test_an_inf_block_saturates_to_the_tensors_amax():
    """Hand-computed: finite amax 6, so global scale 6 / 2688; the inf block gets block scale
    448, dequantizing +inf to 6 * 448 * 6 / 2688 = 6; the finite block [6, 3, 0...] gets
    e4m3(6 * (2688 / 6) / 6) = 448 too: exact 6 and 3; the other blocks are untouched."""
    x = np.zeros((1, 48), np.float32)
    x[0, 0], x[0, 1] = 6.0, 3.0
    x[0, 16] = np.inf
    x[0, 32:] = 1.5
    d = np.asarray(F.nvfp4_dequantize(F.nvfp4_quantize(jnp.asarray(x))))
    assert d[0, 16] == pytest.approx(6.0, rel=1e-6)
    assert d[0, 0] == pytest.approx(6.0, rel=1e-6) and d[0, 1] == pytest.approx(3.0, rel=1e-6)
    assert np.all(d[0, 17:32] == 0)
    clean = x.copy()
    clean[0, 16] = 0.0
    dc = np.asarray(F.nvfp4_dequantize(F.nvfp4_quantize(jnp.asarray(clean))))
    np.testing.assert_array_equal(d[0, 32:], dc[0, 32:])


# ------------------------------------------------- axes, block sizes, dtypes and ranks
# Each is checked in Python on static values (ints, shapes, dtypes) before anything is
# traced, so the programs of valid calls are unchanged.

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from repro.precision import layers as L  # noqa: E402
from repro.precision.recipes import resolve  # noqa: E402

PROPERTY = settings(deadline=None, derandomize=True, database=None, max_examples=60)


def one_line_error(exc, fn, want):
    with pytest.raises(exc) as e:
        fn()
    msg = str(e.value)
    assert msg.startswith(want) and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("fn, exc, want", [
    # an axis out of range wrapped silently (axis=5 of a 2-D input became axis 1)
    (lambda: F.mxfp8_quantize(X, axis=5), ValueError,
     "mxfp8_quantize: axis=5 is out of range for an input of rank 2 (valid: -2 to 1)"),
    (lambda: F.mxfp8_quantize(X, axis=-3), ValueError, "mxfp8_quantize: axis=-3 is out of range"),
    (lambda: F.mxfp8_quantize(X, axis=1.0), TypeError, "mxfp8_quantize: axis must be an int"),
    (lambda: F.mxfp8_quantize(X, axis=None), TypeError, "mxfp8_quantize: axis must be an int"),
    (lambda: F.random_hadamard_transform(X, KEY, axis=2), ValueError,
     "random_hadamard_transform: axis=2 is out of range"),
    (lambda: F.inverse_random_hadamard_transform(X, KEY, axis=-3), ValueError,
     "inverse_random_hadamard_transform: axis=-3 is out of range"),
    # a block size that is not an int was truncated ((16.5, 16) ran as (16, 16))
    (lambda: F.nvfp4_quantize(jnp.ones((32, 32)), block=(16.5, 16)), ValueError,
     "nvfp4_quantize: block must be one of ((1, 16), (16, 16)) (ints), got (16.5, 16)"),
    (lambda: F.nvfp4_quantize(X, block=(1.0, 16.0)), ValueError, "nvfp4_quantize: block must"),
    (lambda: F.nvfp4_quantize(X, block=(True, 16)), ValueError, "nvfp4_quantize: block must"),
    (lambda: F.nvfp4_quantize(X, block=16), ValueError, "nvfp4_quantize: block must be one of"),
    (lambda: F.nvfp4_quantize(X, block=(1, 16, 1)), ValueError, "nvfp4_quantize: block must"),
    (lambda: F.random_hadamard_transform(X, KEY, n=16.0), ValueError,
     "random_hadamard_transform: n (the group size) must be a power-of-two int, got 16.0"),
    (lambda: F.random_hadamard_transform(jnp.ones((4, 48)), KEY, n=12), ValueError,
     "random_hadamard_transform: n (the group size) must be a power-of-two int"),
    (lambda: F.hadamard_matrix(4.0), ValueError, "hadamard_matrix: n must be a power of two"),
    # dtypes: a target the arithmetic cannot round to, an output that is not a float
    (lambda: F.stochastic_round_to(X, jnp.bfloat16, KEY), ValueError,
     "stochastic_round_to: dtype must be an 8-bit or 4-bit float format"),
    (lambda: F.stochastic_round_to(X, jnp.int8, KEY), ValueError,
     "stochastic_round_to: dtype must be an 8-bit or 4-bit float format"),
    (lambda: F.round_to(X, jnp.int8), ValueError,
     "round_to: dtype must be a float dtype of at most 32 bits"),
    (lambda: F.cast(X, "float64"), ValueError, "round_to: dtype must be a float dtype of at most"),
    (lambda: F.fp8_dequantize(F.fp8_quantize(X, F.E4M3, 1.0), 1.0, jnp.int8), ValueError,
     "fp8_dequantize: dtype must be a float dtype"),
    (lambda: F.mxfp8_dequantize(F.mxfp8_quantize(X), jnp.int32), ValueError,
     "mxfp8_dequantize: dtype must be a float dtype"),
    (lambda: F.nvfp4_dequantize(F.nvfp4_quantize(X), "float64"), ValueError,
     "nvfp4_dequantize: dtype must be a float dtype (float32, bfloat16, float16; float64 only"),
    # arguments that were silently ignored or truncated
    (lambda: F.fake_quantize(X, "e4m3", axis=0), TypeError,
     "fake_quantize: fmt 'e4m3' takes margin, got axis"),
    (lambda: F.fake_quantize(X, "e5m2", margin=1.5), TypeError,
     "compute_scale: margin must be an int, got float 1.5"),
    (lambda: F.compute_scale(3.0, 448.0, 0.5), TypeError, "compute_scale: margin must be an int"),
])
def test_formats_check_axes_blocks_and_dtypes(fn, exc, want):
    one_line_error(exc, fn, want)


@pytest.mark.parametrize("spec, want", [
    # accepted, then failed inside numpy
    ("fp8-current:fwd_dtype=int8", "fwd_dtype must be one of ['float8_e4m3fn', 'float8_e5m2'], "
                                   "got 'int8'"),
    ("fp8-current:bwd_dtype=bfloat16", "bwd_dtype must be one of"),
    # quietly ran float32
    ("bf16:compute_dtype=float64", "compute_dtype must be one of ['float32', 'bfloat16', "
                                   "'float16'], got 'float64'"),
    ("bf16:compute_dtype=int8", "compute_dtype must be one of"),
    ("bf16:param_dtype=float16", "param_dtype must be one of ['float32'], got 'float16'"),
    ("bf16:matmul_precision=fastest", "matmul_precision must be one of ['default', 'high', "
                                      "'highest']"),
    ("fp8-delayed:margin=-3", "margin must be in [0, 32], got -3"),
    ("fp8-delayed:margin=200", "margin must be in [0, 32], got 200"),
    ("fp8-auto:fp8_min_dim=-1", "fp8_min_dim must be >= 0, got -1"),
    ("fp8-e2e:weight_clip=inf", "weight_clip must be a finite number > 0 or None"),
])
def test_a_recipe_variant_the_ops_cannot_run_is_refused_naming_the_field(spec, want):
    one_line_error(ValueError, lambda: resolve(spec), f"recipe {spec!r}: {want}")


@pytest.mark.parametrize("overrides, want", [
    (dict(amax_history_len=16.5), "amax_history_len must be an int, got float 16.5"),
    (dict(amax_history_len=True), "amax_history_len must be an int, got bool True"),
    (dict(kahan="no"), "kahan must be a bool, got str 'no'"),  # "no" was truthy: Kahan ran
    (dict(weight_clip="1"), "weight_clip must be a number or None, got str '1'"),
    (dict(compute_dtype=jnp.float32), "compute_dtype must be a string"),
])
def test_recipe_fields_of_the_wrong_type_are_refused(overrides, want):
    one_line_error(ValueError, lambda: resolve("fp8-delayed", **overrides),
                   f"recipe 'fp8-delayed': {want}")


@pytest.mark.parametrize("module, x, exc, want", [
    (L.Dense(4, recipe=resolve("fp8-current")), jnp.float32(1.0),
     ValueError,  # was a bare IndexError
     "Dense: x needs at least 1 axis, got shape ()"),
    (L.Dense(4), jnp.float32(1.0), ValueError, "Dense: x needs at least 1 axis"),
    (L.Dense(0), X, ValueError, "Dense: features must be a positive int, got 0"),
    (L.Dense(2.5), X, ValueError, "Dense: features must be a positive int, got 2.5"),
    (L.DenseGeneral(4, axis=5), X, ValueError,  # wrapped silently to axis 1
     "DenseGeneral: axis=5 is out of range for an input of rank 2 (valid: -2 to 1)"),
    (L.DenseGeneral(4), jnp.float32(1.0), ValueError, "DenseGeneral: x needs at least 1 axis"),
    (L.DenseGeneral(4, axis=(-1, 2)), jnp.ones((2, 4, 32)), ValueError,
     "DenseGeneral: axis (-1, 2) must be the trailing axes"),
    (L.DenseGeneral((4, 0)), X, ValueError, "DenseGeneral: features must be positive"),
    (L.DenseGeneral(4, axis=-1.0), X, TypeError, "DenseGeneral: axis must be an int or a"),
    (L.Conv(4, kernel_size=0), jnp.ones((1, 8, 8, 3)), ValueError,
     "Conv: kernel_size must be positive, got 0"),
    (L.Conv(4, kernel_size=2.5), jnp.ones((1, 8, 3)), TypeError, "Conv: kernel_size must be an"),
    (L.Conv(4, (3, 3), strides=0), jnp.ones((1, 8, 8, 3)), ValueError,
     "Conv: strides must be 1 or 2 positive ints, got 0"),
    (L.Conv(4, (3, 3), strides=(1, 1, 1)), jnp.ones((1, 8, 8, 3)), ValueError,
     "Conv: strides must be 1 or 2 positive ints"),
])
def test_layers_check_ranks_axes_and_sizes(module, x, exc, want):
    one_line_error(exc, lambda: module.init(KEY, x), want)


@PROPERTY
@given(ndim=st.integers(1, 3), axis=st.integers(-6, 6))
def test_an_axis_is_used_as_given_or_refused(ndim, axis):
    x = jnp.arange(32 ** ndim, dtype=jnp.float32).reshape((32,) * ndim) / 7
    if not -ndim <= axis < ndim:
        one_line_error(ValueError, lambda: F.mxfp8_quantize(x, axis=axis),
                       f"mxfp8_quantize: axis={axis} is out of range for an input of rank {ndim}")
        return
    t = F.mxfp8_quantize(x, axis=axis)
    assert t.scale.shape[axis] == 1 and t.axis == axis % ndim


@PROPERTY
@given(block=st.tuples(st.one_of(st.integers(-2, 20), st.floats(0, 20), st.booleans()),
                       st.one_of(st.integers(-2, 20), st.floats(0, 20), st.booleans())))
def test_an_nvfp4_block_is_a_pair_of_ints_of_the_recipe_or_refused(block):
    exact = all(type(b) is int for b in block) and block in F.NVFP4_BLOCKS
    if exact:
        assert F.nvfp4_quantize(jnp.ones((16, 16)), block=block).block == block
    else:
        one_line_error(ValueError, lambda: F.nvfp4_quantize(jnp.ones((16, 16)), block=block),
                       "nvfp4_quantize: block must be one of")


@PROPERTY
@given(field=st.sampled_from(["compute_dtype", "fwd_dtype", "bwd_dtype", "matmul_precision",
                              "param_dtype"]),
       value=st.sampled_from(["float64", "int8", "uint8", "float8_e4m3fn", "float8_e5m2",
                              "bfloat16", "float16", "float32", "bool", "complex64",
                              "float4_e2m1fn", "highest", "default", "tf32"]))
def test_a_string_field_of_a_variant_is_one_the_ops_run_or_refused(field, value):
    from repro.precision.recipes import _FIELD_VALUES

    spec = f"fp8-delayed:{field}={value}"
    if value in _FIELD_VALUES[field]:
        assert getattr(resolve(spec), field) == value
    else:
        one_line_error(ValueError, lambda: resolve(spec),
                       f"recipe {spec!r}: {field} must be one of")
