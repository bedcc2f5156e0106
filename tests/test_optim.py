"""Optimizer pieces against independent references (float64 accumulation, hand arithmetic)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from repro.precision import optim


def _run(tx, p0, updates):
    """Apply each row of ``updates`` (as the chain's input) to ``p0`` in a scan."""
    state = tx.init(p0)

    def step(carry, u):
        p, s = carry
        du, s = tx.update(u, s, p)
        return (optax.apply_updates(p, du), s), None

    (p, s), _ = jax.lax.scan(step, (p0, state), updates)
    return p, s


# (storage, mean and std of the per-step update, largest allowed final error): the updates are
# mostly below half an ulp of the stored value (bf16 ulp at 1..4: 2**-7..2**-6; the fp8 grid
# is 16x coarser), so naive rounding drops nearly all of them.
@pytest.mark.parametrize("storage,mean,std,max_err", [("bf16", 1e-4, 2e-4, 2.0 ** -6),
                                                      ("fp8", 5e-3, 5e-3, 1.0)])
def test_kahan_beats_naive_low_precision_storage(storage, mean, std, max_err):
    rng = np.random.default_rng(0)
    n, steps = 256, 2000
    p0_64 = rng.uniform(0.5, 2.0, n)
    ups = (rng.normal(mean, std, (steps, n))).astype(np.float32)
    p0 = optim.round_to_storage(jnp.asarray(p0_64, jnp.float32), storage)
    ref = np.asarray(p0, np.float64) + ups.astype(np.float64).sum(0)  # float64 accumulation

    kahan, _ = _run(optim.kahan_update(storage), p0, jnp.asarray(ups))
    naive, _ = _run(optim.store_update(storage), p0, jnp.asarray(ups))
    assert kahan.dtype == naive.dtype == jnp.bfloat16
    err_k = np.abs(np.asarray(kahan, np.float64) - ref).mean()
    err_n = np.abs(np.asarray(naive, np.float64) - ref).mean()
    assert err_k < err_n / 10, (err_k, err_n)
    # Kahan stays within one storage ulp of the exact sum.
    assert np.abs(np.asarray(kahan, np.float64) - ref).max() <= max_err


def test_fp8_storage_is_on_the_scaled_e4m3_grid():
    x = jnp.asarray(np.random.default_rng(1).normal(0, 0.05, 1000), jnp.float32)
    y = np.asarray(optim.round_to_storage(x, "fp8"), np.float64)
    amax = float(jnp.max(jnp.abs(x)))
    scale = 2.0 ** np.ceil(np.log2(amax / 448.0))
    q = y / scale
    # Every stored value is an exact E4M3 value times the power-of-two scale (ml_dtypes ref).
    np.testing.assert_array_equal(q.astype(ml_dtypes.float8_e4m3fn).astype(np.float64), q)
    assert np.abs(y - np.asarray(x)).max() <= amax * 2 ** -3  # 3 mantissa bits


def test_bf16_naive_update_matches_optax_rounding():
    p = jnp.asarray([1.0, 2.0, -3.0], jnp.bfloat16)
    u = jnp.asarray([1e-3, 0.02, -0.5], jnp.float32)
    du, _ = optim.store_update("bf16").update(u, optax.EmptyState(), p)
    np.testing.assert_array_equal(optax.apply_updates(p, du),
                                  (p.astype(jnp.float32) + u).astype(jnp.bfloat16))


def test_weight_clip():
    tx = optim.weight_clip(1.0)
    p = jnp.asarray([0.9, -0.95, 0.2, 3.0])
    du, _ = tx.update(jnp.asarray([0.5, -0.5, 0.1, 0.0]), tx.init(p), p)
    np.testing.assert_allclose(optax.apply_updates(p, du), [1.0, -1.0, 0.3, 1.0], atol=1e-7)
    with pytest.raises(ValueError):
        optim.weight_clip(0.0)


def test_loss_scale_halves_on_inf_and_grows_after_period():
    inner = optax.sgd(1.0)
    tx = optim.dynamic_loss_scale(inner, init_scale=8.0, period=3)
    p = {"w": jnp.ones(2)}
    s = tx.init(p)
    assert float(optim.loss_scale(s)) == 8.0
    bad = {"w": jnp.asarray([jnp.inf, 1.0])}
    u, s = tx.update(bad, s, p)
    assert float(optim.loss_scale(s)) == 4.0
    np.testing.assert_array_equal(u["w"], 0.0)  # step skipped
    assert int(optim.skipped_steps(s)) == 1
    for i in range(3):
        u, s = tx.update({"w": jnp.asarray([4.0, 8.0])}, s, p)
        # Gradients are unscaled by the current scale (4): sgd(1) update = -g / 4.
        np.testing.assert_allclose(u["w"], [-1.0, -2.0])
        assert float(optim.loss_scale(s)) == (8.0 if i == 2 else 4.0)
    u, s = tx.update({"w": jnp.asarray([jnp.nan, 0.0])}, s, p)
    assert float(optim.loss_scale(s)) == 4.0 and int(optim.skipped_steps(s)) == 2


def test_skip_nonfinite_counts_and_keeps_state():
    tx = optim.make_optimizer({"lr": 0.1, "master_weights": "bf16", "kahan": True})
    p = {"w": jnp.ones(3, jnp.bfloat16)}
    s = tx.init(p)
    u, s = tx.update({"w": jnp.ones(3, jnp.bfloat16)}, s, p)
    p1 = optax.apply_updates(p, u)
    assert p1["w"].dtype == jnp.bfloat16 and float(p1["w"][0]) < 1.0
    u, s2 = tx.update({"w": jnp.asarray([1.0, jnp.nan, 1.0], jnp.bfloat16)}, s, p1)
    np.testing.assert_array_equal(u["w"], 0.0)
    assert int(optim.skipped_steps(s2)) == 1
    # Inner state (Adam moments, Kahan buffer) is untouched by the skipped step.
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(s2)):
        if a.shape:
            np.testing.assert_array_equal(a, b)


def test_make_optimizer_flags_and_dtypes_stable_under_scan():
    p = {"w": jnp.ones((4, 4), jnp.float32)}
    for mw in ("fp32", "bf16", "fp8"):
        for kahan in (False, True):
            cfg = dict(lr=1e-2, master_weights=mw, kahan=kahan, weight_clip=0.5,
                       grad_clip=1.0, loss_scale=(mw == "fp32"))
            tx = optim.make_optimizer(cfg)
            p0 = optim.to_storage(p, mw)
            assert p0["w"].dtype == optim.container_dtype(mw)
            ups = {"w": jnp.ones((5, 4, 4), p0["w"].dtype)}
            p1, s = _run(tx, p0, ups)  # lax.scan fails if any dtype drifted
            assert p1["w"].dtype == p0["w"].dtype
            assert float(jnp.max(jnp.abs(p1["w"]))) <= 0.5 + 1e-6
    with pytest.raises(ValueError, match="master_weights"):
        optim.make_optimizer({"master_weights": "int8"})


@pytest.mark.parametrize("e", list(range(-40, 40)))
def test_fp8_storage_scale_is_the_smallest_exact_power_of_two(e):
    """amax = 448 * 2**e exactly fits scale 2**e (not 2**(e+1), and exactly a power of two):
    XLA's log2/exp2 on CPU are not exact for powers of two, so they must not pick the scale."""
    s = float(optim._pow2_scale(jnp.float32(448.0 * 2.0 ** e), 448.0))
    assert s == 2.0 ** e
    above = np.float32(448.0 * 2.0 ** e) * np.float32(1 + 2 ** -20)
    assert float(optim._pow2_scale(jnp.float32(above), 448.0)) == 2.0 ** (e + 1)
    below = np.float32(448.0 * 2.0 ** e) * np.float32(1 - 2 ** -20)
    assert float(optim._pow2_scale(jnp.float32(below), 448.0)) == 2.0 ** e
    # The smallest E4M3 subnormal at that scale survives the store (float64 reference).
    x = np.array([448.0 * 2.0 ** e, 2.0 ** (e - 9), -3 * 2.0 ** (e - 9)], np.float32)
    np.testing.assert_array_equal(np.asarray(optim.round_to_storage(jnp.asarray(x), "fp8"),
                                             np.float64), x.astype(np.float64))
