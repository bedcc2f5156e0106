"""The weight-only GEMM with the scale after the product (repro.precision.dequant_gemm) and its
use by the exported fp8-w / int8-w formats: the XLA form against a float64 product of the
dequantized weights, the Pallas kernel (interpret mode) against the XLA form, the choice of
form, and that the exported model's program widens the 1-byte weights only inside the dot."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro.precision import dequant_gemm as D

QTYPES = [jnp.int8, jnp.float8_e4m3fn]


def _f64(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)


def operands(rows, k, n, qtype, seed=0, extreme=True):
    """x[rows, k] (BF16), q[k, n], scale[n] (BF16, positive). ``extreme``: a zero column
    (scale 1, as qwix stores an all-zero channel), a column at the format's largest values,
    x with a row of zeros."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, k)) * rng.uniform(0.1, 10.0, size=(rows, 1))
    big = 127 if qtype == jnp.int8 else 448
    qv = np.clip(np.round(rng.normal(size=(k, n)) * big / 3), -big, big)
    s = rng.uniform(1e-4, 1e-2, size=n)
    if extreme:
        qv[:, 0], s[0] = 0, 1.0
        qv[:, 1] = np.where(np.arange(k) % 2, big, -big) if qtype != jnp.int8 else \
            np.where(np.arange(k) % 2, 127, -128)
        x[-1] = 0.0 if rows > 1 else x[-1]
    q = jnp.asarray(qv.astype(np.float32)).astype(qtype)
    return jnp.asarray(x, jnp.bfloat16), q, jnp.asarray(s, jnp.bfloat16)


def reference64(x, q, s):
    """float64 product of x and the dequantized weight q * scale."""
    return _f64(x) @ (_f64(q) * _f64(s).reshape(1, -1))


def assert_bf16_close(y, ref, x, q, s):
    """Within BF16's output rounding (half an ulp, 2^-9 relative; 2^-8 allowed) plus the FP32
    accumulation's error, bounded by |x| @ |q * s|."""
    y = _f64(y)
    mag = np.abs(_f64(x)) @ (np.abs(_f64(q)) * _f64(s).reshape(1, -1))
    bad = np.abs(y - ref) > 2.0 ** -8 * np.abs(ref) + 1e-5 * mag
    assert not bad.any(), (np.argwhere(bad)[:5], y[bad][:5], ref[bad][:5])


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 8])
def test_xla_form_matches_the_float64_product_of_dequantized_weights(qtype, rows):
    x, q, s = operands(rows, 192, 96, qtype)
    y = D.dot_xla(x, q, s)
    assert y.shape == (rows, 96) and y.dtype == jnp.bfloat16
    assert_bf16_close(y, reference64(x, q, s), x, q, s)
    assert np.all(_f64(y)[:, 0] == 0)  # the zero column


def test_xla_form_keeps_leading_axes_and_takes_a_2d_scale():
    x, q, s = operands(6, 64, 32, jnp.int8, seed=1)
    y = D.dot_xla(x.reshape(2, 3, 64), q, s.reshape(1, 32))
    np.testing.assert_array_equal(np.asarray(y.reshape(6, 32)), np.asarray(D.dot_xla(x, q, s)))


def test_scale_after_the_product_is_at_least_as_accurate_as_dequantizing_first():
    """qwix's order rounds every q * scale to BF16; the stored values times x in FP32 do
    not: over many outputs the error of the scaled product is smaller."""
    x, q, s = operands(8, 512, 256, jnp.int8, seed=2, extreme=False)
    ref = reference64(x, q, s)
    ours = np.abs(_f64(D.dot_xla(x, q, s)) - ref).mean()
    theirs = np.abs(_f64(D.reference(x, q, s)) - ref).mean()
    assert ours <= theirs


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 8, 40])
def test_pallas_kernel_in_interpret_mode_equals_the_xla_form(qtype, rows):
    x, q, s = operands(rows, 192, 96, qtype, seed=3)  # 3 steps along K, 3 column blocks
    assert D.blocks(rows, 192, 96)[1:] == (32, 64)
    got = D.dot_pallas(x, q, s, interpret=True)
    want = D.dot_xla(x, q, s)
    assert got.shape == want.shape and got.dtype == want.dtype
    # the same FP32 sums in another order: at most one BF16 rounding step apart
    np.testing.assert_allclose(_f64(got), _f64(want), rtol=2.0 ** -7, atol=1e-6)
    assert_bf16_close(got, reference64(x, q, s), x, q, s)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 3])
def test_reduce_form_and_transposed_weights_match_the_float64_product(qtype, rows):
    """The multiply-and-sum form, and every form reading the weight stored [N, K], against
    float64 (the same FP32 sums as the XLA form's GEMM, in another order)."""
    x, q, s = operands(rows, 192, 96, qtype, seed=6)
    ref = reference64(x, q, s)
    qt = jnp.asarray(q.T)
    for y in (D.dot_reduce(x, q, s), D.dot_reduce(x, qt, s, transposed=True),
              D.dot_xla(x, qt, s, transposed=True)):
        assert y.shape == (rows, 96) and y.dtype == jnp.bfloat16
        assert_bf16_close(y, ref, x, q, s)
    np.testing.assert_array_equal(np.asarray(D.reference(x, qt, s, transposed=True)),
                                  np.asarray(D.reference(x, q, s)))
    with pytest.raises(ValueError, match="does not contract"):
        D.dot_reduce(x, qt, s)  # [N, K] read as [K, N]


def test_dot_takes_the_reduction_for_one_row_only():
    x, q, s = operands(8, 64, 32, jnp.int8, seed=7)
    one = str(jax.make_jaxpr(lambda a: D.dot(a, q, s, "reduce"))(x[:1]))
    assert "reduce_sum" in one and "dot_general" not in one
    more = str(jax.make_jaxpr(lambda a: D.dot(a, q, s, "reduce"))(x[:2]))
    assert "dot_general" in more and "reduce_sum" not in more
    np.testing.assert_array_equal(np.asarray(D.dot(x[:2], q, s, "reduce")),
                                  np.asarray(D.dot_xla(x[:2], q, s)))


@pytest.mark.parametrize("splits", [2, 4])
def test_split_k_pallas_kernel_in_interpret_mode_equals_the_xla_form(splits):
    x, q, s = operands(3, 256, 64, jnp.float8_e4m3fn, seed=8)
    got = D.dot_pallas(x, q, s, interpret=True, splits=splits, block_n=32, block_k=32)
    np.testing.assert_allclose(_f64(got), _f64(D.dot_xla(x, q, s)), rtol=2.0 ** -7, atol=1e-6)
    assert_bf16_close(got, reference64(x, q, s), x, q, s)
    with pytest.raises(ValueError, match="power-of-two parts"):
        D.dot_pallas(x, q, s, interpret=True, splits=3)


def test_pallas_kernel_tiles_and_pads_rows():
    x, q, s = operands(3, 64, 48, jnp.float8_e4m3fn, seed=4)  # 48 columns: blocks of 16
    assert D.blocks(3, 64, 48) == (16, 16, 64)
    got = D.dot_pallas(x.reshape(1, 3, 64), q, s, interpret=True, block_n=16, block_k=16)
    assert got.shape == (1, 3, 48)
    np.testing.assert_allclose(_f64(got[0]), _f64(D.dot_xla(x, q, s)), rtol=2.0 ** -7,
                               atol=1e-6)


def test_blocks_are_powers_of_two_dividing_the_shape():
    assert D.blocks(1, 4096, 4096) == (16, 32, 256)
    assert D.blocks(64, 11008, 22016) == (64, 128, 64)
    assert D.blocks(200, 4096, 12288) == (64, 128, 64)
    assert D.blocks(1, 4096, 4096, block_n=128, block_k=512) == (16, 128, 512)
    assert D.blocks(1, 4096, 48) == (16, 16, 256)
    assert D.blocks(1, 100, 4096) is None  # K not a multiple of 16
    assert D.blocks(1, 4096, 72) is None  # 72 columns: no power-of-two block of 16 or more


def test_dot_picks_the_form_by_rows_and_backend():
    x, q, s = operands(4, 64, 32, jnp.int8, seed=5)
    # few rows: the scale after the product (a dot in FP32, no multiply of the weight)
    few = str(jax.make_jaxpr(lambda a: D.dot(a, q, s, "pallas"))(x))
    assert "preferred_element_type=float32" in few and "pallas_call" not in few  # CPU
    # rows > K / 2: qwix's order, dequantize then dot
    many = jnp.zeros((40, 64), jnp.bfloat16)
    assert not D.scale_on_output(40, 64) and D.scale_on_output(32, 64)
    np.testing.assert_array_equal(np.asarray(D.dot(many + x[:1], q, s)),
                                  np.asarray(D.reference(many + x[:1], q, s)))
    with pytest.raises(ValueError, match="impl"):
        D.dot(x, q, s, "triton")
    with pytest.raises(ValueError, match="one per output column"):
        D.dot_xla(x, q, s[:16])
    with pytest.raises(ValueError, match="1-byte"):
        D.dot_xla(x, q.astype(jnp.bfloat16), s)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows,splits,block_n", [(1, 1, 16), (1, 2, 32), (3, 4, 8)])
def test_gemv_kernel_in_interpret_mode_matches_the_float64_product(qtype, rows, splits,
                                                                   block_n):
    """The Pallas GEMV on a weight stored [N, K] (interpret mode): the float64 product of
    the dequantized weight within BF16 rounding, and the XLA form up to FP32 order."""
    x, q, s = operands(rows, 1024, 96, qtype, seed=9)
    qt = jnp.asarray(q.T)
    got = D.dot_gemv(x, qt, s, block_n=block_n, block_k=128, splits=splits, interpret=True)
    assert got.shape == (rows, 96) and got.dtype == jnp.bfloat16
    assert_bf16_close(got, reference64(x, q, s), x, q, s)
    np.testing.assert_allclose(_f64(got), _f64(D.dot_xla(x, q, s)), rtol=2.0 ** -7, atol=1e-6)
    assert np.all(_f64(got)[:, 0] == 0)  # the zero column


def test_gemv_kernel_propagates_inf_and_nan_as_the_float64_product():
    x, q, s = operands(1, 256, 32, jnp.float8_e4m3fn, seed=10)
    x = x.at[0, 5].set(jnp.inf).at[0, 7].set(-jnp.inf)
    got = _f64(D.dot_gemv(x, jnp.asarray(q.T), s, block_n=16, block_k=64, splits=2,
                          interpret=True))
    with np.errstate(invalid="ignore"):
        want = reference64(x, q, s)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.sign(got[~finite & ~np.isnan(want)]),
                                  np.sign(want[~finite & ~np.isnan(want)]))
    assert np.isnan(got[0, 0])  # inf times the zero column


def test_gemv_kernel_rejects_tilings_that_do_not_divide_the_weight():
    x, q, s = operands(1, 256, 48, jnp.int8, seed=11)
    qt = jnp.asarray(q.T)
    with pytest.raises(ValueError, match="equal parts"):
        D.dot_gemv(x, qt, s, splits=3, interpret=True)
    with pytest.raises(ValueError, match="does not tile"):
        D.dot_gemv(x, qt, s, block_n=32, interpret=True)  # 48 rows of qt
    with pytest.raises(ValueError, match="does not contract"):
        D.dot_gemv(x, q, s, interpret=True)  # [K, N] read as [N, K]


def test_dot_runs_the_gemv_only_with_a_tiling_for_the_device_and_shape(monkeypatch):
    x, q, s = operands(2, 256, 32, jnp.int8, seed=12)
    qt = jnp.asarray(q.T)

    def prims(a, w, transposed=True):
        return str(jax.make_jaxpr(lambda a: D.dot(a, w, s, "gemv", transposed))(a))

    assert D.gemv_tiles(256, 32, jnp.int8) is None  # the CPU: no table
    assert "reduce_sum" in prims(x[:1], qt) and "pallas_call" not in prims(x[:1], qt)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    kind = jax.devices()[0].device_kind
    monkeypatch.setitem(D.GEMV_TILES, kind, {("int8", 256, 32): (16, 64, 4, 2)})
    monkeypatch.setattr(D, "dot_gemv", functools.partial(D.dot_gemv, interpret=True))
    assert D.gemv_tiles(256, 32, jnp.int8) == (16, 64, 4, 2)
    assert D.gemv_tiles(256, 32, jnp.float8_e4m3fn) is None  # another type: another entry
    assert "pallas_call" in prims(x[:1], qt)
    assert "pallas_call" not in prims(x, qt)  # two rows: the XLA form
    assert "pallas_call" not in prims(x[:1], q, transposed=False)  # [K, N]: the reduction
    assert_bf16_close(D.dot(x[:1], qt, s, "gemv", True), reference64(x[:1], q, s), x[:1], q, s)


@pytest.mark.parametrize("how", D.WIDENINGS)
def test_widen_gives_every_int8_and_e4m3_value_exactly(how):
    """Each INT8 widening and E4M3's convert against ml_dtypes / numpy, all 256 bit patterns
    (E4M3's NaN stays NaN), also inside the GEMV (interpret mode) at every byte lane."""
    i8 = np.arange(-128, 128, dtype=np.int8)
    got = np.asarray(D.widen(jnp.asarray(i8), how))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, i8.astype(np.float32))
    f8 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(np.asarray(D.widen(jnp.asarray(f8), how)),
                                  f8.astype(np.float32))
    x, q, s = operands(3, 512, 32, jnp.int8, seed=13)
    q = jnp.asarray(np.resize(i8, (512, 32)))  # every value in every column
    assert_bf16_close(D.dot_gemv(x, q.T, s, block_n=16, block_k=128, widen=how,
                                 interpret=True), reference64(x, q, s), x, q, s)


def test_widen_rejects_an_unknown_widening():
    with pytest.raises(ValueError, match="prmt"):
        D.widen(jnp.zeros((4,), jnp.int8), "lut")
    with pytest.raises(ValueError, match="widen must be one of"):
        D.dot_gemv(jnp.zeros((1, 256), jnp.bfloat16), jnp.zeros((16, 256), jnp.int8),
                   jnp.ones((16,), jnp.bfloat16), widen="lut", interpret=True)


def test_numerics_check_catches_a_wrong_gemv_widening(monkeypatch):
    from repro.precision import check

    assert all(r["ok"] for r in check._gemv_widen_rows())
    monkeypatch.setattr(D, "BYTE_TO_F32_BIAS", D.BYTE_TO_F32_BIAS + 1.0)
    jax.clear_caches()  # dot_gemv is jitted: trace it again with the wrong bias
    bad = [r["check"] for r in check._gemv_widen_rows() if not r["ok"]]
    jax.clear_caches()
    assert bad == ["dequant_gemm.dot_gemv widens every int8 exactly (prmt)"]


def test_every_gemv_tiling_in_the_table_fits_its_weight():
    for device, table in D.GEMV_TILES.items():
        for (dtype, k, n), tiles in table.items():
            if tiles is None:
                continue
            assert isinstance(tiles, D.Gemv) and tiles.widen in D.WIDENINGS
            assert dtype == "int8" or tiles.widen == "convert"  # E4M3: the hardware's
            x = jax.ShapeDtypeStruct((1, k), jnp.bfloat16)
            qt = jax.ShapeDtypeStruct((n, k), jnp.dtype(dtype))
            sc = jax.ShapeDtypeStruct((n,), jnp.bfloat16)
            out = jax.eval_shape(functools.partial(D.dot_gemv, **tiles._asdict(),
                                                   interpret=True), x, qt, sc)
            assert out.shape == (1, n), (device, dtype, k, n)
            bk = tiles.block_k
            assert bk == D._largest_block(k // tiles.splits, bk), (device, dtype, k, n)


# ------------------------------------------------------------- the exported formats


qwix = pytest.importorskip("qwix")


def _walk(jaxpr):
    """``jaxpr`` and every jaxpr nested in its equations (jit, scan, custom_vjp...)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    yield jaxpr
    for eqn in jaxpr.eqns:
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else [p]):
                if hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                    yield from _walk(sub)


def widened_weights(closed):
    """For every convert of a 2-D 1-byte array (a quantized weight) to a wider type in the
    program: the primitives that read the widened array ("out" where it leaves its jaxpr)."""
    found = []
    narrow = {jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn)}
    for jaxpr in _walk(closed):
        readers = {}
        for eqn in jaxpr.eqns:
            for v in eqn.invars:
                if isinstance(v, jax.extend.core.Var):
                    readers.setdefault(v, []).append(eqn.primitive.name)
        outs = {v for v in jaxpr.outvars if isinstance(v, jax.extend.core.Var)}
        for eqn in jaxpr.eqns:
            if eqn.primitive.name != "convert_element_type":
                continue
            src = eqn.invars[0].aval
            if src.ndim == 2 and src.dtype in narrow:
                out = eqn.outvars[0]
                found.append(readers.get(out, []) + (["out"] if out in outs else []))
    return found


@pytest.fixture(scope="module")
def tiny():
    from repro.models import lm as M

    cfg = M.get_config("tiny")
    model = M.Decoder(cfg, "bf16")
    tokens = jax.random.randint(jax.random.key(1), (1, 8), 0, 256)
    return cfg, jax.jit(model.init)(jax.random.key(0), tokens)["params"], tokens


@pytest.mark.parametrize("fmt", ["fp8-w", "int8-w"])
def test_exported_weight_only_model_widens_weights_only_inside_the_dot(tiny, fmt):
    from repro.models import lm_quantize as Q
    from repro.precision import export as X

    cfg, params, tokens = tiny
    ex = Q.export_lm(cfg, params, fmt)
    assert ex.fmt.kernel == X.WEIGHT_ONLY_KERNEL
    found = widened_weights(jax.make_jaxpr(ex.model.apply)(ex.variables, tokens))
    assert len(found) == 4 * cfg.n_layers  # qkv, out, wi, wo of every block
    assert all(r == ["dot_general"] for r in found), found
    # qwix's own product (the weight dequantized first) fails the same check
    old = Q.export_lm(cfg, params, dataclasses.replace(ex.fmt, kernel=None, weight_layout="kn"))
    found = widened_weights(jax.make_jaxpr(old.model.apply)(old.variables, tokens))
    assert found and all(r == ["mul"] for r in found), found


def test_exported_weight_only_logits_match_qwix_dequantize_first(tiny):
    from repro.models import lm_quantize as Q

    cfg, params, tokens = tiny
    for fmt in ("fp8-w", "int8-w"):
        ex = Q.export_lm(cfg, params, fmt)
        old = Q.export_lm(cfg, params, dataclasses.replace(ex.fmt, kernel=None, weight_layout="kn"))
        a = np.asarray(ex.model.apply(ex.variables, tokens))
        b = np.asarray(old.model.apply(old.variables, tokens))
        assert 0 < np.abs(a - b).max() <= 0.02 * np.abs(b).max(), fmt


def test_pallas_kernel_serves_the_exported_model_like_the_xla_form(tiny, monkeypatch):
    """The exported model with kernel "pallas" where the kernel runs (forced here, in
    interpret mode) gives the XLA form's logits up to FP32 summation order."""
    import functools

    from repro.models import lm_quantize as Q

    cfg, params, tokens = tiny
    ex = Q.export_lm(cfg, params, "int8-w")
    want = np.asarray(ex.model.apply(ex.variables, tokens))
    monkeypatch.setattr(D, "pallas_fits", lambda rows, k, n: True)
    monkeypatch.setattr(D, "dot_pallas", functools.partial(D.dot_pallas, interpret=True))
    pal = Q.export_lm(cfg, params, dataclasses.replace(ex.fmt, kernel="pallas",
                                                       weight_layout="kn"))
    closed = jax.make_jaxpr(pal.model.apply)(pal.variables, tokens)
    calls = [e for j in _walk(closed) for e in j.eqns if e.primitive.name == "pallas_call"]
    assert len(calls) == 4 * cfg.n_layers
    np.testing.assert_allclose(np.asarray(pal.model.apply(pal.variables, tokens)), want,
                               atol=2e-2 * np.abs(want).max())


def test_e4m3_and_int8_values_are_exact_in_bfloat16():
    """Why the GEMM may take convert(q) in BF16: every stored value survives the widening."""
    f8 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    f8 = f8[np.isfinite(f8.astype(np.float32))]
    i8 = np.arange(-128, 128, dtype=np.int8)
    for v in (f8, i8):
        wide = np.asarray(jnp.asarray(v).astype(jnp.bfloat16), np.float64)
        np.testing.assert_array_equal(wide, v.astype(np.float64))
