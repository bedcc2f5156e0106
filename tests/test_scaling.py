"""Tests for repro.precision.scaling: current and delayed per-tensor scaling (TE semantics)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.precision import scaling as S

E4M3_MAX = 448.0


def test_init_delayed():
    s = S.init_delayed(16)
    assert s.amax_history.shape == (16,) and s.amax_history.dtype == jnp.float32
    assert np.all(np.asarray(s.amax_history) == 0)
    assert s.scale.shape == () and s.scale.dtype == jnp.float32 and float(s.scale) == 1.0
    assert S.init_delayed().amax_history.shape == (1024,)
    with pytest.raises(ValueError):
        S.init_delayed(0)


def test_amax():
    assert float(S.amax(jnp.array([[-3.0, 1.0], [2.5, 0.0]]))) == 3.0
    a = S.amax(jnp.array([1.0, -7.0], jnp.bfloat16))
    assert a.dtype == jnp.float32 and float(a) == 7.0
    assert np.isnan(float(S.amax(jnp.array([1.0, np.nan, 5.0]))))  # NaN propagates
    assert float(S.amax(jnp.array([1.0, -np.inf]))) == np.inf


def test_current_scale():
    x = jnp.array([-3.0, 1.0, 2.0])
    np.testing.assert_allclose(float(S.current_scale(x, E4M3_MAX)), 3.0 / 448.0, rtol=2e-7)
    np.testing.assert_allclose(float(S.current_scale(x, E4M3_MAX, margin=2)), 12.0 / 448.0, rtol=2e-7)
    np.testing.assert_allclose(float(S.current_scale(x, 57344.0)), 3.0 / 57344.0, rtol=2e-7)
    assert float(S.current_scale(jnp.zeros(4), E4M3_MAX)) == 1.0
    assert float(S.current_scale(jnp.array([np.nan, 1.0]), E4M3_MAX)) == 1.0


def push_all(state, amaxes, **kw):
    for a in amaxes:
        state = S.delayed_update(state, a, E4M3_MAX, **kw)
    return state


def test_history_roll_newest_first_and_oldest_drops():
    s = push_all(S.init_delayed(4), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(s.amax_history), [3.0, 2.0, 1.0, 0.0])
    s = push_all(s, [4.0, 5.0])
    np.testing.assert_array_equal(np.asarray(s.amax_history), [5.0, 4.0, 3.0, 2.0])


def test_max_vs_most_recent():
    s_max = push_all(S.init_delayed(8), [4.0, 1.0], algo="max")
    s_rec = push_all(S.init_delayed(8), [4.0, 1.0], algo="most_recent")
    np.testing.assert_array_equal(np.asarray(s_max.amax_history), np.asarray(s_rec.amax_history))
    np.testing.assert_allclose(float(s_max.scale), 4.0 / 448.0, rtol=2e-7)
    np.testing.assert_allclose(float(s_rec.scale), 1.0 / 448.0, rtol=2e-7)


def test_max_forgets_after_history_len():
    s = push_all(S.init_delayed(2), [8.0, 1.0])
    np.testing.assert_allclose(float(s.scale), 8.0 / 448.0, rtol=2e-7)
    s = push_all(s, [1.0])  # the 8 has rolled out of a length-2 history
    np.testing.assert_allclose(float(s.scale), 1.0 / 448.0, rtol=2e-7)


@pytest.mark.parametrize("margin,factor", [(0, 1.0), (1, 2.0), (3, 8.0), (-1, 0.5)])
def test_margin_is_power_of_two_headroom(margin, factor):
    s = S.delayed_update(S.init_delayed(4), 448.0, E4M3_MAX, margin=margin)
    assert float(s.scale) == factor  # amax / fmax = 1 exactly
    s = S.delayed_update(S.init_delayed(4), 3.0, E4M3_MAX, margin=margin)
    np.testing.assert_allclose(float(s.scale), 3.0 / 448.0 * factor, rtol=2e-7)


def test_invalid_algo_lists_valid_ones():
    with pytest.raises(ValueError, match="max.*most_recent"):
        S.delayed_update(S.init_delayed(4), 1.0, E4M3_MAX, algo="mean")


def test_degenerate_amax_keeps_previous_scale():
    s = push_all(S.init_delayed(4), [2.0], algo="most_recent")
    prev = float(s.scale)
    np.testing.assert_allclose(prev, 2.0 / 448.0, rtol=2e-7)
    for bad in [0.0, np.nan, np.inf]:
        s2 = S.delayed_update(s, bad, E4M3_MAX, algo="most_recent")
        assert float(s2.scale) == prev
        assert np.isnan(float(s2.amax_history[0])) == np.isnan(bad)  # recorded as is
    # All-zero history from init: scale stays 1.0.
    assert float(S.delayed_update(S.init_delayed(4), 0.0, E4M3_MAX).scale) == 1.0
    # A NaN stays in the history and blocks "max" updates until it rolls out.
    s = push_all(S.init_delayed(2), [2.0, np.nan, 5.0])
    np.testing.assert_allclose(float(s.scale), 2.0 / 448.0, rtol=2e-7)
    s = push_all(s, [5.0])
    np.testing.assert_allclose(float(s.scale), 5.0 / 448.0, rtol=2e-7)


def test_jit_and_scan():
    step = jax.jit(S.delayed_update, static_argnames=("fmax", "algo", "margin"))

    def body(state, a):
        state = step(state, a, fmax=E4M3_MAX, algo="max", margin=0)
        return state, state.scale

    amaxes = jnp.array([1.0, 3.0, 2.0, 0.5, 0.25])
    final, scales = jax.lax.scan(body, S.init_delayed(3), amaxes)
    # Expected by hand: running max over a window of the last 3 amaxes.
    want = np.array([1.0, 3.0, 3.0, 3.0, 2.0]) / 448.0
    np.testing.assert_allclose(np.asarray(scales), want, rtol=2e-7)
    np.testing.assert_array_equal(np.asarray(final.amax_history), [0.25, 0.5, 2.0])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.01, 1e4), min_size=1, max_size=12), st.sampled_from(["max", "most_recent"]))
def test_history_property(amaxes, algo):
    n = 8
    s = push_all(S.init_delayed(n), amaxes, algo=algo)
    f32 = np.array(amaxes, np.float32)
    want_hist = np.zeros(n, np.float32)
    newest = f32[::-1][:n]
    want_hist[: len(newest)] = newest
    np.testing.assert_array_equal(np.asarray(s.amax_history), want_hist)
    ref_amax = newest.max() if algo == "max" else newest[0]
    np.testing.assert_allclose(float(s.scale), float(ref_amax) / 448.0, rtol=2e-7)
