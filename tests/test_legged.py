"""Legged-robot PPO (claim A11): the Gaussian policy against float64, the observation
statistics against NumPy, the environment adapter against a hand-made environment, the
physics' matmul precision under network recipes, a short ant run, Go1's placeholder meshes,
the study's cells and the A11 tables on hand-made records (the A11 rule: tests/test_verdicts.py).

Tests that need brax / MuJoCo / Playground skip where the ``[legged]`` extra is missing."""

import importlib.util
import math
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from repro.experiments.legged import rules as VL
from repro.experiments.legged import tables as A
from repro.models import envs, networks, ppo
from repro.models import ppo_continuous as pc
from repro.precision import resolve

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

    net = networks.GaussianActorCritic(3, resolve("fp8-delayed"), (16, 8, 8), (8, 8),
                                       init_log_std=-0.5)
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


def _swish_tower_f64(params, x):
    """A tower of swish layers then a linear output, in float64 (an independent reference)."""
    names = sorted((k for k in params if k.startswith("hidden_")), key=lambda k: int(k[7:]))
    for k in names:
        z = x @ np.asarray(params[k]["kernel"], np.float64) + np.asarray(params[k]["bias"],
                                                                           np.float64)
        x = z / (1.0 + np.exp(-z))
    return x @ np.asarray(params["out"]["kernel"], np.float64) + np.asarray(
        params["out"]["bias"], np.float64)


def test_critic_recipe_runs_the_value_tower_under_its_own_recipe():
    x = np.asarray(jax.random.normal(jax.random.key(1), (64, 5)), np.float32)
    bf16, fp32 = resolve("bf16"), resolve("fp32")
    mixed = networks.GaussianActorCritic(3, bf16, (32, 32), (32, 32), critic_recipe=fp32)
    v = mixed.init(jax.random.key(0), x)
    (mean, _), value = mixed.apply(v, x)
    (mean16, _), value16 = networks.GaussianActorCritic(3, bf16, (32, 32), (32, 32)).apply(v, x)
    want = _swish_tower_f64(v["params"]["critic"], x.astype(np.float64))[:, 0]
    with jax.default_matmul_precision("highest"):
        (_, _), value32 = networks.GaussianActorCritic(3, fp32, (32, 32), (32, 32)).apply(v, x)
    # the critic in FP32: float64's value to float32 rounding; the BF16 critic is further off
    np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(np.asarray(value16, np.float64) - want)) > 1e-4
    np.testing.assert_array_equal(value, value32)
    # the actor stays BF16: the same mean as the all-BF16 network's
    np.testing.assert_array_equal(mean, mean16)
    c = pc.validate({"recipe": "fp8-delayed", "critic_recipe": "fp32", "policy_sizes": (8,),
                     "value_sizes": (8,)})
    assert pc.build_network(c, 3).critic_recipe == resolve("fp32")
    assert pc.build_network(pc.validate({}), 3).critic_recipe is None


def test_initial_std_reaches_the_network_and_the_peer():
    c = pc.validate({"init_std": 0.2, "policy_sizes": (8,), "value_sizes": (8,)})
    v = pc.build_network(c, 3).init(jax.random.key(0), jnp.zeros((2, 5)))
    np.testing.assert_allclose(np.exp(v["params"]["log_std"]), [0.2] * 3, rtol=1e-6)
    assert pc.validate({}).init_std == 1.0  # brax's init_noise_std default
    if importlib.util.find_spec("brax"):
        from repro.models import brax_peer

        kw = brax_peer.brax_kwargs(pc.validate({"init_std": 0.2, "num_envs": 64}), 3, 4)
        assert kw["network_factory"].keywords["init_noise_std"] == 0.2


def test_validation_errors_are_one_line():
    for bad, needle in (({"env": "cheetah"}, "unknown legged env"),
                        ({"backend": "warp"}, "unknown brax backend"),
                        ({"physics_precision": "tf32"}, "physics_precision"),
                        ({"policy_sizes": []}, "policy_sizes"),
                        ({"num_envs": 6, "num_minibatches": 4, "num_steps": 1}, "divide"),
                        ({"recipe": "fp7"}, "recipe"),
                        ({"critic_recipe": "fp7"}, "recipe 'fp7'"),
                        ({"init_std": 0.0}, "init_std"), ({"init_std": -0.5}, "init_std")):
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

        z = jnp.zeros(())  # a metric weakly typed, as brax's reset gives some
        return State(pipeline_state=z, obs=jnp.zeros(2), reward=z, done=z,
                     metrics={"steps": jnp.asarray(0.0)})

    def step(self, state, action):
        c = state.pipeline_state + 1.0
        return state.replace(pipeline_state=c, obs=jnp.stack([c, 10 * c]),
                             reward=jnp.ones(()), done=(action[0] > 0.5).astype(jnp.float32),
                             metrics={"steps": c})


def test_adapter_keeps_the_final_observation_and_splits_ends():
    pytest.importorskip("brax")
    env = envs.Adapter(_Counter(), "counter", episode_length=3)
    obs, s = env.reset(jax.random.key(0), 2)
    step = jax.jit(env.step)
    go, end = [0.0, 0.0], [1.0, 0.0]
    rows = []
    for a in ([go, go], [end, go], [go, go], [go, go], [end, go], [go, go]):
        obs, s, _, term, trunc, final = step(s, jnp.asarray(a))
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
    assert step._cache_size() == 1  # reset and step states agree: one compilation


# ------------------------------------------------------------- brax ant on MJX physics


@pytest.fixture(scope="module")
def ant():
    pytest.importorskip("brax")
    pytest.importorskip("mujoco.mjx")
    return envs.make("ant", episode_length=16)


def _rollout_step_text(env, recipe, start):
    """The lowered program of one rollout step: the policy (under ``recipe``) then physics,
    from ``start`` (the abstract reset of 2 envs)."""
    c = pc.validate({"recipe": recipe, "policy_sizes": (16, 16), "value_sizes": (16,)})
    net = pc.build_network(c, env.action_size)
    act = pc.make_act(c, net)
    variables = net.init(jax.random.key(0), jnp.zeros((1, env.obs_size)))
    obs, state = start

    def f(variables, obs, state, key):
        action, _, _ = act(variables, obs, key)
        return env.step(state, jnp.clip(action, -1, 1))[0]

    return jax.jit(f).lower(variables, obs, state, jax.random.key(1)).as_text(debug_info=True)


@pytest.mark.slow
def test_network_recipes_leave_the_physics_precision_alone(ant):
    start = jax.eval_shape(lambda k: ant.reset(k, 2), jax.random.key(1))
    fp32 = envs.dot_precisions(_rollout_step_text(ant, "fp32", start))
    fp8 = envs.dot_precisions(_rollout_step_text(ant, "fp8-delayed", start))
    # MJX's products run at JAX's default precision (TF32 on NVIDIA GPUs) whatever the
    # recipe; the fp32 recipe's GEMMs (outside the physics scope) set HIGHEST, per GEMM
    assert set(fp32["physics"]) == {"DEFAULT"} and fp32["physics"]["DEFAULT"] > 10
    assert fp8["physics"] == fp32["physics"]
    assert set(fp32["other"]) == {"HIGHEST"} and "HIGHEST" not in fp8["other"]
    highest = envs.make("ant", episode_length=16, physics_precision="highest")
    bf16 = envs.dot_precisions(_rollout_step_text(highest, "bf16", start))
    assert bf16["physics"] == {"HIGHEST": fp32["physics"]["DEFAULT"]}
    assert set(bf16["other"]) == {"DEFAULT"}  # the bf16 network keeps its own
    assert jax.config.jax_default_matmul_precision is None  # nothing was set globally


@pytest.mark.slow
def test_ant_ppo_runs_the_smoke_profile_on_cpu(ant):
    """One seed of the smoke profile's FP8 quality cell (16 envs x 8 steps, 4 updates, 16-step
    episodes here), compiled as the smoke profile compiles."""
    from repro.config import stage_params
    from repro.experiments.legged import measure as L

    p = stage_params("legged", "smoke")
    c = L.config(p, "ant", "quality", "brax", "fp8-delayed", episode_length=16)
    train, _ = L.compile_(p, pc.make_train(c, ant), jax.random.key(0))
    m = jax.device_get(train(jax.random.key(0)))
    assert m["episode_return"].shape == (c.num_updates,) == (4,)
    # 16 envs x 32 steps with 16-step episodes: every env finishes at least one episode; an
    # update in which no episode ended reports NaN
    assert m["episodes"].sum() >= 16
    ended = m["episodes"] > 0
    np.testing.assert_array_equal(np.isfinite(m["episode_return"]), ended)
    assert not m["nonfinite_params"].any()
    # ant's reward per step: about 1 alive, minus control and contact costs of actions in
    # [-1, 1], plus forward speed: an episode of at most 16 steps stays far inside +-160
    assert (np.abs(m["episode_return"][ended]) < 16 * 10).all()


# --------------------------------------------------------- Go1 without mujoco_menagerie


def _go1(monkeypatch, root, scale):
    """Playground's Go1 joystick env and its MuJoCo model, loaded with placeholder meshes of
    ``scale`` written under ``root`` (never the real menagerie, even where one exists)."""
    from etils import epath
    from mujoco_playground._src import mjx_env

    monkeypatch.setattr(mjx_env, "MENAGERIE_PATH", epath.Path(root / "absent"))
    envs.offline_menagerie(root / "menagerie", scale)
    env = envs.make_raw("Go1JoystickFlatTerrain")
    return env, env.mj_model


def _inertial_masses(xml_path):
    """body name -> mass of its <inertial> element, read from the robot's XML."""
    tree = ET.parse(xml_path)
    return {b.get("name"): float(b.find("inertial").get("mass"))
            for b in tree.iter("body") if b.find("inertial") is not None}


@pytest.mark.slow
def test_go1_placeholder_meshes_leave_the_physics_unchanged(monkeypatch, tmp_path):
    mujoco = pytest.importorskip("mujoco")
    pytest.importorskip("mujoco_playground")
    from mujoco_playground._src.locomotion.go1 import go1_constants as consts

    env, small = _go1(monkeypatch, tmp_path / "a", 0.01)
    _, large = _go1(monkeypatch, tmp_path / "b", 0.3)
    # the meshes are visual only: they take part in no contact
    meshes = [g for g in range(small.ngeom) if small.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH]
    assert meshes and all(small.geom_contype[g] == 0 and small.geom_conaffinity[g] == 0
                          for g in meshes)
    # the masses are the XML's explicit inertials, not the meshes'
    ref = _inertial_masses(consts.ROOT_PATH / "xmls" / "go1_mjx_feetonly.xml")
    for name, mass in ref.items():
        assert small.body(name).mass[0] == pytest.approx(mass, rel=1e-6)
    np.testing.assert_array_equal(small.body_inertia, large.body_inertia)
    # two placeholders 30x apart give the same trajectory, bit for bit
    traj = []
    for model in (small, large):
        data = mujoco.MjData(model)
        mujoco.mj_resetDataKeyframe(model, data, 0)
        data.ctrl[:] = model.key_ctrl[0] + 0.3 * np.sin(np.arange(model.nu))
        for _ in range(200):
            mujoco.mj_step(model, data)
        traj.append((data.qpos.copy(), data.qvel.copy(), data.ncon))
    np.testing.assert_array_equal(traj[0][0], traj[1][0])
    np.testing.assert_array_equal(traj[0][1], traj[1][1])
    assert traj[0][2] == traj[1][2] > 0  # the feet touch the floor
    # the adapter reads the policy's entry of Go1's dict observation ("state": 48 values)
    go1 = envs.Adapter(env, "Go1JoystickFlatTerrain", episode_length=8, physics_field="data")
    obs, state = jax.eval_shape(lambda k: go1.reset(k, 2), jax.random.key(0))
    out = jax.eval_shape(go1.step, state, jax.ShapeDtypeStruct((2, 12), jnp.float32))
    assert (go1.obs_size, go1.action_size, obs.shape) == (48, 12, (2, 48))
    assert [x.shape for x in out[:1] + out[2:]] == [(2, 48), (2,), (2,), (2,), (2, 48)]


# ---------------------------------------------------------------------------- the study


def _params(**over):
    p = {"profile": "smoke", "envs": {"ant": {}}, "ppo": {"num_envs": 4, "num_steps": 2,
                                                        "num_minibatches": 2},
         "sizes": {"s": {"policy_sizes": [8], "value_sizes": [8]},
                   "w": {"policy_sizes": [64], "value_sizes": [64]}},
         "physics": {"num_envs": [4, 16], "precisions": ["default", "highest"],
                     "precision_at": [16], "steps": 2, "repeats": 1},
         "random": {"num_envs": 4},
         "speed": {"sizes": ["s", "w"], "recipes": ["bf16", "fp8-delayed"], "num_envs": 4,
                   "updates": 1, "repeats": 1},
         "quality": {"sizes": ["s"], "recipes": ["fp32", "fp8-delayed"], "seeds": 2},
         "peer": {"size": "s"}}
    return {**p, **over}


def test_study_cells_come_in_verdict_order_and_check_names_the_culprit():
    from repro.experiments.legged import measure as L

    names = [c.name for c in L.cells(_params())]
    assert names == ["ant_physics_e4_default", "ant_physics_e16_default",
                     "ant_physics_e16_highest", "ant_random",
                     "ant_speed_s_bf16", "ant_speed_s_fp8-delayed",
                     "ant_speed_w_bf16", "ant_speed_w_fp8-delayed",
                     "ant_quality_s_fp32", "ant_quality_s_fp8-delayed", "ant_peer_brax"]
    assert [c.recipes for c in L.cells(_params())][4:6] == [("bf16",), ("fp8-delayed",)]
    L.check(_params())
    assert "ant_random" not in [c.name for c in L.cells(_params(random=None))]
    critic = _params(quality={"sizes": ["s"], "recipes": ["fp32", "fp8-delayed"], "seeds": 2,
                              "critic_recipes": ["fp32"]})
    cells = [c for c in L.cells(critic) if "_quality_" in c.name]
    assert [c.name for c in cells] == ["ant_quality_s_fp32", "ant_quality_s_fp8-delayed",
                                       "ant_quality_s_fp8-delayed_critic-fp32"]
    assert cells[-1].recipes == ("fp8-delayed",)
    L.check(critic)
    with pytest.raises(ValueError, match="recipe"):
        L.check(_params(quality={"sizes": ["s"], "recipes": ["fp32"], "seeds": 1,
                                 "critic_recipes": ["fp9"]}))
    with pytest.raises(ValueError, match="legged.quality.sizes: unknown size 'x'"):
        L.check(_params(quality={"sizes": ["x"], "recipes": ["fp32"], "seeds": 1}))
    with pytest.raises(ValueError, match=r"legged.smoke.physics.steps: must be > 0, got 0"):
        L.check(_params(physics={"num_envs": [4], "precisions": ["default"], "steps": 0,
                                 "repeats": 1}))
    with pytest.raises(ValueError, match="recipe"):
        L.check(_params(speed={"sizes": ["s"], "recipes": ["fp9"], "num_envs": 4, "updates": 1,
                               "repeats": 1}))


def test_more_seeds_come_in_blocks_after_every_first_cell_and_run_their_own_seeds(monkeypatch):
    from repro.experiments.legged import cells as LC
    from repro.experiments.legged import measure as L

    q = {"sizes": ["s"], "recipes": ["fp32", "fp8-delayed"], "seeds": 2,
         "critic_recipes": ["fp32"], "more_seeds": {"fp32": 6, "fp8-delayed+critic-fp32": 4}}
    p = _params(quality=q, envs={"ant": {}, "Go1JoystickFlatTerrain": {"speed": None}})
    names = [c.name for c in L.cells(p) if "_quality_" in c.name]
    first = ["quality_s_fp32", "quality_s_fp8-delayed", "quality_s_fp8-delayed_critic-fp32"]
    assert names == ([f"ant_{n}" for n in first] + [f"Go1JoystickFlatTerrain_{n}" for n in first]
                     + [f"{e}_quality_s_{v}_s2" for e in ("ant", "Go1JoystickFlatTerrain")
                        for v in ("fp32", "fp8-delayed_critic-fp32")]
                     + ["ant_quality_s_fp32_s4", "Go1JoystickFlatTerrain_quality_s_fp32_s4"])
    L.check(p)
    with pytest.raises(ValueError, match=r"more_seeds \(ant\): unknown variant 'bf16'"):
        L.check(_params(quality={**q, "more_seeds": {"bf16": 4}}))
    with pytest.raises(ValueError, match=r"more_seeds \(ant\): fp32: 5 seeds is not a multiple"):
        L.check(_params(quality={**q, "more_seeds": {"fp32": 5}}))

    # a block's cell trains seeds first..first+seeds-1: each seed's key is key(seed)
    def fake_compile(_p, _fn, keys):
        def run(keys):
            r = jax.vmap(lambda k: jax.random.uniform(k, (10,)))(keys)
            return {"episode_return": r, "episodes": jnp.ones_like(r),
                    "nonfinite_params": jnp.zeros(r.shape, bool),
                    "skipped": jnp.zeros(r.shape, jnp.int32)}
        return run, 12.5

    monkeypatch.setattr(LC, "compile_", fake_compile)
    monkeypatch.setattr(L.pc, "make_train", lambda c: lambda key: None)  # no environment
    cell = {c.name: c for c in L.cells(p)}["ant_quality_s_fp8-delayed_critic-fp32_s2"]
    recs = cell.run(None)
    assert [r["sizes"]["seed"] for r in recs] == [2, 3]
    assert {r["extra"]["variant"] for r in recs} == {"fp8-delayed+critic-fp32"}
    assert {r["extra"]["compile_s"] for r in recs} == {12.5}  # the compile, apart from the run
    for r in recs:  # the mean of the last 10% of 10 updates: the last value of key(seed)'s draw
        want = np.asarray(jax.random.uniform(jax.random.key(r["sizes"]["seed"]), (10,)))[-1]
        assert r["value"] == pytest.approx(float(want))


def test_an_environment_entry_gives_its_parts_own_settings():
    from repro.experiments.legged import measure as L

    go1 = {"reward_scaling": 1.0, "init_std": 0.2,
           "physics": {"num_envs": [16], "precisions": ["default"]}, "speed": None, "quality": {"sizes": ["w"], "seeds": 3}, "peer": None}
    p = _params(envs={"ant": {}, "Go1JoystickFlatTerrain": go1})
    names = [c.name for c in L.cells(p)]
    assert names[11:] == ["Go1JoystickFlatTerrain_physics_e16_default",
                          "Go1JoystickFlatTerrain_random",
                          "Go1JoystickFlatTerrain_quality_w_fp32",
                          "Go1JoystickFlatTerrain_quality_w_fp8-delayed"]
    assert names[:11] == [c.name for c in L.cells(_params())]  # ant's cells as before
    pe = L.for_env(p, "Go1JoystickFlatTerrain")
    assert pe["quality"] == {"sizes": ["w"], "recipes": ["fp32", "fp8-delayed"], "seeds": 3}
    assert pe["physics"]["steps"] == 2 and pe["peer"] is None and pe["speed"] is None
    c = L.config(p, "Go1JoystickFlatTerrain", "quality", "w", "bf16")
    assert (c.reward_scaling, c.init_std, c.policy_sizes, c.num_envs) == (1.0, 0.2, (64,), 4)
    ant = L.config(p, "ant", "quality", "w")
    assert (ant.reward_scaling, ant.init_std) == (10.0, 1.0)  # the defaults, not Go1's
    L.check(p)
    bad = _params(envs={"ant": {"quality": {"sizes": ["x"]}}})
    with pytest.raises(ValueError, match="legged.quality.sizes: unknown size 'x'"):
        L.check(bad)
    with pytest.raises(ValueError, match=r"legged.smoke.envs.ant.quality.seeds: must be > 0, got 0"):
        L.check(_params(envs={"ant": {"quality": {"seeds": 0}}}))


def test_brax_peer_gets_equal_settings_and_a_replicated_standin():
    pytest.importorskip("brax")
    from repro.models import brax_peer as L

    c = pc.validate({"num_envs": 64, "num_steps": 5, "num_minibatches": 8, "update_epochs": 3,
                     "total_timesteps": 64 * 5 * 6, "policy_sizes": (16,)})
    kw = L.brax_kwargs(c, num_evals=3, eval_envs=4)
    # one unroll of every env per training step: brax's batch_size * num_minibatches = num_envs
    assert kw["batch_size"] * kw["num_minibatches"] == 64 and kw["unroll_length"] == 5
    assert (kw["num_updates_per_batch"], kw["discounting"], kw["learning_rate"],
            kw["clipping_epsilon"], kw["reward_scaling"]) == (3, c.gamma, c.lr, c.clip_eps,
                                                               c.reward_scaling)
    net = kw["network_factory"](27, 8)
    assert net.parametric_action_distribution.__class__.__name__ == "NormalDistribution"
    with pytest.raises(ValueError, match="must divide"):
        L.brax_kwargs(pc.validate({"num_envs": 12, "num_steps": 2, "num_minibatches": 8}), 3, 4)
    with L._replicated_standin():
        out = jax.device_put_replicated({"a": jnp.arange(3.0)}, jax.local_devices())
    assert out["a"].shape == (jax.local_device_count(), 3)
    assert not hasattr(jax, "device_put_replicated")


# ------------------------------------------------------------------------------- tables


def _rec(metric, value, sizes, recipe=None, extra=None, backend="gpu", commit="abc"):
    return {"experiment": "legged", "hardware": "h200", "backend": backend, "profile": "full",
            "metric": metric, "value": value, "sizes": sizes, "recipe": recipe,
            "extra": extra or {}, "emulated": False, "git_commit": commit,
            "timestamp": "2026-01-01T00:00:00+00:00"}


def _speed_records(rates, backend="gpu"):
    """rates: width -> (bf16 env-steps/s, fp8 env-steps/s, bf16 update ms, fp8 update ms)."""
    recs = [_rec("physics_env_steps_per_s", 1e6, {"env": "ant", "num_envs": 8192,
                                                 "precision": "default"}, backend=backend)]
    for w, (b, f, ub, uf) in rates.items():
        for recipe, rate, upd in (("bf16", b, ub), ("fp8-delayed", f, uf)):
            sz = {"env": "ant", "size": f"w{w}", "width": w, "num_envs": 8192, "num_steps": 20}
            recs += [_rec("env_steps_per_s", rate, sz, recipe, backend=backend),
                     _rec("loop_ms_per_update", 20 * 8192 / rate * 1e3, sz, recipe,
                          backend=backend),
                     _rec("policy_ms_per_update", 5.0, sz, recipe, backend=backend),
                     _rec("update_ms", upd, sz, recipe, backend=backend)]
    return pd.DataFrame(recs)


def test_speed_table_splits_the_loop_into_its_parts_and_speedups_pair_recipes():
    df = _speed_records({256: (100e3, 90e3, 2.0, 1.8), 2048: (50e3, 60e3, 20.0, 12.0),
                         4096: (20e3, 30e3, 60.0, 30.0)})
    t = A.speed_table(df)
    row = t[(t.width == 256) & (t.recipe == "bf16")].iloc[0]
    assert row.loop_ms_per_update == pytest.approx(20 * 8192 / 100e3 * 1e3)
    assert row.physics_ms == pytest.approx(20 * 8192 / 1e6 * 1e3)
    assert row.other_ms == pytest.approx(1638.4 - 163.84 - 5.0 - 2.0)
    assert row.physics_share == pytest.approx(163.84 / 1638.4)
    ups = A.speedups(t)
    assert ups.set_index("width").e2e.round(3).to_dict() == {256: 0.9, 2048: 1.2, 4096: 1.5}
    assert ups.set_index("width")["update"].to_dict() == {256: pytest.approx(2 / 1.8),
                                                         2048: pytest.approx(20 / 12),
                                                         4096: 2.0}
    assert ups.same_commit.all() and not ups.emulated.any()
    assert set(ups.recipe) == {"fp8-delayed"} and set(ups.hardware) == {"h200"}


def test_evidence_is_gpu_records_and_speedups_mark_pairs_of_two_calls():
    cpu = _speed_records({256: (100e3, 200e3, 2.0, 1.0)}, backend="cpu")
    assert len(A.evidence(cpu)) == 0
    assert len(A.speedups(A.speed_table(A.evidence(cpu)))) == 0
    df = _speed_records({256: (100e3, 200e3, 2.0, 1.0)})
    assert len(A.evidence(df)) == len(df)
    assert len(A.evidence(df.assign(profile="smoke"))) == 0
    df.loc[df.recipe == "bf16", "git_commit"] = "other"  # recorded by another call
    assert not A.speedups(A.speed_table(df)).same_commit.any()


def _quality(rets):
    """The quality table of ant final returns ``{recipe: [per seed]}`` at brax's size (random
    policy 10)."""
    recs = [_rec("random_return", 10.0, {"env": "ant", "variant": "random"})]
    for v, xs in rets.items():
        recs += [_rec("final_return", x, {"env": "ant", "size": "brax", "width": 256,
                                           "seed": i, "variant": v}, recipe=v,
                      extra={"variant": v, "diverged": False}) for i, x in enumerate(xs)]
    return A.quality_table(pd.DataFrame(recs), reps=200).set_index("recipe")


def test_peer_table_pairs_the_trainers_seed_by_seed_and_counts_p_by_hand():
    """Three seeds of each trainer: the mean rates, their ratio and the mean returns by hand;
    P(ours > brax) over the 9 seed pairs counted by hand (ties half), inside its interval;
    the random floor and the quality records are not peer rows."""
    rets = {"repro": [100.0, 150.0, 125.0], "brax": [110.0, 120.0, 120.0]}
    rates = {"repro": [3.0, 3.3, 3.6], "brax": [2.0, 2.2, 2.4]}
    recs = [_rec("random_return", 10.0, {"env": "ant", "variant": "random"}),
            _rec("final_return", 5.0, {"env": "ant", "size": "brax", "width": 256, "seed": 0,
                                       "variant": "fp32"}, recipe="fp32",
                 extra={"variant": "fp32", "diverged": False})]
    for impl in rets:
        for seed, (ret, rate) in enumerate(zip(rets[impl], rates[impl])):
            sz = {"env": "ant", "impl": impl, "seed": seed, "num_envs": 8192}
            recs += [_rec("eval_return", ret, sz, "tf32"),
                     _rec("env_steps_per_s", rate, sz, "tf32")]
    t = A.peer_table(pd.DataFrame(recs), reps=200)
    assert len(t) == 1
    r = t.iloc[0]
    assert (r.hardware, r.env, r.n_seeds) == ("h200", "ant", 3)
    assert r.steps_per_s_repro == pytest.approx(3.3) and r.steps_per_s_brax == pytest.approx(2.2)
    assert r.speed_ratio == pytest.approx(1.5)
    assert r.return_repro == pytest.approx(125.0) and r.return_brax == pytest.approx(350 / 3)
    # 100 beats none; 150 and 125 beat all three: 6 of 9 pairs (brax over ours: 3 of 9)
    assert r.poi == pytest.approx(6 / 9)
    assert r.poi_lo <= r.poi <= r.poi_hi
    assert r.random_return == pytest.approx(10.0)
    assert A.peer_table(pd.DataFrame(recs[:2])).empty


def test_quality_table_normalises_against_fp32_and_random():
    rets = {"fp32": [100, 110, 120, 130], "fp8-delayed": [90, 100, 140, 150]}
    q = _quality(rets)
    ref = np.mean(rets["fp32"]) - 10.0
    assert q.loc["fp8-delayed", "normalised"] == pytest.approx(
        np.mean((np.array(rets["fp8-delayed"]) - 10) / ref))
    assert q.loc["fp32", "normalised"] == pytest.approx(1.0)
    # P(fp8 > fp32) over the 16 seed pairs, by hand: 140 and 150 beat all four (8 pairs),
    # 100 ties 100 (half a pair): 8.5 / 16
    assert q.loc["fp8-delayed", "poi"] == pytest.approx(8.5 / 16)
    assert q.loc["fp8-delayed", "n_seeds"] == 4


def test_quality_table_uses_every_seed_of_cells_with_different_seed_counts():
    """FP32 and BF16 with 6 seeds, fp8-delayed with 2: each recipe's P(> fp32) and its
    seed count use all of its own seeds and all of FP32's (by hand over the seed pairs)."""
    rets = {"fp32": [100, 110, 120, 130, 140, 150], "bf16": [105, 115, 125, 135, 145, 155],
            "fp8-delayed": [125, 60]}
    q = _quality(rets)
    assert q.n_seeds.to_dict() == {"bf16": 6, "fp32": 6, "fp8-delayed": 2}
    # bf16: 105 beats 1 of the 6 FP32 seeds, 115 beats 2, ..., 155 beats 6: 21 / 36
    assert q.loc["bf16", "poi"] == pytest.approx(21 / 36)
    # fp8-delayed: 125 beats 3 of 6, 60 none: 3 / 12
    assert q.loc["fp8-delayed", "poi"] == pytest.approx(3 / 12)
    assert q.loc["fp8-delayed", "mean_return"] == pytest.approx(92.5)


def test_quality_table_reads_other_recipes_against_bf16_too():
    """P(recipe > bf16) by hand over the seed pairs for the FP8 recipe; none for FP32 and
    BF16 themselves, nor where no BF16 cell was recorded."""
    q = _quality({"fp32": [100, 110, 120, 130], "bf16": [90, 100, 110, 120],
                  "fp8-delayed": [95, 125]})
    # 95 beats 90 of BF16's four; 125 beats all four: 5 / 8
    assert q.loc["fp8-delayed", "poi_bf16"] == pytest.approx(5 / 8)
    assert q.loc["fp8-delayed", "poi_bf16_lo"] <= 5 / 8 <= q.loc["fp8-delayed", "poi_bf16_hi"]
    assert q.loc[["fp32", "bf16"], "poi_bf16"].isna().all()
    # FP32 is still the judged reference: 95 beats none, 125 three of four: 3 / 8
    assert q.loc["fp8-delayed", "poi"] == pytest.approx(3 / 8)
    assert _quality({"fp32": [100, 110], "fp8-delayed": [95, 125]}).poi_bf16.isna().all()
    numbers = A.key_numbers(A.speedups(pd.DataFrame()), q.reset_index())
    at = numbers["h200"]["fp8-delayed"]["ant_width_256"]
    assert at["poi_bf16"] == pytest.approx(5 / 8) and "poi_bf16" not in numbers["h200"]["bf16"][
        "ant_width_256"]


def test_quality_table_scores_each_environment_against_its_own_random_floor():
    """ant and Go1 at one size label: a row per env, each normalised to its own floor and
    FP32 (hand-computed), never pooled."""
    recs = [_rec("random_return", 10.0, {"env": "ant", "variant": "random"}),
            _rec("random_return", 0.0, {"env": "Go1", "variant": "random"})]
    rets = {("ant", "fp32"): [110, 130], ("ant", "bf16"): [60, 160],
            ("Go1", "fp32"): [4, 6], ("Go1", "bf16"): [5, 5]}
    for (env, v), xs in rets.items():
        recs += [_rec("final_return", x, {"env": env, "size": "s", "width": 512, "seed": i,
                                           "variant": v}, recipe=v,
                      extra={"variant": v, "diverged": False}) for i, x in enumerate(xs)]
    q = A.quality_table(pd.DataFrame(recs), reps=200).set_index(["env", "recipe"])
    assert len(q) == 4
    # ant: ((60 - 10) + (160 - 10)) / 2 / (120 - 10); Go1: 5 / 5
    assert q.loc[("ant", "bf16"), "normalised"] == pytest.approx(100 / 110)
    assert q.loc[("Go1", "bf16"), "normalised"] == pytest.approx(1.0)
    # Go1: 5 beats 4 and loses to 6, twice: 2 / 4; ant: 160 beats both, 60 neither: 2 / 4
    assert q.loc[("Go1", "bf16"), "poi"] == pytest.approx(0.5)
    assert q.loc[("ant", "bf16"), "mean_return"] == pytest.approx(110)


def test_quality_table_without_a_random_policy_record_scores_nothing():
    """Final returns but no random-policy record for the env: a row per recipe with its
    seeds and mean return (by hand), ``learned`` and every score NaN, and A11 says why it
    does not judge (with a random record, the same returns are judged)."""
    rets = {"fp32": [100.0 + i for i in range(8)], "fp8-delayed": [101.0 + i for i in range(8)]}
    recs = [_rec("final_return", x, {"env": "ant", "size": "brax", "width": 256, "seed": i,
                                      "variant": v}, recipe=v,
                 extra={"variant": v, "diverged": False})
            for v, xs in rets.items() for i, x in enumerate(xs)]
    q = A.quality_table(pd.DataFrame(recs), reps=200).set_index("recipe")
    assert q.n_seeds.to_dict() == {"fp32": 8, "fp8-delayed": 8}
    assert q.loc["fp8-delayed", "mean_return"] == pytest.approx(104.5)
    assert q[["poi", "normalised", "random_return", "learned"]].isna().all().all()
    ups = A.speedups(A.speed_table(pd.DataFrame(_speed_records({256: (1e6, 1.2e6, 10.0, 8.0)}))))
    v = VL.a11(ups, q.reset_index())
    assert "width 256: not judged: no random-policy record (ant_random) to tell whether FP32 " \
        "learned" in v.key_number and "P(fp8-delayed>fp32)" not in v.key_number
    assert v.verdict == "partly"
    judged = VL.a11(ups, _quality(rets).reset_index())
    assert "P(fp8-delayed>fp32)=" in judged.key_number and judged.verdict != "partly"


def test_quality_is_judged_at_the_longest_training_with_enough_seeds():
    """brax's size trained for 1.6M steps (16 seeds, FP8 far behind) and for 6.4M (8 seeds,
    FP8 level with FP32; and a 12.8M run of 4 seeds): each budget is its own row, FP8 against
    FP32 trained as long, and the verdict and key numbers read the 6.4M row."""
    recs = [_rec("random_return", 10.0, {"env": "ant", "variant": "random"})]
    runs = {1_638_400: {"fp32": [100.0 + i for i in range(16)],
                        "fp8-delayed": [50.0 + i for i in range(16)]},
            6_553_600: {"fp32": [200.0 + i for i in range(8)],
                        "fp8-delayed": [200.5 + i for i in range(8)]},
            13_107_200: {"fp32": [300.0 + i for i in range(4)],
                         "fp8-delayed": [10.0 + i for i in range(4)]}}
    for steps, rets in runs.items():
        for v, xs in rets.items():
            recs += [_rec("final_return", x, {"env": "ant", "size": "brax", "width": 256,
                                               "total_timesteps": steps, "seed": i,
                                               "variant": v}, recipe=v,
                          extra={"variant": v, "diverged": False}) for i, x in enumerate(xs)]
    q = A.quality_table(pd.DataFrame(recs), reps=200)
    fp8 = q[q.recipe == "fp8-delayed"].set_index("total_timesteps")
    assert fp8.n_seeds.to_dict() == {1_638_400: 16, 6_553_600: 8, 13_107_200: 4}
    assert fp8.loc[1_638_400, "poi"] == 0.0 and fp8.loc[13_107_200, "poi"] == 0.0
    # 6.4M: 200.5 + i beats the FP32 seeds 200 .. 200 + i: (i + 1) of 8, summed over i: 36 / 64
    assert fp8.loc[6_553_600, "poi"] == pytest.approx(36 / 64)
    judged = VL.longest_runs(q, min_seeds=8)
    assert set(judged.total_timesteps) == {6_553_600} and len(judged) == 2
    assert set(VL.longest_runs(q).total_timesteps) == {13_107_200}
    v = VL.a11(A.speedups(A.speed_table(pd.DataFrame(_speed_records(
        {256: (1e6, 1.2e6, 10.0, 8.0)})))), q)
    assert "6.6M steps per seed" in v.key_number and "1.6M" not in v.key_number
    assert "P(fp8-delayed>fp32)=0.56" in v.key_number and ": lost" not in v.key_number


def test_key_numbers_keep_only_native_pairs_of_one_call_and_fp8_against_fp32():
    ups = pd.DataFrame([{"hardware": "h200", "recipe": "fp8-delayed", "width": w, "e2e": e,
                         "update": u, "emulated": em, "same_commit": sc}
                        for w, e, u, em, sc in ((256, 0.9, 1.1, False, True),
                                                (2048, 1.3, 1.7, False, False),
                                                (4096, 1.5, 2.0, True, True))])
    quality = pd.DataFrame([{"hardware": "h200", "recipe": r, "width": 256, "poi": p,
                             "poi_lo": lo, "poi_hi": hi}
                            for r, p, lo, hi in (("fp32", 0.5, 0.5, 0.5),
                                                 ("fp8-delayed", 0.55, 0.4, 0.7))])
    assert A.key_numbers(ups, quality) == {"h200": {"fp8-delayed": {"width_256": {
        "e2e": 0.9, "update": 1.1, "poi": 0.55, "poi_lo": 0.4, "poi_hi": 0.7}}}}
    assert A.key_numbers(A.speedups(pd.DataFrame()), A.quality_table(pd.DataFrame())) == {}
