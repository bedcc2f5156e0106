"""Numerics that must survive XLA's GPU convert folding (``SimplifyFPConversions``).

On the GPU, XLA may rewrite ``x.astype(low).astype(f32)`` into ``x``; code that rounds by such a
round trip then skips the rounding on the GPU only. ``_fold_converts.fold_converts`` evaluates
a function the way that pass compiles it; every quantizer, the low-precision weight storage
and the Kahan update must give the same bits with and without it. Found on the H200, where RL
quality runs of bf16w-kahan and bf16w-nokahan came out bitwise identical (those records are
voided in ``repro/data/defects.yaml``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _fold_converts import fold_converts

from repro.precision import check as numerics_check
from repro.precision import formats as F
from repro.precision import ops, optim
from repro.precision.recipes import resolve

DTYPES = [jnp.bfloat16, jnp.float16, F.E4M3, F.E5M2, F.E2M1]


def _x(seed=0, shape=(64, 64), scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape).astype(np.float32) * scale)


def _same(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True) and np.array_equal(
        np.signbit(a), np.signbit(b))


def test_the_model_folds_a_round_trip():
    # Negative control: without this the tests below could not fail.
    x = _x()
    f = lambda v: v.astype(jnp.bfloat16).astype(jnp.float32)  # noqa: E731
    assert not _same(f(x), x)
    assert _same(fold_converts(f)(x), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_round_to_matches_ml_dtypes_everywhere(dtype):
    """Every representable value, every midpoint (ties to even), their neighbours, random
    values over the whole range and the subnormals, zeros of both signs and NaN."""
    info = ml_dtypes.finfo(dtype)
    fmax = float(info.max)
    if jnp.dtype(dtype).itemsize == 1 or dtype == F.E2M1:
        v = F.representable_values(dtype)
    else:  # 16-bit: every value of a few binades around 1 and the subnormal range
        bits = np.arange(0, 2 ** 15, 7, dtype=np.uint16)
        with np.errstate(invalid="ignore"):  # NaN bit patterns
            v = np.unique(np.abs(bits.view(jnp.dtype(dtype)).astype(np.float64)))
        v = v[np.isfinite(v)]
    mids = (v[1:] + v[:-1]) / 2
    pts = np.concatenate([v, mids, np.nextafter(mids.astype(np.float32), 0),
                          np.nextafter(mids.astype(np.float32), np.inf)])
    rng = np.random.default_rng(1)
    rand = np.exp(rng.uniform(np.log(float(info.smallest_subnormal)) - 3,
                              np.log(fmax), 20000))
    x = np.concatenate([pts, rand]).astype(np.float32)
    x = np.clip(np.concatenate([x, -x, [0.0, -0.0, np.nan]]), -fmax, fmax).astype(np.float32)
    ref = x.astype(dtype).astype(np.float32)  # ml_dtypes / numpy: round to nearest even
    if dtype == F.E2M1:  # E2M1 has no NaN: compare the finite inputs
        keep = ~np.isnan(x)
        x, ref = x[keep], ref[keep]
    got = np.asarray(jax.jit(lambda a: F.round_to(a, dtype))(x))
    bad = ~((got == ref) | (np.isnan(got) & np.isnan(ref)))
    assert not bad.any(), (x[bad][:5], got[bad][:5], ref[bad][:5])
    assert np.array_equal(np.signbit(got[ref == 0]), np.signbit(ref[ref == 0]))


@pytest.mark.parametrize("fmt,kw", [("e4m3", {}), ("e5m2", {}), ("mxfp8", {}),
                                    ("nvfp4", {"block": (16, 16)}),
                                    ("nvfp4", {"block": (1, 16)})])
def test_quantizers_survive_convert_folding(fmt, kw):
    x = _x(2).at[0, :3].set(jnp.array([1e-6, -3e-5, 0.0]))  # subnormals of the formats
    f = lambda v: F.fake_quantize(v, fmt, **kw)  # noqa: E731
    y = f(x)
    assert not _same(y, x)  # it does quantize
    assert _same(fold_converts(f)(x), y)


def test_stochastic_nvfp4_survives_convert_folding():
    x, key = _x(3), jax.random.key(0)
    f = lambda v: F.nvfp4_dequantize(F.nvfp4_quantize(v, (1, 16), "stochastic", key))  # noqa
    assert _same(fold_converts(f)(x), f(x))


@pytest.mark.slow  # compiles a training step per storage (25 s for fp8)
@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_storage_and_kahan_survive_convert_folding(storage):
    p0 = {"w": optim.to_storage(jnp.full((32,), 0.1, jnp.float32) + _x(4, (32,), 0.01),
                                storage)}

    def run(kahan):
        return numerics_check.storage_updates(storage, kahan)

    kahan, naive = run(True)(p0), run(False)(p0)
    assert not _same(kahan, naive)  # Kahan changes the result (A7 can be measured)
    assert _same(fold_converts(run(True))(p0), kahan)
    assert _same(fold_converts(run(False))(p0), naive)


def test_fp8_conv_gradients_survive_convert_folding():
    """The FP8 convolution's backward dequantizes its FP8 operands to BF16 (a convert chain)."""
    r = resolve("fp8-current")
    x, w = _x(5, (2, 6, 6, 16)), _x(6, (3, 3, 16, 16), 0.1)

    def loss(x, w):
        return jnp.sum(ops.fp8_conv(x, w, r) ** 2)

    g = jax.grad(loss, argnums=(0, 1))
    a, b = g(x, w), fold_converts(g)(x, w)
    assert all(_same(u, v) for u, v in zip(a, b))


def test_numerics_check_passes_here_and_catches_a_skipped_rounding(monkeypatch):
    rows = numerics_check.checks()
    assert all(r["ok"] for r in rows if r["required"])
    from repro import cli

    assert cli.main(["check"]) == 0
    monkeypatch.setattr(F, "cast", lambda v, d: jnp.asarray(v, jnp.float32))  # rounding skipped
    assert cli.main(["check"]) == 1


def test_the_fp32_check_tells_fp32_from_rounded_operands(monkeypatch):
    """`repro check` refuses a device whose FP32 GEMM at HIGHEST, or the fp32 recipe's layer,
    rounds its operands (a TPU's default precision computes them in bfloat16)."""
    rows = {r["check"].split(" (")[0]: r for r in numerics_check._fp32_rows()}
    assert rows["an FP32 GEMM at Precision.HIGHEST is FP32"]["ok"]
    assert rows["the fp32 recipe's dense layer is FP32"]["ok"]

    real = jnp.dot

    def bf16_pass(a, b, **_):  # what a TPU's default precision does to an FP32 product
        return real(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                    preferred_element_type=jnp.float32)

    assert numerics_check._gemm_error(bf16_pass) > 100 * numerics_check.FP32_TOLERANCE
    monkeypatch.setattr(jnp, "dot", bf16_pass)
    bad = [r for r in numerics_check._fp32_rows() if r["required"] and not r["ok"]]
    assert bad and "HIGHEST" in bad[0]["check"]
