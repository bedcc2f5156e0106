"""The PureJaxRL comparison's compile levers (CPU): the ``epoch_unroll`` speed option, which
leaves PPO's arithmetic as it is, and the ``_stages`` cells, which time where a program's
compile goes through ``jax.stages`` (nothing runs)."""

import jax
import numpy as np
import pytest

from repro.experiments.rl_purejaxrl import measure as P
from repro.models import ppo
from repro.program import kit_hash

TINY = dict(env="CartPole-v1", num_envs=4, num_steps=16, total_timesteps=2 * 4 * 16,
            update_epochs=2, num_minibatches=2, recipe="fp32")


def _scans(jaxpr, out=None):
    from jax.extend.core import jaxprs_in_params

    out = [] if out is None else out
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            out.append((eqn.params["length"], eqn.params["unroll"]))
        for sub in jaxprs_in_params(eqn.params):
            _scans(sub, out)
    return out


def test_epoch_unroll_unrolls_the_epoch_scan_alone_and_keeps_the_update():
    c0 = ppo.validate(TINY)
    c1 = ppo.validate(dict(TINY, update_unroll=2, epoch_unroll=1))
    env, env_params = ppo.make_env(c0.env)
    from repro.experiments.rl_throughput import measure as rl

    def update(c):
        net = ppo.build_network(c, env, env_params)
        tx = ppo.make_optimizer(c)
        variables, opt_state = ppo.init_state(c, net, env, env_params, tx, jax.random.key(1))
        traj, adv, tgt = rl.synthetic_rollout(c, env, env_params, jax.random.key(2))
        fn = ppo.make_update_step(c, net, tx)
        args = (variables, opt_state, traj, adv, tgt, jax.random.key(3))
        return fn, args

    fn0, args = update(c0)
    fn1, _ = update(c1)
    # epochs (length 2) rolled, minibatches (length 2) unrolled by 2; the defaults: both 1
    assert _scans(jax.make_jaxpr(fn1)(*args).jaxpr) == [(2, 1), (2, 2)]
    assert _scans(jax.make_jaxpr(fn0)(*args).jaxpr) == [(2, 1), (2, 1)]
    a, b = jax.jit(fn0)(*args), jax.jit(fn1)(*args)
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) and any(np.any(np.asarray(x) != np.asarray(y)) for x, y in
                                      zip(la, jax.tree.leaves(args[:2])))  # it moved
    for x, y in zip(la, lb):  # bitwise on CPU: unrolling changes the loop, not the arithmetic
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(ValueError, match="epoch_unroll=0: expected int or None, > 0"):
        ppo.validate(dict(TINY, epoch_unroll=0))


def test_epoch_unroll_is_a_speed_option_of_the_comparison():
    c = P.ours_config(P.CARTPOLE, options={"unroll": 8, "update_unroll": 4, "epoch_unroll": 1})
    assert (c.unroll, c.update_unroll, c.epoch_unroll) == (8, 4, 1)
    name = P.cell_name(P.CARTPOLE, 1, {"unroll": 8, "update_unroll": 4, "epoch_unroll": 1})
    assert name == "CartPole-v1_s1_epoch_unroll-1_unroll-8_update_unroll-4"
    rec = {"program": {"cell": name}, "extra": {}}
    assert P._options_of(rec) == {"epoch_unroll": 1, "unroll": 8, "update_unroll": 4}


def test_stage_times_and_our_parts_compile_on_cpu():
    st = P.stage_times(jax.jit(lambda x: x * 2), np.ones(3, np.float32))
    assert list(st) == ["trace_s", "lower_s", "compile_s"] and all(v >= 0 for v in st.values())
    c = ppo.validate(TINY)
    parts = P.ours_parts(c, seeds=2)
    assert list(parts) == ["update", "gae"]
    for fn, args in parts.values():  # each compiles for its abstract, seed-batched arguments
        leaves = jax.tree.leaves(args)
        assert leaves and all(a.shape[0] == 2 for a in leaves)
        st = P.stage_times(fn, *args)
        assert st["compile_s"] > 0


def test_stages_cells_come_after_the_timed_cells_with_their_own_kit():
    p = P.Params(profile="smoke", recipe="tf32", repeats=1, total_timesteps=1024, seeds=(1,),
                 ours=({}, {"unroll": 8}), first_result=False, compile_stages=True)
    names = [c.name for c in P.cells(p)]
    assert names == ["CartPole-v1_s1", "CartPole-v1_s1_unroll-8", "CartPole-v1_s1_stages",
                     "CartPole-v1_s1_unroll-8_stages"]
    plain = P.cells(P.Params(**{**p.__dict__, "compile_stages": False}))
    assert [c.name for c in plain] == names[:2]
    timed, staged = P.program(1, 1024), P.program(1, 1024, stages=True)
    assert kit_hash(timed.kit) != kit_hash(staged.kit)  # the stages cells stale nothing else
    rec = {"metric": "compile_stages_s", "recipe": "tf32",
           "sizes": {"seeds": 1, "env_steps": 1024},
           "extra": {"config": {**P.CARTPOLE, "TOTAL_TIMESTEPS": 1024}, "options": {}}}
    assert P.program_settings(rec) == {"seeds": 1, "total_timesteps": 1024, "recipe": "tf32",
                                       "options": {}, "stages": True}
    assert "stages" not in P.program_settings({**rec, "metric": "env_steps_per_s"})


def test_stages_records_hold_the_stages_and_parts():
    p = P.Params(profile="smoke", recipe="tf32", repeats=1, total_timesteps=1024, seeds=(1,))
    st = {"purejaxrl": {"whole": {"trace_s": 1.0, "lower_s": 0.5, "compile_s": 2.0}},
          "repro": {"whole": {"trace_s": 2.0, "lower_s": 0.25, "compile_s": 3.0},
                    "update": {"trace_s": 0.5, "lower_s": 0.1, "compile_s": 1.0}}}
    recs = P._stages_records(p, 1, {}, st)
    assert [(r["extra"]["impl"], r["value"]) for r in recs] == [("purejaxrl", 3.5),
                                                                ("repro", 5.25)]
    assert recs[1]["extra"]["parts"] == {"update": st["repro"]["update"]}
    assert recs[0]["extra"]["parts"] == {} and all(r["extra"]["fresh_process"] for r in recs)
    assert all(r["metric"] == "compile_stages_s" for r in recs)
