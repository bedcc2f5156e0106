"""Legged-robot PPO (claim A11): the Gaussian policy against float64, the observation
statistics against NumPy, the environment adapter against a hand-made environment, the
physics' matmul precision under network recipes, a short ant run, Go1's placeholder meshes,
the study's cells and the A11 verdict on hand-made tables.

Tests that need brax / MuJoCo / Playground skip where the ``[legged]`` extra is missing."""

import math
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from repro.analysis import legged as A
from repro.models import envs, networks, ppo
from repro.models import ppo_continuous as pc

# ----------------------------------------------------------------- Gaussian policy, stats


def test_gaussian_log_prob_and_entropy_match_float64():
    from scipy import stats

    rng = np.random.default_rng(0)
    mean, log_std = rng.normal(size=(5, 3)), rng.normal(scale=0.5, size=(5, 3))
    a = rng.normal(size=(5, 3)) * 2
    ref_lp = stats.norm.logpdf(a, mean, np.exp(log_std)).sum(-1)
    ref_h = stats.norm.entropy(mean, np.exp(log_std)).sum(-1)
    out = (jnp.asarray(mean, jnp.float32), jnp.asarray(log_std, jnp.float32))
    np.testing.assert_allclose(pc.gaussian_log_prob(out, jnp.asarray(a)), ref_lp, rtol=1e-5)
    np.testing.assert_allclose(pc.gaussian_entropy(out), ref_h, rtol=1e-5)


def test_ppo_loss_with_the_gaussian_policy_matches_a_hand_computation():
    rng = np.random.default_rng(1)
    B, A_ = 6, 2
    mean, log_std = rng.normal(size=(B, A_)), np.full((B, A_), -0.3)
    act, old_lp = rng.normal(size=(B, A_)), rng.normal(size=B) - 2
    v_old, v_new, tgt, adv = (rng.normal(size=B) for _ in range(4))
    c = pc.validate({"num_envs": 2, "num_steps": 3, "num_minibatches": 1})
    batch = ppo.Transition(jnp.zeros((B, 1)), jnp.asarray(act), jnp.asarray(old_lp),
                           jnp.asarray(v_old), jnp.zeros(B), jnp.zeros(B, bool))
    got = ppo.ppo_loss((jnp.asarray(mean), jnp.asarray(log_std)), jnp.asarray(v_new), batch,
                       jnp.asarray(adv), jnp.asarray(tgt), c, pc.GAUSSIAN)
    lp = (-0.5 * ((act - mean) / np.exp(log_std)) ** 2 - log_std
          - 0.5 * math.log(2 * math.pi)).sum(-1)
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(lp - old_lp)
    actor = -np.mean(np.minimum(ratio * a, np.clip(ratio, 1 - c.clip_eps, 1 + c.clip_eps) * a))
    vc = v_old + np.clip(v_new - v_old, -c.clip_eps, c.clip_eps)
    value = 0.5 * np.mean(np.maximum((v_new - tgt) ** 2, (vc - tgt) ** 2))
    entropy = np.mean((log_std + 0.5 * (1 + math.log(2 * math.pi))).sum(-1))
    ref = actor + c.vf_coef * value - c.ent_coef * entropy
    np.testing.assert_allclose(float(got), ref, rtol=1e-5)


def test_running_statistics_equal_numpy_over_all_observations():
    rng = np.random.default_rng(2)
    chunks = [rng.normal(loc=3, scale=[1, 10, 0.1], size=(n, 3)) for n in (4, 7, 1, 30)]
    s = pc.init_stats(3)
    for x in chunks:
        s = pc.update_stats(s, jnp.asarray(x.reshape(-1, 1, 3)))
    every = np.concatenate(chunks)
    np.testing.assert_allclose(s.mean, every.mean(0), rtol=1e-5)
    np.testing.assert_allclose(s.var, every.var(0), rtol=1e-4)
    assert float(s.count) == len(every)
    z = pc.normalize(s, jnp.asarray(every[:2]))
    np.testing.assert_allclose(z, (every[:2] - every.mean(0)) / every.std(0), rtol=1e-3)
    assert float(jnp.max(pc.normalize(s, jnp.full((1, 3), 1e6)))) == pc.OBS_CLIP


def test_gaussian_actor_critic_sizes_scope_and_outputs():
    from repro.precision.layers import FP8_META

    net = networks.GaussianActorCritic(3, "fp8-delayed", (16, 8, 8), (8, 8), init_log_std=-0.5)
    x = jnp.zeros((4, 5))
    v = net.init(jax.random.key(0), x)
    actor = v["params"]["actor"]
    assert [actor[f"hidden_{i}"]["kernel"].shape for i in range(3)] == [(5, 16), (16, 8), (8, 8)]
    # first layer and head dense BF16 (scope "default"), the middle layers FP8
    assert sorted(v[FP8_META]["actor"]) == ["hidden_1", "hidden_2"]
    assert sorted(v[FP8_META]["critic"]) == ["hidden_1"]
    (mean, log_std), value = net.apply(v, x)
    assert mean.shape == (4, 3) and value.shape == (4,) and mean.dtype == jnp.float32
    np.testing.assert_array_equal(log_std, np.full((4, 3), -0.5, np.float32))


def test_validation_errors_are_one_line():
    for bad, needle in (({"env": "cheetah"}, "unknown legged env"),
                        ({"backend": "warp"}, "unknown brax backend"),
                        ({"physics_precision": "tf32"}, "physics_precision"),
                        ({"policy_sizes": []}, "policy_sizes"),
                        ({"num_envs": 6, "num_minibatches": 4, "num_steps": 1}, "divide"),
                        ({"recipe": "fp7"}, "recipe")):
        with pytest.raises(ValueError, match=needle) as e:
            pc.validate(bad)
        assert "\n" not in str(e.value)


def test_dot_precisions_count_the_physics_scope_apart():
    def f(x, w):
        with jax.named_scope(envs.PHYSICS_SCOPE):
            y = x @ w
            y = jnp.dot(y, w, precision="highest")
        return jnp.dot(y, w, precision="highest") + x @ w

    text = jax.jit(f).lower(jnp.ones((3, 3)), jnp.ones((3, 3))).as_text(debug_info=True)
    assert envs.dot_precisions(text) == {"physics": {"DEFAULT": 1, "HIGHEST": 1},
                                         "other": {"DEFAULT": 1, "HIGHEST": 1}}


# ---------------------------------------------------------------------- the adapter


class _Counter:
    """A hand-made brax environment: the observation is (steps since reset, 10 x that), the
    reward 1, and the episode terminates when the action's first entry is above 0.5."""

    action_size = 2
    observation_size = 2

    def reset(self, rng):
        from brax.envs.base import State

        z = jnp.zeros(())
        return State(pipeline_state=z, obs=jnp.zeros(2), reward=z, done=z)

    def step(self, state, action):
        c = state.pipeline_state + 1.0
        return state.replace(pipeline_state=c, obs=jnp.stack([c, 10 * c]),
                             reward=jnp.ones(()), done=(action[0] > 0.5).astype(jnp.float32))


def test_adapter_keeps_the_final_observation_and_splits_ends():
    pytest.importorskip("brax")
    env = envs.Adapter(_Counter(), "counter", episode_length=3)
    obs, s = env.reset(jax.random.key(0), 2)
    step = jax.jit(env.step)
    go, end = [0.0, 0.0], [1.0, 0.0]
    rows = []
    for a in ([go, go], [end, go], [go, go], [go, go], [end, go], [go, go]):
        obs, s, r, term, trunc, final = step(s, jnp.asarray(a))
        rows.append((np.asarray(obs)[:, 0].tolist(), np.asarray(final)[:, 0].tolist(),
                     np.asarray(term).tolist(), np.asarray(trunc).tolist()))
    # (obs, final obs) of the step counter, terminated, truncated. Env 0 ends itself at steps
    # 2 and 5; step 5 is also its 3rd since the reset (the time limit): termination wins, no
    # truncation. Env 1 reaches the time limit at steps 3 and 6: truncated, final obs 3.
    assert rows == [([1, 1], [1, 1], [False, False], [False, False]),
                    ([0, 2], [2, 2], [True, False], [False, False]),
                    ([1, 0], [1, 3], [False, False], [False, True]),
                    ([2, 1], [2, 1], [False, False], [False, False]),
                    ([0, 2], [3, 2], [True, False], [False, False]),
                    ([1, 0], [1, 3], [False, False], [False, True])]
    np.testing.assert_array_equal(np.asarray(final)[:, 1], 10 * np.asarray(final)[:, 0])
