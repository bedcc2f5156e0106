"""The cells of the ``legged`` study, as they run on the device: the physics alone, a random
policy's return, the PPO loop's speed (separate or paired), its training quality and brax's
own trainer beside ours (what each cell records: :mod:`repro.experiments.legged.measure`)."""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro import results
from repro.experiments.legged.schema import CLAIMS, EXPERIMENT, config
from repro.models import brax_peer, envs, ppo
from repro.models import ppo_continuous as pc
from repro.studies.lowering import compiled_facts, recipe_emulated
from repro.studies.timing import Timing, quartiles, time_fn, time_rounds


def compile_(p: Mapping[str, Any], fn, *args):
    """``(compiled fn, compile seconds)`` with the section's ``compiler_options`` (the smoke
    profile lowers XLA's CPU optimisation: an MJX program compiles about twice as fast)."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile(
        compiler_options=dict(p.get("compiler_options") or {}) or None)
    return compiled, time.perf_counter() - t0


def matmul_facts(env: envs.Adapter, num_envs: int) -> dict[str, Any]:
    """Which precision the physics' products use: the setting, JAX's global default, and
    the precisions of the lowered (batched) step's products."""
    _, state = jax.eval_shape(lambda k: env.reset(k, num_envs), jax.random.key(0))
    action = jax.ShapeDtypeStruct((num_envs, env.action_size), jnp.float32)
    text = jax.jit(env.step).lower(state, action).as_text(debug_info=True)
    return {"physics_precision": env.physics_precision or "jax default",
            "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
            "physics_dot_precisions": envs.dot_precisions(text)[envs.PHYSICS_SCOPE],
            "backend": jax.default_backend()}


def physics_rollout(env: envs.Adapter, num_envs: int, steps: int):
    """``run(key) -> (returns, ended)``: reset, then ``steps`` physics steps with uniform random
    actions in one ``lax.scan`` (no network); the return of each environment's first episode
    and whether it ended within the steps (a random policy's return, the score floor)."""
    def run(key):
        k_env, key = jax.random.split(key)
        _, state = env.reset(k_env, num_envs)

        def body(carry, _):
            state, ret, alive, key = carry
            key, k = jax.random.split(key)
            a = jax.random.uniform(k, (num_envs, env.action_size), minval=-1.0, maxval=1.0)
            _, state, r, term, trunc, _ = env.step(state, a)
            return (state, ret + r * alive, alive * (1.0 - (term | trunc)), key), None

        init = (state, jnp.zeros(num_envs), jnp.ones(num_envs), key)
        (_, ret, alive, _), _ = jax.lax.scan(body, init, None, steps)
        return ret, alive == 0

    return run


def random_record(p, env_name: str, ret, n: int, episode_length: int, profile: str):
    return results.make_record(
        EXPERIMENT, "random_return", float(np.mean(ret)), "return", claims=list(CLAIMS),
        sizes={"env": env_name, "variant": "random"}, spread=float(np.std(ret)),
        profile=profile, extra={"policy": "uniform random in [-1, 1]", "num_envs": n,
                                "episode_length": episode_length})


def _loop_timing(env: envs.Adapter, num_envs: int, steps: int) -> dict[str, float]:
    """The per-call way: the raw environment's step, ``jax.jit(jax.vmap(step))``, called from
    Python with zero actions, ``steps`` times after two timed warm-up calls (each of which
    may compile)."""
    step = jax.jit(jax.vmap(env.env.step))
    state = jax.jit(jax.vmap(env.env.reset))(jax.random.split(jax.random.PRNGKey(1), num_envs))
    a = jnp.zeros((num_envs, env.action_size), jnp.float32)
    calls = []
    for _ in range(2):
        t0 = time.perf_counter()
        state = jax.block_until_ready(step(state, a))
        calls.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(steps):
        state = step(state, a)
    jax.block_until_ready(state)
    return {"first_call_s": calls[0], "second_call_s": calls[1],
            "loop_env_steps_per_s": steps * num_envs / (time.perf_counter() - t0)}


def physics_cell(p, env_name: str, num_envs: int, precision: str, profile: str):
    q = p["physics"]
    c = config(p, env_name, "physics", physics_precision=None if precision == "default"
               else precision)
    env = pc.make_env(c)
    steps, repeats = int(q["steps"]), int(q["repeats"])
    key = jax.random.key(0)
    compiled, compile_s = compile_(p, physics_rollout(env, num_envs, steps), key)
    t = time_fn(compiled, key, repeats=repeats, warmup=1)
    rate = steps * num_envs / np.asarray(t.samples)
    loop = _loop_timing(env, num_envs, steps) if num_envs in q.get("loop_at", []) else {}
    sizes = {"env": env_name, "num_envs": num_envs, "steps": steps, "backend": c.backend,
             "precision": precision}
    extra = {**matmul_facts(env, num_envs), "compile_s": compile_s,
             "samples_s": list(t.samples), "note": "uniform random actions, reset included"}
    common = dict(claims=list(CLAIMS), sizes=sizes, profile=profile, extra=extra)
    q1, q3 = np.percentile(rate, [25, 75])
    recs = [results.make_record(EXPERIMENT, "physics_env_steps_per_s", steps * num_envs
                                / t.median_s, "steps/s", repeats=repeats,
                                spread=float(q3 - q1), **common)]
    units = {"loop_env_steps_per_s": "steps/s", "first_call_s": "s", "second_call_s": "s"}
    recs += [results.make_record(EXPERIMENT, m, loop[m], u, **common)
             for m, u in units.items() if m in loop]
    ret, ended = jax.device_get(compiled(key))
    if ended.all() and not p.get("random"):  # every first episode ended: the random floor
        recs.append(random_record(p, env_name, ret, num_envs, c.episode_length, profile))
    return recs


def random_cell(p, env_name: str, profile: str):
    """A uniform random policy's mean episode return (first episode of each environment)."""
    c = config(p, env_name, "quality")
    n = int(p["random"].get("num_envs", 64))
    key = jax.random.key(0)
    compiled, _ = compile_(p, physics_rollout(pc.make_env(c), n, c.episode_length), key)
    ret, _ = jax.device_get(compiled(key))
    return [random_record(p, env_name, ret, n, c.episode_length, profile)]


def _emulated(recipe: str, compiled) -> tuple[bool, dict[str, Any]]:
    facts = compiled_facts(compiled)
    return bool(recipe_emulated(recipe, facts["fp8_lowering"])), facts


def speed_parts(p, c: pc.ContinuousPPOConfig, env: envs.Adapter, repeats: int):
    """Median seconds of the policy's rollout work (``num_steps`` steps) and of one update,
    each as its own program, and the update's compiled facts."""
    network = pc.build_network(c, env.action_size)
    tx = ppo.make_optimizer(c)
    variables, opt_state = pc.init_state(c, network, env.obs_size, tx, jax.random.key(1))
    obs = jax.random.normal(jax.random.key(2), (c.num_envs, env.obs_size))
    act = pc.make_act(c, network)

    def policy(variables, obs, key):
        def body(key, _):
            key, k = jax.random.split(key)
            return key, act(variables, obs, k)
        return jax.lax.scan(body, key, None, c.num_steps)[1]

    pol, _ = compile_(p, policy, variables, obs, jax.random.key(3))
    t_pol = time_fn(pol, variables, obs, jax.random.key(3), repeats=repeats)
    shape = (c.num_steps, c.num_envs)
    ks = jax.random.split(jax.random.key(4), 4)
    traj = ppo.Transition(
        jax.random.normal(ks[0], shape + (env.obs_size,)),
        jax.random.normal(ks[1], shape + (env.action_size,)),
        jnp.zeros(shape), jax.random.normal(ks[2], shape), jnp.zeros(shape),
        jnp.zeros(shape, bool))
    args = (variables, opt_state, traj, jax.random.normal(ks[3], shape),
            jax.random.normal(ks[3], shape), jax.random.key(5))
    compiled, _ = compile_(p, ppo.make_update_step(c, network, tx, policy=pc.GAUSSIAN), *args)
    t_upd = time_fn(compiled, *args, repeats=repeats)
    return t_pol.median_s, t_upd, compiled


def speed_config(p, env_name: str, size: str, recipe: str) -> pc.ContinuousPPOConfig:
    """A speed cell's PPO configuration: the speed part's ``num_envs``, ``updates`` updates."""
    q = p["speed"]
    c = config(p, env_name, "speed", size, recipe, num_envs=int(q["num_envs"]))
    return dataclasses.replace(c, total_timesteps=c.batch_size * int(q["updates"]))


def speed_records(p, env_name: str, size: str, recipe: str, profile: str,
                  c: pc.ContinuousPPOConfig, compile_s: float, t: Timing, policy_s: float,
                  t_upd: Timing, upd, more: Mapping[str, Any] | None = None):
    """A speed cell's records of one recipe: ``t`` the whole loop's timing, ``policy_s`` the
    policy part's median seconds, ``t_upd`` the update's timing and ``upd`` its compiled
    program (its facts: FP8 lowering, memory); ``more``: further ``extra`` keys."""
    emulated, facts = _emulated(recipe, upd)
    steps = c.num_updates * c.batch_size
    sizes = {"env": env_name, "size": size, "num_envs": c.num_envs, "num_steps": c.num_steps,
             "updates": c.num_updates, "policy_sizes": list(c.policy_sizes),
             "value_sizes": list(c.value_sizes), "width": max(c.policy_sizes + c.value_sizes)}
    extra = {"compile_s": compile_s, "samples_s": list(t.samples),
             "fp8_lowering": facts["fp8_lowering"], "fp8_gemm_calls": facts["fp8_gemm_calls"],
             "update_memory_bytes": facts["memory_bytes"],
             "update_samples_ms": [x * 1e3 for x in t_upd.samples],
             "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
             **dict(more or {})}
    common = dict(claims=list(CLAIMS), recipe=recipe, sizes=sizes, repeats=len(t.samples),
                  emulated=emulated, profile=profile, extra=extra)
    rate = steps / np.asarray(t.samples)
    q1, q3 = np.percentile(rate, [25, 75])
    per_update = {"loop_ms_per_update": t.median_s / c.num_updates * 1e3,
                  "policy_ms_per_update": policy_s * 1e3, "update_ms": t_upd.median_s * 1e3}
    return ([results.make_record(EXPERIMENT, "env_steps_per_s", steps / t.median_s, "steps/s",
                                 spread=float(q3 - q1), **common)]
            + [results.make_record(EXPERIMENT, m, v, "ms", **common)
               for m, v in per_update.items()])


def speed_cell(p, env_name: str, size: str, recipe: str, profile: str):
    repeats = int(p["speed"]["repeats"])
    c = speed_config(p, env_name, size, recipe)
    env = pc.make_env(c)
    key = jax.random.key(0)
    compiled, compile_s = compile_(p, pc.make_train(c, env), key)
    t = time_fn(compiled, key, repeats=repeats, warmup=1)
    policy_s, t_upd, upd = speed_parts(p, c, env, repeats)
    return speed_records(p, env_name, size, recipe, profile, c, compile_s, t, policy_s, t_upd,
                         upd)


def speed_programs(p, c: pc.ContinuousPPOConfig, env: envs.Adapter):
    """:func:`speed_parts`' two programs compiled, not timed: ``(policy, its arguments,
    update, its arguments)`` (the same programs on the same arguments)."""
    network = pc.build_network(c, env.action_size)
    tx = ppo.make_optimizer(c)
    variables, opt_state = pc.init_state(c, network, env.obs_size, tx, jax.random.key(1))
    obs = jax.random.normal(jax.random.key(2), (c.num_envs, env.obs_size))
    act = pc.make_act(c, network)

    def policy(variables, obs, key):
        def body(key, _):
            key, k = jax.random.split(key)
            return key, act(variables, obs, k)
        return jax.lax.scan(body, key, None, c.num_steps)[1]

    pol_args = (variables, obs, jax.random.key(3))
    pol, _ = compile_(p, policy, *pol_args)
    shape = (c.num_steps, c.num_envs)
    ks = jax.random.split(jax.random.key(4), 4)
    traj = ppo.Transition(
        jax.random.normal(ks[0], shape + (env.obs_size,)),
        jax.random.normal(ks[1], shape + (env.action_size,)),
        jnp.zeros(shape), jax.random.normal(ks[2], shape), jnp.zeros(shape),
        jnp.zeros(shape, bool))
    args = (variables, opt_state, traj, jax.random.normal(ks[3], shape),
            jax.random.normal(ks[3], shape), jax.random.key(5))
    compiled, _ = compile_(p, ppo.make_update_step(c, network, tx, policy=pc.GAUSSIAN), *args)
    return pol, pol_args, compiled, args


def _timing(samples) -> Timing:
    """:class:`~repro.studies.timing.Timing` of samples (seconds), as ``time_fn`` gives it."""
    q1, med, q3 = quartiles(samples)
    return Timing(med, q3 - q1, tuple(float(x) for x in samples))


def paired_speed_cell(p, env_name: str, size: str, recipes: Sequence[str], profile: str):
    """Every recipe of ``recipes`` at one size: each one's whole loop and its two parts
    (:func:`speed_programs`) compiled first, then timed in ``repeats`` rounds
    (:func:`repro.studies.timing.time_rounds`; per round each recipe's whole loop, then each
    one's policy part, then each one's update): :func:`speed_cell`'s records per recipe, with
    the samples in round order (``policy_samples_ms`` too), ``timing: "paired"``, the recipes
    timed together (``paired_with``) and the cell's ``run_id``."""
    repeats, key, built = int(p["speed"]["repeats"]), jax.random.key(0), {}
    for r in recipes:
        c = speed_config(p, env_name, size, r)
        env = pc.make_env(c)
        loop, compile_s = compile_(p, pc.make_train(c, env), key)
        built[r] = (c, compile_s, loop, *speed_programs(p, c, env))
    calls = {f"{r}/loop": functools.partial(b[2], key) for r, b in built.items()}
    calls.update({f"{r}/policy": functools.partial(b[3], *b[4]) for r, b in built.items()})
    calls.update({f"{r}/update": functools.partial(b[5], *b[6]) for r, b in built.items()})
    samples = time_rounds(calls, repeats)
    more = {"timing": "paired", "run_id": uuid.uuid4().hex[:12], "paired_with": list(recipes)}
    recs = []
    for r, (c, compile_s, _, _, _, upd, _) in built.items():
        pol = _timing(samples[f"{r}/policy"])
        recs += speed_records(p, env_name, size, r, profile, c, compile_s,
                              _timing(samples[f"{r}/loop"]), pol.median_s,
                              _timing(samples[f"{r}/update"]), upd,
                              {**more, "policy_samples_ms": [x * 1e3 for x in pol.samples]})
    return recs


def quality_cell(p, env_name: str, size: str, recipe: str, profile: str,
                 critic: str | None = None, first_seed: int = 0):
    from repro.studies.measures import _curve

    q = p["quality"]
    c = config(p, env_name, "quality", size, recipe,
               **({} if critic is None else {"critic_recipe": critic}))
    variant = recipe if critic is None else f"{recipe}+critic-{critic}"
    seeds = list(range(first_seed, first_seed + int(q["seeds"])))
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    t0 = time.perf_counter()
    if q.get("vmap_seeds", True):  # all seeds in one program
        train, compile_s = compile_(p, jax.vmap(pc.make_train(c)), keys)
        m = jax.device_get(train(keys))
    else:  # one seed's program, run per seed (a CPU smoke compiles half as much)
        train, compile_s = compile_(p, pc.make_train(c), keys[0])
        runs = [jax.device_get(train(k)) for k in keys]
        m = {k: np.stack([r[k] for r in runs]) for k in runs[0]}
    m = {k: np.asarray(v) for k, v in m.items()}
    wall = time.perf_counter() - t0
    last = float(p.get("last_fraction", 0.1))
    final = ppo.final_return(m, last)
    r = c.resolved_recipe
    sizes = {"env": env_name, "size": size, "variant": variant, "num_envs": c.num_envs,
             "total_timesteps": c.total_timesteps, "seeds": len(seeds),
             "width": max(c.policy_sizes + c.value_sizes)}
    from repro.precision import ops

    return [results.make_record(
        EXPERIMENT, "final_return", final[i], "return", claims=list(CLAIMS), recipe=r.family,
        sizes={**sizes, "seed": s}, emulated=bool(ops.is_emulated(r)), profile=profile,
        extra={"variant": variant, "curve": _curve(m["episode_return"][i]),
               "diverged": bool(m["nonfinite_params"][i, -1]),
               "skipped_steps": int(m["skipped"][i, -1]), "last_fraction": last,
               "wall_s_all_seeds_with_compile": wall, "compile_s": compile_s,
               "physics_precision": c.physics_precision or
               "jax default"}) for i, s in enumerate(seeds)]


def run_ours(c: pc.ContinuousPPOConfig, seed: int, eval_envs: int):
    """Our PPO on ``c``, one seed: (env-steps/s of a run after compiling, eval return)."""
    env = pc.make_env(c)
    train = pc.make_train(c, env, final_state=True)
    run = jax.jit(train).lower(jax.random.key(seed)).compile()
    t0 = time.perf_counter()
    _, (variables, stats) = jax.block_until_ready(run(jax.random.key(seed)))
    rate = c.num_updates * c.batch_size / (time.perf_counter() - t0)
    evaluate = jax.jit(pc.make_evaluate(c, env, train.network, eval_envs))
    return rate, float(np.mean(evaluate(variables, stats, jax.random.key(seed + 1))))


def peer_cell(p, env_name: str, profile: str):
    q = p["peer"]
    c = config(p, env_name, "peer", q.get("size", "brax"), q.get("recipe", "tf32"))
    seeds, evals, eval_envs = list(q.get("seeds", [0])), int(q.get("evals", 5)), int(
        q.get("eval_envs", 128))
    recs = []
    for seed in seeds:
        brax_rates, brax_ret = brax_peer.run(c, seed, evals, eval_envs)
        ours_rate, ours_ret = run_ours(c, seed, eval_envs)
        sizes = {"env": env_name, "num_envs": c.num_envs, "num_steps": c.num_steps,
                 "total_timesteps": c.total_timesteps, "seed": seed,
                 "policy_sizes": list(c.policy_sizes), "value_sizes": list(c.value_sizes)}
        for impl, rate, ret, extra in (
                ("brax", float(np.median(brax_rates)), brax_ret,
                 {"epoch_rates": brax_rates, "trainer": "brax.training.agents.ppo.train"}),
                ("repro", ours_rate, ours_ret, {"recipe": c.recipe})):
            common = dict(claims=list(CLAIMS), recipe=c.recipe, profile=profile,
                          sizes={**sizes, "impl": impl}, extra={**extra, "eval_envs": eval_envs})
            recs += [results.make_record(EXPERIMENT, "env_steps_per_s", rate, "steps/s",
                                         **common),
                     results.make_record(EXPERIMENT, "eval_return", ret, "return", **common)]
    return recs
