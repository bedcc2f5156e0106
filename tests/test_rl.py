"""PPO pieces against hand computations, determinism, a little learning, early validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repro import studies
from repro.analysis import rl as rl_analysis
from repro.analysis import stats
from repro.experiments.rl_quality import measure as RQ
from repro.models import networks, ppo
from repro.precision import resolve


def _gae_reference(rewards, values, terminated, truncated, next_values, final_values, gamma,
                   lam):
    """Advantages from the definition, one env, plain Python: A_t = sum_k (g*l)^k delta_{t+k}
    within the episode, delta_t = r_t + g * V(s'_t) * (1 - terminated_t) - V(s_t), where s'_t
    is the state the step reached: the final observation if the episode ended at t."""
    T = len(rewards)
    deltas = []
    for t in range(T):
        ended = terminated[t] or truncated[t]
        v_next = final_values[t] if ended else next_values[t]
        deltas.append(rewards[t] + gamma * v_next * (0.0 if terminated[t] else 1.0) - values[t])
    adv = np.zeros(T)
    for t in range(T):
        acc, k = 0.0, 0
        for j in range(t, T):
            acc += (gamma * lam) ** k * deltas[j]
            k += 1
            if terminated[j] or truncated[j]:
                break
        adv[t] = acc
    return adv


def test_gae_with_termination_and_truncation():
    gamma, lam = 0.9, 0.8
    rewards = np.array([1.0, 0.5, 2.0, -1.0, 0.3, 1.5])
    values = np.array([0.2, 0.4, -0.3, 0.7, 0.1, 0.9])
    terminated = np.array([0, 1, 0, 0, 0, 0], bool)  # episode ends at t=1 (no bootstrap)
    truncated = np.array([0, 0, 0, 1, 0, 0], bool)   # time limit at t=3 (bootstrap)
    final_values = np.array([9.0, 5.0, 9.0, 0.6, 9.0, 9.0])  # V(final_observation)
    last_value = 0.25
    next_values = np.append(values[1:], last_value)
    ref = _gae_reference(rewards, values, terminated, truncated, next_values, final_values,
                         gamma, lam)

    r = ppo.bootstrap_reward(jnp.asarray(rewards), jnp.asarray(terminated),
                             jnp.asarray(truncated), jnp.asarray(final_values), gamma)
    adv, ret = ppo.compute_gae(r[:, None], jnp.asarray(values)[:, None],
                               jnp.asarray(terminated | truncated)[:, None],
                               jnp.asarray([last_value]), gamma, lam)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[:, 0], ref + values, rtol=1e-6)
    # Termination and truncation on the same step: termination wins (no bootstrap).
    both = ppo.bootstrap_reward(jnp.asarray([1.0]), jnp.asarray([True]), jnp.asarray([True]),
                                jnp.asarray([5.0]), gamma)
    assert float(both[0]) == 1.0


SMOKE = dict(env="CartPole-v1", num_envs=4, num_steps=128, total_timesteps=20_480,
             update_epochs=4, num_minibatches=4, lr=2.5e-3, recipe="fp32")


def test_ppo_cartpole_learns_and_is_deterministic():
    train = jax.jit(jax.vmap(ppo.make_train(SMOKE)))
    keys = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in (0, 1, 0)])
    keys = jax.random.wrap_key_data(keys)
    m1 = jax.device_get(train(keys))
    m2 = jax.device_get(train(keys))
    ret = m1["episode_return"]
    assert ret.shape == (3, SMOKE["total_timesteps"] // 512)
    np.testing.assert_array_equal(ret, m2["episode_return"])  # two runs, same seeds
    np.testing.assert_array_equal(ret[0], ret[2])  # the same seed inside one vmap
    assert not np.array_equal(ret[0], ret[1])  # different seeds differ
    final = ppo.final_return(m1, 0.2)
    early = np.nanmean(ret[:, :3])
    assert early < 35  # random CartPole play lasts about 22 steps
    assert np.all(final > 50), final
    assert np.all(m1["skipped"] == 0) and not m1["nonfinite_params"].any()


TINY = dict(SMOKE, num_steps=16, total_timesteps=2 * 4 * 16, update_epochs=2, num_minibatches=2)


def _scan_unrolls(jaxpr, out=None):
    """(length, unroll) of every scan in a jaxpr, nested ones included."""
    from jax.extend.core import jaxprs_in_params

    out = [] if out is None else out
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            out.append((eqn.params["length"], eqn.params["unroll"]))
        for sub in jaxprs_in_params(eqn.params):
            _scan_unrolls(sub, out)
    return out


@pytest.mark.slow
def test_unrolled_scans_compute_the_same_run():
    # unroll=5 does not divide the 16 rollout steps (3 unrolled trips + a remainder step)
    fast = dict(TINY, unroll=5, update_unroll=2)
    key = jax.random.key(3)
    unrolls = _scan_unrolls(jax.make_jaxpr(ppo.make_train(fast))(key).jaxpr)
    assert (16, 5) in unrolls and unrolls.count((2, 2)) == 2  # rollout; epochs and minibatches
    assert (16, 5) not in _scan_unrolls(jax.make_jaxpr(ppo.make_train(TINY))(key).jaxpr)
    plain = jax.device_get(jax.jit(ppo.make_train(TINY))(key))
    unrolled = jax.device_get(jax.jit(ppo.make_train(fast))(key))
    assert np.isfinite(plain["episode_return"]).any()
    for name in plain:  # bitwise on CPU: unrolling changes the loop, not the arithmetic
        np.testing.assert_array_equal(unrolled[name], plain[name], err_msg=name)


def test_run_key_keeps_threefry_and_derives_the_others():
    key = jax.random.key(7)
    assert ppo.run_key(key, "threefry") is key  # the default leaves the caller's stream alone
    for name in ppo.PRNGS[1:]:
        k = ppo.run_key(key, name)
        assert str(jax.random.key_impl(k)) == name
        np.testing.assert_array_equal(jax.random.key_data(k),
                                      jax.random.key_data(ppo.run_key(key, name)))
        assert not np.array_equal(jax.random.key_data(k),
                                  jax.random.key_data(ppo.run_key(jax.random.key(8), name)))


@pytest.mark.slow
def test_rbg_runs_are_deterministic_and_differ_from_threefry():
    keys = jax.random.split(jax.random.key(0), 2)
    train = jax.jit(jax.vmap(ppo.make_train(dict(TINY, prng="rbg"))))
    a, b = jax.device_get(train(keys)), jax.device_get(train(keys))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    threefry = jax.device_get(jax.jit(jax.vmap(ppo.make_train(TINY)))(keys))
    assert not np.array_equal(a["episode_return"], threefry["episode_return"], equal_nan=True)


@pytest.mark.parametrize("change,match", [
    (dict(env="Cartpole-v9"), r"unknown env 'Cartpole-v9'; valid envs: .*CartPole-v1"),
    (dict(recipe="fp7"), r"unknown recipe 'fp7'; valid recipes: .*fp8-delayed"),
    (dict(num_minibatches=3), r"num_minibatches=3 does not divide the batch"),
    (dict(total_timesteps=10), r"less than one update"),
    (dict(network="cnn"), r"needs image observations"),
    (dict(lr_typo=1.0), r"unknown PPO config key"),
    (dict(unroll=0), r"PPO config unroll=0: expected int, > 0"),
    (dict(update_unroll=-1), r"PPO config update_unroll=-1: expected int, > 0"),
    (dict(prng="mersenne"), r"unknown prng 'mersenne'; valid: threefry, rbg, unsafe_rbg"),
])
def test_validation_is_one_line_and_before_compilation(monkeypatch, change, match):
    def no_tracing(*a, **k):
        raise AssertionError("traced before the config was validated")

    # gymnax's env classes wrap methods in jax.jit when their modules are first imported:
    # import them now, so the check below sees only what validation itself would compile
    ppo.valid_envs()
    ppo.make_env(SMOKE["env"])
    monkeypatch.setattr(ppo, "make_update_step", no_tracing)
    monkeypatch.setattr(ppo.jax, "jit", no_tracing)
    with pytest.raises(ValueError, match=match) as e:
        ppo.make_train({**SMOKE, **change})
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_networks_first_last_layers_stay_wide_and_fp8_elsewhere():
    from repro.precision.layers import FP8_META

    x = jnp.zeros((2, 4))
    net = networks.make_network("mlp", 2, "fp8-delayed", width=32, depth=3)
    v = net.init(jax.random.key(0), x)
    meta = v[FP8_META]
    # hidden_0 (input) and out (head) run dense BF16; hidden_1, hidden_2 carry FP8 state.
    assert sorted(meta["actor"]) == ["hidden_1", "hidden_2"]
    logits, value = net.apply(v, x)
    assert logits.shape == (2, 2) and value.shape == (2,) and logits.dtype == jnp.float32
    all_fp8 = networks.make_network("mlp", 2, "fp8-all-layers", width=32, depth=3)
    assert len(all_fp8.init(jax.random.key(0), x)[FP8_META]["actor"]) == 4

    frames = jnp.zeros((3, 10, 10, 4), bool)
    for name, kind in (("cnn", "minatar"), ("cnn-large", "large")):
        cnn = networks.make_network(name, 6, "bf16", obs_shape=(10, 10, 4))
        lv, vv = cnn.apply(cnn.init(jax.random.key(1), frames), frames)
        assert lv.shape == (3, 6) and vv.shape == (3,)
    large = networks.make_network("cnn-large", 6, "bf16", obs_shape=(10, 10, 4))
    assert large.upsample == 8  # MinAtar 10x10 -> 80x80 pixel-like input


def test_quality_statistics_match_rliable_and_a_hand_count(monkeypatch):
    import builtins


    rng = np.random.default_rng(0)
    scores = {"a": rng.normal(1.0, 0.2, (8, 3)), "b": rng.normal(0.6, 0.2, (8, 3))}
    ref_agg = stats.aggregate(scores, reps=50)
    ref_poi = stats.probability_of_improvement(scores, [("a", "b")], reps=50)
    # P(a > b) by hand: pairs over seeds, averaged over tasks.
    hand = np.mean([np.mean(scores["a"][:, j][:, None] > scores["b"][:, j][None, :])
                    for j in range(3)])
    assert ref_poi.p[0] == pytest.approx(hand)

    real_import = builtins.__import__

    def no_rliable(name, *a, **k):
        if name.startswith("rliable"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_rliable)
    agg = stats.aggregate(scores, reps=50)
    poi = stats.probability_of_improvement(scores, [("a", "b")], reps=50)
    assert set(agg.backend) == {"numpy"}
    np.testing.assert_allclose(agg.iqm, ref_agg.iqm, rtol=1e-9)
    assert poi.p[0] == pytest.approx(hand)
    assert (agg.iqm_lo <= agg.iqm).all() and (agg.iqm <= agg.iqm_hi).all()


def test_bootstrap_intervals_are_reproducible_and_leave_numpy_alone():
    """Same scores, same seed: the same confidence intervals (rliable draws from NumPy's global
    generator; repro seeds it for the call and restores it afterwards)."""

    rng = np.random.default_rng(1)
    scores = {"a": rng.normal(1.0, 0.3, (16, 2)), "b": rng.normal(0.8, 0.3, (16, 2))}
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    runs = [(stats.aggregate(scores, reps=200), stats.probability_of_improvement(scores, [("a", "b")],
                                                                        reps=200))
            for _ in range(2)]
    assert (np.random.get_state()[1] == before).all()
    for col in ("iqm_lo", "iqm_hi", "mean_lo", "mean_hi"):
        assert runs[0][0][col].tolist() == runs[1][0][col].tolist()
    assert runs[0][1][["lo", "hi"]].values.tolist() == runs[1][1][["lo", "hi"]].values.tolist()
    other = stats.probability_of_improvement(scores, [("a", "b")], reps=200, seed=7)
    assert other[["lo", "hi"]].values.tolist() != runs[0][1][["lo", "hi"]].values.tolist()


def test_precision_policy_and_record_validation(tmp_path):
    from repro.experiments.rl_throughput import measure as X

    from repro.precision.recipes import value_formats

    pol = value_formats(resolve("fp8-e2e"))
    assert pol["params (stored)"].startswith("fp8") and pol["gradients (GEMM operand)"] == \
        "fp8-e5m2" and pol["optimizer state (Adam moments)"] == "fp32"
    assert value_formats(resolve("tf32"))["weights (GEMM operand)"] == "tf32"
    with pytest.raises(ValueError, match="unknown recipe"):
        studies.record(X.THROUGHPUT, "smoke", tmp_path, recipes=["fp7"])
    assert not list(tmp_path.iterdir())  # nothing written before validation passed


def test_cell_selection_for_split_gpu_runs():
    """``--recipe fp8-delayed --only 'Breakout*'``: the variants built on fp8-delayed of one
    game, its random-policy cell, and its determinism check (fp8-e2e is built on it)."""
    from repro.studies import runner

    p = studies.params(RQ.QUALITY, "full")
    cells = [c.name for c in runner.select(RQ.cells(p), ["Breakout*"], ["fp8-delayed"])]
    built_on = [v for v in p.variants if resolve(v).family == "fp8-delayed"]
    assert cells == ["Breakout-MinAtar_random", *(f"Breakout-MinAtar_{v}" for v in built_on),
                     "Breakout-MinAtar_determinism_fp8-e2e"]
    assert {"fp8-delayed", "fp8-e2e-nokahan", "fp8-all-layers"} <= set(built_on)
    assert "bf16" not in built_on and "fp32" not in built_on


def test_rollout_bootstrap_matches_a_per_step_loop():
    # The whole-rollout bootstrap (one batched critic call) against a loop over steps and envs
    # with a critic that depends on every observation entry, so any mix-up of the T / N order
    # in the flatten-and-reshape shows.
    rng = np.random.default_rng(0)
    T, N, gamma = 5, 3, 0.9
    final_obs = rng.normal(size=(T, N, 2, 2)).astype(np.float32)
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.3
    truncated = rng.random((T, N)) < 0.5
    weights = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)

    def critic_np(o):
        return float((o * weights).sum())

    expected = rewards.astype(np.float64).copy()
    for t in range(T):
        for n in range(N):
            if truncated[t, n] and not terminated[t, n]:
                expected[t, n] += gamma * critic_np(final_obs[t, n])
    got = ppo.bootstrap_rollout(lambda o: jnp.sum(o * weights, axis=(1, 2)), jnp.asarray(rewards),
                                jnp.asarray(final_obs), jnp.asarray(terminated),
                                jnp.asarray(truncated), gamma)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


def test_widest_fitting_solves_a_hand_made_quadratic():
    import pandas as pd


    # memory(W) = 1e6 + 2e3 W + 30 W^2 bytes: the budget 1e6 + 2e3*5000 + 30*5000^2 is met at
    # W = 5000 exactly (beyond the measured 4096: extrapolated); bf16 has 2 widths (left out).
    def mem(w):
        return 1e6 + 2e3 * w + 30.0 * w * w
    rows = [{"hardware": "h", "recipe": "fp8-delayed", "num_envs": 64, "network": "mlp",
             "width": w, "update_memory_bytes": mem(w), "emulated": False}
            for w in (256, 1024, 2048, 4096)]
    rows += [{"hardware": "h", "recipe": "bf16", "num_envs": 64, "network": "mlp", "width": w,
              "update_memory_bytes": mem(w), "emulated": False} for w in (256, 1024)]
    out = rl_analysis.widest_fitting(pd.DataFrame(rows), mem(5000))
    assert list(out.recipe) == ["fp8-delayed"]
    r = out.iloc[0]
    assert r.widest_width == pytest.approx(5000, rel=1e-6) and r.extrapolated
    assert r.max_rel_residual < 1e-9
    inside = rl_analysis.widest_fitting(pd.DataFrame(rows), mem(1500)).iloc[0]
    assert inside.widest_width == pytest.approx(1500, rel=1e-6) and not inside.extrapolated


def test_throughput_speedups_are_hand_ratios_and_say_which_pairs_share_a_commit():
    """Hand-made throughput records: at width 1024 fp16 and fp8 recorded at one commit (2.0M
    vs 3.0M env-steps/s, update 30 vs 20 ms: 1.5x both ways); at width 2048 fp8 at another
    commit than fp16 (1.0M vs 1.2M: 1.2x end to end; 80 vs 64 ms: 1.25x update)."""
    import pandas as pd

    from repro import hardware, results

    hw = hardware.lookup("cpu")

    def cell(width, recipe, sps, upd_ms, commit):
        sizes = {"network": "mlp", "width": width, "num_envs": 2048}
        return [{**results.make_record("rl_throughput", m, v, u, recipe=recipe, sizes=sizes,
                                       hardware=hw), "git_commit": commit}
                for m, v, u in (("env_steps_per_s", sps, "steps/s"),
                                ("update_time_ms", upd_ms, "ms"))]

    recs = (cell(1024, "fp16", 2.0e6, 30.0, "aaa")
            + cell(1024, "fp8-delayed", 3.0e6, 20.0, "aaa")
            + cell(2048, "fp16", 1.0e6, 80.0, "aaa")
            + cell(2048, "fp8-delayed", 1.2e6, 64.0, "bbb"))
    table = rl_analysis.throughput_table(pd.DataFrame(recs))
    assert sorted(table.git_commit) == ["aaa", "aaa", "aaa", "bbb"]
    sp = rl_analysis.speedups(table, "fp8-delayed", baselines=("fp16",)).set_index("width")
    assert (sp.loc[1024, "e2e"], sp.loc[1024, "update"]) == (pytest.approx(1.5),
                                                            pytest.approx(1.5))
    assert (sp.loc[2048, "e2e"], sp.loc[2048, "update"]) == (pytest.approx(1.2),
                                                            pytest.approx(1.25))
    assert bool(sp.loc[1024, "same_commit"]) and not bool(sp.loc[2048, "same_commit"])


def test_fp8_cnn_throughput_cells_count_as_emulated():
    """An FP8 CNN cell's backward convolutions are BF16 emulation (repro.precision.ops.fp8_conv), so its
    speed is not FP8's: the table flags it emulated even where the record (written before that
    rule) said so only in extra.conv_backward; a BF16 CNN cell and an FP8 MLP cell stay real."""
    import pandas as pd

    from repro import hardware, results

    hw = hardware.lookup("h200")

    def rec(network, recipe, conv_backward):
        return results.make_record(
            "rl_throughput", "env_steps_per_s", 1.0, "steps/s", recipe=recipe, hardware=hw,
            sizes={"network": network, "width": 0 if network == "cnn" else 64, "num_envs": 8},
            emulated=False, extra={"conv_backward": conv_backward})

    t = rl_analysis.throughput_table(pd.DataFrame([rec("cnn", "fp8-delayed", "bf16 emulation of FP8"),
                                         rec("cnn", "bf16", None),
                                         rec("mlp", "fp8-delayed", None)]))
    em = t.set_index(["network", "recipe"])["emulated"]
    assert bool(em[("cnn", "fp8-delayed")])
    assert not em[("cnn", "bf16")] and not em[("mlp", "fp8-delayed")]


def test_throughput_cells_of_one_configuration_form_a_group():
    """Cells of one (network, width, num_envs) are compared with each other (the runner notes
    a cross-call ratio among them); the stores cell names no recipe (kept by --recipe)."""
    from repro.experiments.rl_throughput import measure as X

    p = X.Params(profile="smoke", recipes=("bf16", "fp8-delayed"), widths=(64,), num_envs=(8, 16),
                 networks={"mlp": "CartPole-v1", "cnn": "Breakout-MinAtar"}, num_steps=4,
                 updates=1, repeats=1)
    cells = X.cells(p)
    assert [(c.name, c.recipes, c.group) for c in cells] == [
        ("stores", (), None),
        ("mlp_w64_bf16_e8", ("bf16",), "mlp_w64_e8"),
        ("mlp_w64_bf16_e16", ("bf16",), "mlp_w64_e16"),
        ("mlp_w64_fp8-delayed_e8", ("fp8-delayed",), "mlp_w64_e8"),
        ("mlp_w64_fp8-delayed_e16", ("fp8-delayed",), "mlp_w64_e16"),
        ("cnn_w0_bf16_e8", ("bf16",), "cnn_w0_e8"),
        ("cnn_w0_bf16_e16", ("bf16",), "cnn_w0_e16"),
        ("cnn_w0_fp8-delayed_e8", ("fp8-delayed",), "cnn_w0_e8"),
        ("cnn_w0_fp8-delayed_e16", ("fp8-delayed",), "cnn_w0_e16")]


def test_repeat_identical_compares_returns_and_curves_bitwise(tmp_path):
    from repro import hardware, results

    hw = hardware.lookup("cpu")

    def recs(values, curves, commit):
        out = []
        for seed, (v, c) in enumerate(zip(values, curves)):
            r = results.make_record("rl_quality", "final_return", v, "return", recipe="fp32",
                                    sizes={"env": "CartPole-v1", "seed": seed},
                                    extra={"variant": "fp32", "curve": c}, hardware=hw)
            out.append({**r, "git_commit": commit})
        return out

    import pandas as pd

    a = pd.DataFrame(recs([1.0, float("nan")], [[1.0, None], [2.0]], "abcdef0123"))
    same = pd.DataFrame(recs([1.0, float("nan")], [[1.0, None], [2.0]], "abcdef0123"))
    other = pd.DataFrame(recs([1.0, float("nan")], [[1.0, None], [2.0000001]], "abcdef0123"))
    t = rl_analysis.repeat_identical(a, same)
    assert len(t) == 1 and t.iloc[0]["seeds"] == 2 and bool(t.iloc[0]["identical"])
    assert not bool(rl_analysis.repeat_identical(a, other).iloc[0]["identical"])  # one curve point differs
    assert rl_analysis.repeat_identical(a, a.iloc[0:0]).empty
    # re-recorded at another commit (other code): not a repeat, not compared
    later = pd.DataFrame(recs([1.0, float("nan")], [[1.0, None], [2.0000001]], "fedcba9876"))
    assert rl_analysis.repeat_identical(a, later).empty


@pytest.mark.slow
def test_a_failing_cell_does_not_stop_the_study(tmp_path, monkeypatch, capsys):
    """A cell that raises (a convolution the device cannot compile) is logged and named at the
    end; the cells after it still run and are written."""
    from repro import results
    from repro.studies.runner import CellsFailed

    def fake_cell(env_name, v, p):
        if v == "fp8-delayed":
            raise RuntimeError("NOT_FOUND: No supported configs found for HLO\nmore lines")
        return [results.make_record(RQ.QUALITY, "final_return", 1.0, "return",
                                    sizes={"env": env_name, "variant": v}, profile=p.profile)]

    monkeypatch.setattr(RQ, "quality_cell", fake_cell)
    only = ["CartPole-v1_fp32", "CartPole-v1_fp8-delayed", "CartPole-v1_fp8-e2e"]
    with pytest.raises(CellsFailed) as e:
        studies.record(RQ.QUALITY, "smoke", tmp_path, only=only, progress=False)
    assert len(e.value.failures) == 1 and "CartPole-v1_fp8-delayed" in e.value.failures[0]
    assert "No supported configs" in e.value.failures[0] and "more lines" not in str(e.value)
    for ok in ("CartPole-v1_fp32", "CartPole-v1_fp8-e2e"):  # before and after the failure
        assert results.have_cell(RQ.QUALITY, ok, root=tmp_path)
    assert not results.have_cell(RQ.QUALITY, "CartPole-v1_fp8-delayed", root=tmp_path)



def test_all_layers_throughput_variant_puts_first_layer_and_heads_in_fp8(tmp_path):
    """A throughput cell named ``fp8-all-layers`` runs that RL variant (fp8-delayed with
    scope "all"): its lowered PPO update quantizes to E4M3 in more places (the first
    layer and both heads of each tower, forward) than plain fp8-delayed's; a name that is
    neither a variant nor a recipe fails before any work."""
    import re

    import dataclasses

    from repro.experiments.rl_throughput import measure as X

    all_layers = resolve("fp8-all-layers")
    assert (all_layers.family, all_layers.scope) == ("fp8-delayed", "all")
    p = dataclasses.replace(studies.params(X.THROUGHPUT, "smoke"), num_minibatches=1)

    def e4m3_converts(token):
        update, args = X.update_step(X.throughput_config("mlp", 64, token, 8, p))
        text = update.lower(*args).as_text()
        return len(re.findall(r"-> tensor<[0-9x]*xf8E4M3FN>", text))

    plain, every = e4m3_converts("fp8-delayed"), e4m3_converts("fp8-all-layers")
    assert plain > 0 and every > plain
    with pytest.raises(ValueError, match="unknown recipe"):
        studies.record(X.THROUGHPUT, "smoke", tmp_path, recipes=["fp7"])


def _joint_loss_reference(out, values, batch, adv, tgt, c, log_prob, entropy):
    """PureJaxRL's PPO loss written out once, as one expression (the reference the update's
    gradients must match however the update splits it)."""
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = jnp.exp(log_prob(out, batch.action) - batch.log_prob)
    surrogate = -jnp.mean(jnp.minimum(ratio * adv,
                                      jnp.clip(ratio, 1 - c.clip_eps, 1 + c.clip_eps) * adv))
    v_clip = batch.value + jnp.clip(values - batch.value, -c.clip_eps, c.clip_eps)
    v_loss = 0.5 * jnp.mean(jnp.maximum((values - tgt) ** 2, (v_clip - tgt) ** 2))
    return surrogate + c.vf_coef * v_loss - c.ent_coef * jnp.mean(entropy(out))


@pytest.mark.parametrize("recipe,gaussian", [("fp32", False), ("fp8-delayed", False),
                                             ("bf16", True)])
def test_tower_by_tower_gradients_are_the_joint_loss(recipe, gaussian):
    from repro.models import ppo_continuous as pc

    n, obs_dim = 64, 6
    k = jax.random.split(jax.random.key(3), 6)
    if gaussian:
        net = networks.GaussianActorCritic(3, resolve(recipe), (32, 32), (32, 32))
        action = jax.random.normal(k[0], (n, 3))
        policy = pc.GAUSSIAN
    else:
        net = networks.make_network("mlp", 4, recipe, width=32, depth=3)
        action = jax.random.randint(k[0], (n,), 0, 4)
        policy = ppo.CATEGORICAL
    obs = jax.random.normal(k[1], (n, obs_dim))
    variables = net.init(k[2], obs)
    batch = ppo.Transition(obs=obs, action=action, log_prob=-1.0 - jax.random.uniform(k[3], (n,)),
                           value=jax.random.normal(k[4], (n,)), reward=jnp.zeros(n),
                           done=jnp.zeros(n, bool))
    adv, tgt = jax.random.normal(k[5], (2, n))
    scale = jnp.float32(4.0)
    c = ppo.PPOConfig(recipe=recipe, num_envs=16, num_steps=16)

    def reference(v):
        out, values = net.apply(v, obs)
        return _joint_loss_reference(out, values, batch, adv, tgt, c, policy.log_prob,
                                     policy.entropy) * scale

    want = jax.grad(reference)(variables)
    got = {}
    for order in (True, False):
        co = ppo.PPOConfig(recipe=recipe, num_envs=16, num_steps=16, sequential_towers=order)
        assert ppo.sequential_towers(co, net) is order
        got[order] = jax.jit(ppo.loss_grads(co, net, policy))(variables, batch, adv, tgt, scale)
        # against the one-expression loss (not under FP8: there a last-bit difference of a
        # cotangent can move a gradient element by an e5m2 step, a quarter of its value)
        if recipe != "fp8-delayed":
            for g, w in zip(jax.tree.leaves(got[order]), jax.tree.leaves(want)):
                g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
                tol = 1e-5 if recipe == "fp32" else 1e-2
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max())
    # tower by tower is the same arithmetic as the joint gradient of the same terms
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 got[True], got[False])
    # the barrier is there: the actor's pass waits for the critic's gradients
    co = ppo.PPOConfig(recipe=recipe, num_envs=16, num_steps=16, sequential_towers=True)
    jaxpr = jax.make_jaxpr(ppo.loss_grads(co, net, policy))(variables, batch, adv, tgt, scale)
    assert "optimization_barrier" in str(jaxpr)


def test_towers_run_in_sequence_by_default_only_for_wide_quantized_updates():
    wide = networks.make_network("mlp", 4, "fp8-delayed", width=4096, depth=2)
    big = dict(num_envs=2048, num_steps=128, num_minibatches=4)  # minibatch 65536
    assert ppo.sequential_towers(ppo.PPOConfig(recipe="fp8-delayed", **big), wide)
    assert ppo.sequential_towers(ppo.PPOConfig(recipe="fp8-current", **big), wide)
    # 16-bit recipes keep XLA's own order (it already ran their towers one by one)
    assert not ppo.sequential_towers(ppo.PPOConfig(recipe="bf16", **big), wide)
    # small activations: one joint gradient (XLA may fuse the towers' small kernels)
    assert not ppo.sequential_towers(ppo.PPOConfig(recipe="fp8-delayed"), wide)
    narrow = networks.make_network("mlp", 4, "fp8-delayed", width=64, depth=2)
    assert not ppo.sequential_towers(ppo.PPOConfig(recipe="fp8-delayed", **big), narrow)
    assert ppo.sequential_towers(ppo.PPOConfig(recipe="bf16", sequential_towers=True), narrow)
    # a shared trunk cannot be split, whatever the option says
    cnn = networks.make_network("cnn", 4, "fp8-delayed", obs_shape=(10, 10, 4))
    assert not ppo.sequential_towers(
        ppo.PPOConfig(recipe="fp8-delayed", sequential_towers=True, **big), cnn)


def test_critic_values_equal_one_call_per_array():
    # One batched pass over several [K, N, ...] arrays against a numpy loop per array and
    # entry, with a critic that reads every observation entry (a T / N mix-up would show).
    rng = np.random.default_rng(1)
    w = np.array([1.0, -2.0, 0.5], np.float32)
    arrays = [rng.normal(size=(k, 4, 3)).astype(np.float32) for k in (5, 1, 5)]
    got = ppo.critic_values(lambda o: jnp.asarray(o) @ w, *map(jnp.asarray, arrays))
    for a, g in zip(arrays, got):
        assert g.shape == a.shape[:2]
        want = np.einsum("kni,i->kn", a.astype(np.float64), w.astype(np.float64))
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=1e-6)


def test_learn_computes_the_values_a_rollout_left_out():
    # learn() with traj.value None (the critic left out of the rollout) must update exactly as
    # learn() given the critic's values and the bootstrapped rewards computed beforehand.
    c = ppo.validate(TINY)
    env, env_params = ppo.make_env(c.env)
    net = ppo.build_network(c, env, env_params)
    tx = ppo.make_optimizer(c)
    variables, opt_state = ppo.init_state(c, net, env, env_params, tx, jax.random.key(0))
    T, N = c.num_steps, c.num_envs
    k = jax.random.split(jax.random.key(1), 4)
    obs = jax.random.normal(k[0], (T, N, 4))
    final = jax.random.normal(k[1], (T, N, 4))
    last = jax.random.normal(k[2], (N, 4))
    term = jax.random.bernoulli(k[3], 0.1, (T, N))
    trunc = jnp.zeros((T, N), bool).at[7, 1].set(True).at[3, 2].set(True)
    traj = ppo.Transition(obs, jnp.zeros((T, N), jnp.int32), jnp.full((T, N), -0.7),
                          None, jnp.ones((T, N)), term | trunc)
    critic = lambda v, o: net.apply(v, o, method="value")  # noqa: E731
    update = ppo.make_update_step(c, net, tx)
    after, _ = ppo.learn(c, update, critic, variables, opt_state, traj, (final, term, trunc),
                         last, jax.random.key(5))
    given = traj._replace(value=critic(variables, obs.reshape(T * N, 4)).reshape(T, N))
    before, _ = ppo.learn(c, update, critic, variables, opt_state, given,
                          (final, term, trunc), last, jax.random.key(5))
    # the parameters' changes agree to float32 summation order (Adam divides by the gradient's
    # size, so the tiniest gradients' rounding shows in the update)
    for a, b, v in zip(*map(jax.tree.leaves, (after, before, variables))):
        moved, want = np.asarray(a) - np.asarray(v), np.asarray(b) - np.asarray(v)
        assert np.abs(want).max() > 1e-4  # every leaf learned something
        np.testing.assert_allclose(moved, want, rtol=0, atol=2e-3 * np.abs(want).max())
