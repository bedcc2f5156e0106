"""The PureJaxRL comparison's adapters, checked against independent computations.

PureJaxRL's code is not in this repository: the loader is exercised with a small stand-in
checkout written here, shaped like the real one (``purejaxrl/ppo.py`` importing distrax, gymnax
and ``purejaxrl.wrappers``, which imports brax, navix and chex and unpacks 5-value steps)."""

import json
import sys
import textwrap

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repro import cli, evidence, results
from repro.analysis import rl as rl_analysis
from repro.experiments.rl_purejaxrl import measure as purejaxrl
from repro.experiments.rl_purejaxrl import peer
from repro.models import ppo
from repro.studies import runner


def params(**kw):
    base = dict(profile="smoke", recipe="tf32", repeats=3, total_timesteps=1024, seeds=(1,),
                ours=({},), first_result=False)
    return purejaxrl.Params(**{**base, **kw})


def record(p, root, **kw):
    return runner.run(purejaxrl.STUDY, p, root, progress=False, **kw).written


@pytest.fixture
def clean_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("distrax", "brax", "navix", "chex", "purejaxrl", "wrappers"):
            del sys.modules[name]


def test_categorical_stand_in_matches_float64_softmax():
    logits = np.array([[0.3, -1.2, 2.0], [5.0, 5.0, -30.0]], np.float32)
    pi = peer.distrax_stand_in().Categorical(logits=jnp.asarray(logits))
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(pi.log_prob(jnp.array([2, 0])), np.log([p[0, 2], p[1, 0]]),
                               rtol=1e-5)
    ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), 1)
    np.testing.assert_allclose(pi.entropy(), ent, rtol=1e-5)
    keys = jax.random.split(jax.random.PRNGKey(0), 20000)
    draws = np.asarray(jax.vmap(lambda k: pi.sample(seed=k))(keys))[:, 0]
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, p[0], atol=0.015)


def test_five_tuple_step_is_gymnax_0x():
    env, params = gymnax.make("CartPole-v1")
    wrapped = peer.FiveTupleStep(env)
    key = jax.random.PRNGKey(3)
    obs, state = env.reset(key, params)
    state = state.replace(time=params.max_steps_in_episode - 1)  # next step truncates
    raw = env.step(key, state, 1, params)
    out = wrapped.step(key, state, 1, params)
    assert len(raw) == 6 and len(out) == 5
    assert bool(raw[4]) and bool(out[3])  # truncated -> done
    np.testing.assert_array_equal(out[0], raw[0])
    assert not set(peer.GYMNAX_1_INFO) & set(out[4])
    assert wrapped.action_space(params).n == env.action_space(params).n


STAND_IN_WRAPPERS = """
import chex
import jax.numpy as jnp
from brax import envs
from brax.envs.wrappers.training import EpisodeWrapper, AutoResetWrapper
import navix as nx


class LogWrapper:
    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, key: chex.PRNGKey, state, action, params=None):
        obs, state, reward, done, info = self._env.step(key, state, action, params)
        info["returned_episode"] = done
        # the real wrapper holds the last finished episode's return; 10 where one ends here
        info["returned_episode_returns"] = jnp.where(done, 10.0, 3.0)
        return obs, state, reward, done, info
"""

STAND_IN_PPO = """
import distrax
import gymnax
import jax
import jax.numpy as jnp
from wrappers import LogWrapper  # as PureJaxRL's ppo.py imports it


def make_train(config):
    env, env_params = gymnax.make(config["ENV_NAME"])
    env = LogWrapper(env)
    updates = int(config["TOTAL_TIMESTEPS"]) // config["NUM_STEPS"] // config["NUM_ENVS"]

    def train(rng):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(rng, config["NUM_ENVS"]), env_params)

        def step(carry, _):
            obs, state, rng = carry
            rng, k1, k2 = jax.random.split(rng, 3)
            pi = distrax.Categorical(logits=jnp.zeros((config["NUM_ENVS"], 2)))
            action = pi.sample(seed=k1)
            obs, state, reward, done, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k2, config["NUM_ENVS"]), state, action, env_params)
            return (obs, state, rng), info

        _, info = jax.lax.scan(step, (obs, state, rng), None, updates * config["NUM_STEPS"])
        # PureJaxRL's metrics: the wrapper's info, [updates, steps, envs]
        info = jax.tree.map(lambda x: x.reshape(updates, config["NUM_STEPS"], -1), info)
        return {"metrics": info}

    return train
"""


@pytest.fixture
def checkout(tmp_path):
    pkg = tmp_path / "purejaxrl_checkout" / "purejaxrl"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "wrappers.py").write_text(textwrap.dedent(STAND_IN_WRAPPERS))
    (pkg / "ppo.py").write_text(textwrap.dedent(STAND_IN_PPO))
    return pkg.parent


@pytest.mark.slow
def test_load_and_record_a_stand_in_checkout(checkout, tmp_path, clean_modules, capsys):
    p = params(repeats=2, seeds=(2,), ours=({}, {"unroll": 2}),
               purejaxrl=str(checkout / "purejaxrl"))
    written = record(p, tmp_path / "r")
    # several seeds on the CPU: the known XLA:CPU hang of PureJaxRL's program is named
    assert "2 or more vmapped seeds has hung" in capsys.readouterr().err
    assert sorted(w.stem for w in written) == ["CartPole-v1_s2", "CartPole-v1_s2_unroll-2"]
    df = evidence.load_records(purejaxrl.EXPERIMENT, roots=[tmp_path / "r"])
    assert sorted(df.extra.map(lambda e: e["impl"])) == [
        "purejaxrl", "purejaxrl", "repro", "repro[unroll=2]"]
    # 1024 // 128 // 4 = 2 updates of 128 steps x 4 envs, per seed
    assert set(df.size_env_steps.astype(int)) == {2048}
    assert purejaxrl.env_steps(purejaxrl.CARTPOLE, 1) == 976 * 512
    theirs = df[df.extra.map(lambda e: e["impl"]) == "purejaxrl"]
    # PureJaxRL is re-timed beside each option set; its final return is where episodes ended
    assert len(theirs.extra.iloc[0]["run_s"]) == 2
    assert {e["final_return"]["mean"] for e in theirs.extra} == {10.0}
    assert {e["final_return"]["n"] for e in df.extra} == {2}
    table = rl_analysis.purejaxrl_speedups(df)
    assert list(table.ours) == ["repro", "repro[unroll=2]"] and (table.speedup > 0).all()
    assert list(table.options) == [{}, {"unroll": 2}] and table.best.sum() == 1
    # unrolling keeps the arithmetic: the two option sets' returns, fingerprinted in the run
    # that timed them, are bitwise equal (CPU); the digest is of the returns themselves
    ours = ppo.make_train(purejaxrl.ours_config({**purejaxrl.CARTPOLE, "TOTAL_TIMESTEPS": 1024}))
    direct = jax.jit(jax.vmap(ours))(purejaxrl._keys(2))
    assert table.returns_digest[0] == purejaxrl.returns_digest(direct)
    assert table.same_returns[1] is True and table.same_returns[0] is None
    assert (table["min"] <= table["max"]).all()


@pytest.mark.slow
def test_first_result_is_timed_in_fresh_processes_without_compile_caches(
        checkout, tmp_path, clean_modules, monkeypatch):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_per_fusion_autotune_cache_dir=/x --xla_foo=1")
    env = purejaxrl.fresh_env()
    assert "JAX_COMPILATION_CACHE_DIR" not in env and env["XLA_FLAGS"] == "--xla_foo=1"
    assert env["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    monkeypatch.setenv("XLA_FLAGS", "")
    p = params(repeats=1, ours=({"unroll": 2},), first_result=True, purejaxrl=str(checkout))
    record(p, tmp_path / "r")
    df = evidence.load_records(purejaxrl.EXPERIMENT, roots=[tmp_path / "r"])
    first = df[df.metric == "first_result_s"]
    assert sorted(first.extra.map(lambda e: e["impl"])) == ["purejaxrl", "repro[unroll=2]"]
    for e, v in zip(first.extra, first.value):
        assert 0 < e["compile_s"] <= v <= e["process_s"] and e["fresh_process"]
    # the steps/s table still pairs the two timed runs; the first-result table pairs these
    assert len(rl_analysis.purejaxrl_speedups(df)) == 1
    t = rl_analysis.purejaxrl_first_results(df)
    assert len(t) == 1 and t.iloc[0].options == {"unroll": 2}
    ours, theirs = (first[first.extra.map(lambda e: e["impl"]) == i].value.iloc[0]
                    for i in ("repro[unroll=2]", "purejaxrl"))
    assert t.iloc[0]["repro first s"] == ours and t.iloc[0]["purejaxrl first s"] == theirs
    assert t.iloc[0]["first ratio"] == pytest.approx(theirs / ours)
    with pytest.raises(RuntimeError, match="fresh process for purejaxrl failed"):
        purejaxrl.first_result("purejaxrl", purejaxrl.CARTPOLE, 1,
                               purejaxrl=str(tmp_path / "nowhere"))


def _fake_compare(calls, rates, monkeypatch):
    """Stand-ins for PureJaxRL's compilation and ``compare``: run seconds from ``rates``
    (label -> per-repeat env-steps/s of one seed at 1024 env steps); ``calls`` collects the
    (seed count, option set) of every comparison."""
    def compare(theirs, cfg, seeds, repeats, recipe="tf32", options=None):
        calls.append((seeds, dict(options or {})))
        name = purejaxrl.label(options)
        facts = {"purejaxrl": {"final_returns": None},  # every option set "differs"
                 name: {"returns_digest": "d-" + name, "final_returns": None}}
        return name, {n: [seeds * 1024 / r for r in rates[n]] for n in ("purejaxrl", name)}, \
            facts

    monkeypatch.setattr(purejaxrl, "compare", compare)
    monkeypatch.setattr(purejaxrl, "compile_theirs", lambda module, cfg, seeds: None)


@pytest.mark.slow
def test_cells_per_option_set_resume_and_pair_within_one_process(checkout, tmp_path,
                                                                 clean_modules, monkeypatch):
    rates = {"purejaxrl": [100.0, 100.0, 100.0], "repro": [90.0, 110.0, 120.0],
             "repro[unroll=8]": [150.0, 120.0, 200.0], "repro[prng=rbg,unroll=8]": [80.0] * 3}
    calls = []
    _fake_compare(calls, rates, monkeypatch)
    root = tmp_path / "r"

    def run(ours, force=False):
        p = params(seeds=(1, 4), ours=tuple(ours), purejaxrl=str(checkout))
        return record(p, root, force=force)

    assert len(run([{}])) == 2
    # a cell recorded before options existed: no "options", impl "repro"
    for path in root.glob("*/rl_purejaxrl/*.json"):
        recs = json.loads(path.read_text())
        for r in recs:
            r["extra"].pop("options", None)
        path.write_text(json.dumps(recs))
    calls.clear()
    both = [{}, {"unroll": 8}, {"unroll": 8, "prng": "rbg"}]
    assert len(run(both)) == 4  # the plain cells stay; the new option sets of both seed counts
    assert calls == [(1, both[1]), (1, both[2]), (4, both[1]), (4, both[2])]
    assert run(both) == [] and len(run(both, force=True)) == 6

    table = rl_analysis.purejaxrl_speedups(evidence.load_records(purejaxrl.EXPERIMENT, roots=[root]))
    assert len(table) == 6 and list(table.seeds) == [1, 1, 1, 4, 4, 4]
    assert list(table.ours[:3]) == ["repro", "repro[prng=rbg,unroll=8]", "repro[unroll=8]"]
    row = table.iloc[2]  # unroll=8: median 150 against 100; per-repeat ratios 1.2 to 2.0
    assert row.options == {"unroll": 8} and row.best
    assert (row.speedup, row["min"], row["max"]) == pytest.approx((1.5, 1.2, 2.0))
    assert table.best.sum() == 2 and not table.iloc[0].best
    # returns are compared to the defaults' only for option sets that keep the random streams
    # (the fake digests all differ): the defaults and the prng set have nothing to compare
    assert list(table.same_returns[:3]) == [None, None, False]
    assert table.iloc[0].speedup == pytest.approx(1.1)


def test_option_sets_may_only_set_speed_options(tmp_path):
    c = purejaxrl.ours_config(purejaxrl.CARTPOLE, options={"unroll": 8, "prng": "rbg"})
    assert (c.unroll, c.prng, c.num_envs) == (8, "rbg", 4)
    p = params(repeats=1, ours=({}, {"num_envs": 8}), purejaxrl=str(tmp_path))
    # before the (missing) checkout is looked at
    with pytest.raises(ValueError, match=r"sets \['num_envs'\]: only unroll") as e:
        runner.plan(purejaxrl.STUDY, p)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unroll=0: expected int, > 0"):
        purejaxrl.ours_config(purejaxrl.CARTPOLE, options={"unroll": 0})


def test_missing_checkout_is_one_clear_line(tmp_path, capsys):
    assert cli.main(["record", "rl_purejaxrl", "--purejaxrl", str(tmp_path), "--profile",
                     "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "purejaxrl/ppo.py" in err
    assert cli.main(["record", "rl_purejaxrl", "--profile", "smoke"]) == 2
    assert "rl_purejaxrl needs --purejaxrl" in capsys.readouterr().err
    assert cli.main(["record", "gemm", "--purejaxrl", str(tmp_path)]) == 2
    assert "gemm does not take --purejaxrl" in capsys.readouterr().err


def test_ours_config_is_purejaxrl_cartpole():
    c = purejaxrl.ours_config(purejaxrl.CARTPOLE)
    assert (c.num_envs, c.num_steps, c.total_timesteps, c.num_minibatches) == (4, 128, 500000, 4)
    assert (c.lr, c.grad_clip, c.activation, c.width, c.depth) == (2.5e-4, 0.5, "tanh", 64, 2)


def test_speedups_of_no_records_is_an_empty_table():
    import pandas as pd

    empty = rl_analysis.purejaxrl_speedups(pd.DataFrame())
    assert not len(empty) and "speedup" in empty.columns


def test_final_returns_of_both_output_shapes_by_hand():
    nan = np.nan
    ours = {"episode_return": np.array([[1.0, nan, 3.0, 5.0], [9.0, 9.0, nan, 2.0]]),
            "episodes": np.array([[1, 0, 1, 1], [1, 1, 0, 1]]),
            "nonfinite_params": np.zeros((2, 4), bool)}
    # last half of 4 updates: (3 + 5) / 2; the update with no finished episode does not count
    np.testing.assert_allclose(purejaxrl.final_returns(ours, "repro", 0.5), [4.0, 2.0])
    np.testing.assert_allclose(purejaxrl.final_returns(ours, "repro", 0.1), [5.0, 2.0])
    # PureJaxRL: [seeds=1, updates=2, steps=2, envs=2]; only steps with returned_episode count
    done = np.array([[[[1, 0], [0, 0]], [[1, 1], [0, 1]]]], bool)
    rets = np.array([[[[4.0, 7.0], [7.0, 7.0]], [[10.0, 20.0], [99.0, 30.0]]]])
    theirs = {"metrics": {"returned_episode": done, "returned_episode_returns": rets}}
    np.testing.assert_allclose(purejaxrl.final_returns(theirs, "purejaxrl", 0.5), [20.0])
    # over both updates, each finished episode counts once (episode-weighted, as ppo.final_return)
    np.testing.assert_allclose(purejaxrl.final_returns(theirs, "purejaxrl", 1.0),
                               [(4 + 10 + 20 + 30) / 4])
    assert purejaxrl.final_returns({"metrics": done}, "purejaxrl") is None


def test_welch_interval_matches_scipy():
    from scipy import stats

    rng = np.random.default_rng(0)
    a, b = rng.normal(500, 3, 40), rng.normal(498, 9, 25)
    gap, lo, hi = rl_analysis.welch_interval(a.mean(), a.std(ddof=1), a.size,
                                           b.mean(), b.std(ddof=1), b.size)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert gap == pytest.approx(a.mean() - b.mean())
    assert (lo, hi) == pytest.approx((ref.low, ref.high))


def test_speedups_report_final_returns_and_their_gap(tmp_path):
    def rec(impl, value, final):
        extra = {"impl": impl, "run_s": [4 / value], "final_return": final}  # 4 env steps
        if impl != "purejaxrl":
            extra["options"] = {}
        return results.make_record(purejaxrl.EXPERIMENT, "env_steps_per_s", value, "steps/s",
                                   sizes={"seeds": 4, "env_steps": 4}, extra=extra)

    mine = {"mean": 500.0, "sd": 0.0, "n": 4}
    theirs = {"mean": 490.0, "sd": 20.0, "n": 4}
    results.write_records([rec("purejaxrl", 100.0, theirs), rec("repro", 150.0, mine)],
                          purejaxrl.EXPERIMENT, "CartPole-v1_s4", root=tmp_path)
    row = rl_analysis.purejaxrl_speedups(evidence.load_records(purejaxrl.EXPERIMENT,
                                                  roots=[tmp_path])).iloc[0]
    # SE = 20 / sqrt(4) = 10 with 3 degrees of freedom (ours has no spread): t = 3.182
    assert (row.final_return, row["purejaxrl final_return"], row.final_n) == (500, 490, 4)
    assert row.return_gap == pytest.approx(10.0)
    assert (row.gap_lo, row.gap_hi) == pytest.approx((10 - 31.82, 10 + 31.82), abs=0.01)


@pytest.mark.slow
def test_only_and_confirming_runs_keep_earlier_runs_as_separate_cells(checkout, tmp_path,
                                                                       clean_modules,
                                                                       monkeypatch):
    rates = {"purejaxrl": [100.0] * 3, "repro": [110.0] * 3,
             "repro[unroll=8,update_unroll=4]": [130.0, 125.0, 120.0]}
    calls = []
    _fake_compare(calls, rates, monkeypatch)
    sets = ({}, {"unroll": 8, "update_unroll": 4})
    root = tmp_path / "r"

    def run(only, runs=1):
        p = params(ours=sets, runs=runs, purejaxrl=str(checkout))
        return [w.stem for w in record(p, root, only=only)]

    # the option set by its cell name; the defaults are not timed
    assert run(["*_unroll-8_update_unroll-4"]) == ["CartPole-v1_s1_unroll-8_update_unroll-4"]
    assert calls == [(1, sets[1])]
    assert run(["*_unroll-8_update_unroll-4"]) == []  # recorded: skipped
    rates["repro[unroll=8,update_unroll=4]"] = [115.0] * 3  # the second run is slower
    assert run(["*_unroll-8_update_unroll-4*"], runs=2) == [
        "CartPole-v1_s1_unroll-8_update_unroll-4_run2"]
    assert run(["CartPole-v1_s1"], runs=2) == ["CartPole-v1_s1"]
    table = rl_analysis.purejaxrl_speedups(evidence.load_records(purejaxrl.EXPERIMENT, roots=[root]))
    unrolled = table[table.ours == "repro[unroll=8,update_unroll=4]"]
    assert list(unrolled.run) == [1, 2] and list(unrolled.runs) == [2, 2]
    assert list(unrolled.speedup) == pytest.approx([1.25, 1.15])
    assert table[table.ours == "repro"].runs.tolist() == [1]


def test_only_that_selects_no_cell_is_one_line(checkout):
    p = params(ours=({}, {"unroll": 8}), purejaxrl=str(checkout))
    with pytest.raises(ValueError) as e:
        runner.plan(purejaxrl.STUDY, p, only=["*unroll-16"])
    assert "\n" not in str(e.value)
    assert "--only *unroll-16 selects no cell; cells: CartPole-v1_s1, CartPole-v1_s1_unroll-8" \
        in str(e.value)
