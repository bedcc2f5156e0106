"""Legged-robot PPO on MuJoCo MJX physics (claim A11): physics speed, FP8 speed, FP8 quality.

    repro record legged --profile full                     # every cell, resumable
    repro record legged --profile full --only 'ant_physics*' 'ant_speed_*'

One :class:`~repro.studies.runner.Study`; per environment of ``params.yaml``'s ``legged``
section, cells in this order (so a run cut short still holds what a verdict needs first). An
environment's entry may give any part its own settings, merged over the section's (``Go1...:
{quality: {sizes: [playground]}, peer: null}``: Go1 at Playground's size, no brax peer); its
other keys are PPO overrides (:func:`for_env`):

* ``{env}_physics_e{N}_{precision}`` -- the physics alone (uniform random actions, no
  network): ``physics_env_steps_per_s`` of a jitted ``lax.scan`` of steps (as training runs
  them; the reset is inside the timed program); at the sizes of ``loop_at`` also
  ``loop_env_steps_per_s`` of brax's raw step as ``jax.jit(jax.vmap(step))`` called from
  Python, after two timed calls (``first_call_s``, ``second_call_s``: brax's reset state and
  step state differ in weak types, so the second call compiles again, and a loop timed after
  one warm-up call divides a compilation by its number of steps). ``extra``: the physics'
  matmul precision (the setting, JAX's global default, and the precisions of the lowered
  step's products). Where ``steps`` covers a whole episode and there is no ``random`` cell,
  also ``random_return``.
* ``{env}_random`` -- ``random_return``: a uniform random policy's episode return (the floor of
  the normalised scores).
* ``{env}_speed_{size}_{recipe}`` -- one seed, the whole PPO loop: ``env_steps_per_s``; and its
  parts timed as separate programs: ``policy_ms_per_update`` (the rollout's network work:
  ``num_steps`` policy steps on a fixed batch), ``update_ms`` (the PPO update on a rollout-shaped
  batch) and ``loop_ms_per_update``; the physics' share comes from the physics cell at the same
  number of environments. FP8 lowering facts mark an FP8 recipe that ran no FP8 GEMM as
  emulated.
* ``{env}_speed_{size}_paired`` -- with the speed part's ``paired``, before the separate cells:
  every recipe of the part at that size, its whole loop and both parts compiled first, then
  timed in ``repeats`` rounds (``repro.studies.timing.time_rounds``: per round each recipe's
  whole loop, then each one's policy part, then each one's update). The same metrics per
  recipe, with the samples in round order, one ``run_id`` and ``timing: "paired"``, so a
  ratio of two recipes is the median of per-round ratios with its range
  (``repro.experiments.legged.tables.paired_speedups``), not a ratio of medians of separate
  cells.
* ``{env}_quality_{size}_{recipe}`` -- ``final_return`` per seed (mean return of the episodes
  completed over the last ``last_fraction`` of updates), seeds under ``jax.vmap`` (or one after
  the other with ``vmap_seeds: false``); ``extra`` has the cell's wall time and, within it,
  its compile time (``compile_s``). With ``critic_recipes``, also
  ``{env}_quality_{size}_{recipe}_critic-{critic}`` for each other recipe: the same policy
  recipe with the critic tower under ``critic`` (variant ``{recipe}+critic-{critic}``). With
  ``more_seeds`` (variant -> seeds in all, a multiple of ``seeds``), that variant's further
  seeds in cells of ``seeds`` each, named by their first seed (``..._s32`` holds seeds 32-63),
  after every environment's first cells: the analysis pools a variant's seeds over its cells,
  so a long variant is recorded over several calls.

``compiler_options`` (the smoke profile's) go to every compilation; records say which matmul
precision the physics used.
* ``{env}_peer_brax`` -- brax's own PPO trainer (``brax.training.agents.ppo``) and ours
  (recipe ``tf32``: float32 weights, products at JAX's default precision, as brax's flax layers
  run them) at equal settings in this process: ``env_steps_per_s`` (brax: its per-epoch rate
  after the two epochs that compile; ours: a run after compiling) and ``eval_return`` (brax's
  evaluator: one episode per environment, stochastic policy; ours: the same with
  :func:`repro.models.ppo_continuous.make_evaluate`).

brax 0.14.2's trainer calls ``jax.device_put_replicated``, which JAX has removed;
:mod:`repro.models.brax_peer` puts a stand-in on the ``jax`` module for the duration of the call.
"""

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
from repro.config import Section, check_mapping, fraction, positive
from repro.config import recipe_names as recipe_field
from repro.models import brax_peer, envs, ppo
from repro.models import ppo_continuous as pc
from repro.precision.recipes import resolve
from repro.studies import runner
from repro.studies.lowering import compiled_facts, recipe_emulated
from repro.studies.timing import Timing, quartiles, time_fn, time_rounds

EXPERIMENT = "legged"
CLAIMS = ("A11",)


PARTS = ("physics", "random", "speed", "quality", "peer")


def for_env(p: Mapping[str, Any], env: str) -> dict[str, Any]:
    """The section as environment ``env`` runs it. In ``envs.<env>``, a key naming a part
    (:data:`PARTS`) is merged over the section's part (null drops the part for this env);
    the other keys are PPO overrides, applied over the section's ``ppo``."""
    own = dict(p["envs"][env] or {})
    out = dict(p)
    for part in PARTS:
        if part in own:
            out[part] = (None if own[part] is None
                         else {**dict(p.get(part) or {}), **dict(own[part])})
    out["ppo"] = {**dict(p.get("ppo") or {}),
                  **{k: v for k, v in own.items() if k not in PARTS}}
    return out


def config(p: Mapping[str, Any], env: str, part: str, size: str | None = None,
           recipe: str = "fp32", **over) -> pc.ContinuousPPOConfig:
    """The PPO configuration of a cell: ``ppo`` of the section, then the env's overrides,
    the part's (``speed``, ``quality``, ``peer``) ``ppo``, the size's layer widths, ``over``."""
    p = for_env(p, env)
    part_p = p.get(part) or {}
    sizes = p["sizes"][size] if size is not None else {}
    return pc.validate({**p["ppo"], **dict(part_p.get("ppo") or {}), **dict(sizes),
                        "env": env, "recipe": recipe, **over})


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
    return bool(recipe_emulated(resolve(recipe), facts["fp8_lowering"])), facts


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
    r = resolve(recipe)
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


# ----------------------------------------------------------------------------- programs


def program(kind: str, config: Mapping[str, Any], num_envs: int = 0, steps: int = 0,
            seeds: int = 1, vmap_seeds: bool = True, eval_envs: int = 128,
            paired: bool = False):
    """What a cell's records measure (:mod:`repro.program`), from the cell's settings alone,
    WITHOUT the physics: importing brax and MJX, building an environment and tracing its step
    takes tens of seconds on a CPU, so the environment is a stand-in with the real one's
    observation and action sizes, time limit and physics precision (the MJX physics, brax's
    wrappers and :class:`repro.models.envs.Adapter` are not traced; the adapter's code and
    the environment builders are in the kit, so an edit to them stales the records).

    ``kind`` and what it traces (``config``: the cell's ContinuousPPOConfig as a mapping):
    ``physics``: :func:`physics_rollout` (``num_envs``, ``steps``); ``random``: the same
    over one episode; ``speed``: the whole PPO loop (``pc.make_train``), the policy's rollout
    work and the PPO update of :func:`speed_parts`, together (``paired``: the same, timed in
    rounds beside other recipes by :func:`paired_speed_cell`, its kit); ``quality``: the trained
    function over ``seeds`` keys (``jax.vmap`` unless ``vmap_seeds`` is false); ``peer``:
    our training run and its evaluation (:func:`run_ours`; brax's trainer is not traced, its
    adapter :mod:`repro.models.brax_peer` is in the kit)."""
    from repro.models import brax_peer as bp
    from repro.models import envs as envs_
    from repro.program import Program

    c = pc.validate(dict(config))
    known = {"ant": (27, 8), "Go1JoystickFlatTerrain": (48, 12)}  # envs.make's sizes

    class Physics:
        """A stand-in for :class:`repro.models.envs.Adapter` (its interface, no physics)."""

        def __init__(self):
            if c.env in known:
                self.obs_size, self.action_size = known[c.env]
            else:  # slow (brax / MJX), but right
                real = pc.make_env(c)
                self.obs_size, self.action_size = real.obs_size, real.action_size

        def reset(self, key, n):
            envs_.check(c.env, c.backend, c.physics_precision)  # envs.py: a file of the trace
            obs = jax.random.normal(key, (n, self.obs_size), jnp.float32)
            return obs, (obs, jnp.zeros((n,), jnp.int32))

        def step(self, state, action):
            obs, t = state
            with jax.named_scope(envs_.PHYSICS_SCOPE):
                push = jnp.matmul(action, jnp.ones((self.action_size, self.obs_size)),
                                  precision=c.physics_precision)
                nxt = jnp.tanh(obs + push / self.action_size)
            t = t + c.action_repeat
            trunc = t >= c.episode_length
            term = jnp.zeros_like(trunc)
            first = jnp.where(trunc[:, None], obs, nxt)
            return (first, (first, jnp.where(trunc, 0, t)), jnp.sum(action, -1), term, trunc,
                    nxt)

    env = Physics()
    env_kit = (envs_.Adapter, envs_.make, envs_.make_raw, envs_._strong,
               envs_.offline_menagerie, pc.make_env)
    key = jax.eval_shape(lambda: jax.random.key(0))
    if kind in ("physics", "random"):
        n, length = int(num_envs), int(steps) if kind == "physics" else c.episode_length
        kit = (time_fn, compile_, _loop_timing, matmul_facts, random_record) \
            if kind == "physics" else (compile_, random_record)
        return Program(physics_rollout(env, n, length), (key,), kit=kit + env_kit)
    if kind == "speed":
        network = pc.build_network(c, env.action_size)
        tx = ppo.make_optimizer(c)
        variables, opt_state = jax.eval_shape(
            lambda k: pc.init_state(c, network, env.obs_size, tx, k), key)
        act = pc.make_act(c, network)
        shape = (c.num_steps, c.num_envs)
        f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        obs = f32(c.num_envs, env.obs_size)
        traj = ppo.Transition(f32(*shape, env.obs_size), f32(*shape, env.action_size),
                              f32(*shape), f32(*shape), f32(*shape),
                              jax.ShapeDtypeStruct(shape, jnp.bool_))

        def measured(train_key, variables, obs, policy_key, opt_state, traj, adv, tgt,
                     update_key):
            loop = pc.make_train(c, env)(train_key)  # env_steps_per_s, loop_ms_per_update

            def body(k, _):  # speed_parts' policy: policy_ms_per_update
                k, sub = jax.random.split(k)
                return k, act(variables, obs, sub)
            policy = jax.lax.scan(body, policy_key, None, c.num_steps)[1]
            update = ppo.make_update_step(c, network, tx, policy=pc.GAUSSIAN)(
                variables, opt_state, traj, adv, tgt, update_key)  # update_ms
            return loop, policy, update

        kit = (time_rounds, compile_, speed_programs, paired_speed_cell, compiled_facts) \
            if paired else (time_fn, compile_, speed_parts, compiled_facts)
        return Program(measured, (key, variables, obs, key, opt_state, traj, f32(*shape),
                                  f32(*shape), key), kit=kit + env_kit)
    if kind == "quality":
        from repro.studies.measures import _curve

        train = pc.make_train(c, env)
        kit = (compile_, ppo.final_return, _curve) + env_kit
        if vmap_seeds:
            keys = jax.eval_shape(lambda: jax.vmap(jax.random.key)(
                jnp.zeros((int(seeds),), jnp.uint32)))
            return Program(jax.vmap(train), (keys,), kit=kit)
        return Program(train, (key,), kit=kit)
    if kind == "peer":
        train = pc.make_train(c, env, final_state=True)
        evaluate = pc.make_evaluate(c, env, train.network, int(eval_envs))

        def ours(k):
            metrics, (variables, stats) = train(k)
            return metrics, evaluate(variables, stats, k)

        return Program(ours, (key,), kit=(run_ours, bp.run, bp.brax_kwargs, bp._clipped,
                                          bp._replicated_standin) + env_kit)
    raise ValueError(f"legged: unknown program kind {kind!r}")


def cell_settings(p: Mapping[str, Any], env_name: str, part: str, size: str | None = None,
                  recipe: str = "fp32", critic: str | None = None, num_envs: int = 0,
                  precision: str = "default") -> dict[str, Any]:
    """:func:`program`'s settings for the cell of ``part`` (physics, random, speed, quality,
    peer) of ``env_name`` as ``p`` (the section) runs it."""
    pe = for_env(p, env_name)
    q = pe.get(part) or {}
    if part == "physics":
        c = config(pe, env_name, "physics",
                   physics_precision=None if precision == "default" else precision)
        return {"kind": "physics", "config": dataclasses.asdict(c), "num_envs": int(num_envs),
                "steps": int(q["steps"])}
    if part == "random":
        c = config(pe, env_name, "quality")
        return {"kind": "random", "config": dataclasses.asdict(c),
                "num_envs": int(q.get("num_envs", 64))}
    if part == "speed":
        c = config(pe, env_name, "speed", size, recipe, num_envs=int(q["num_envs"]))
        c = dataclasses.replace(c, total_timesteps=c.batch_size * int(q["updates"]))
        return {"kind": "speed", "config": dataclasses.asdict(c)}
    if part == "quality":
        c = config(pe, env_name, "quality", size, recipe,
                   **({} if critic is None else {"critic_recipe": critic}))
        return {"kind": "quality", "config": dataclasses.asdict(c), "seeds": int(q["seeds"]),
                "vmap_seeds": bool(q.get("vmap_seeds", True))}
    if part == "peer":
        c = config(pe, env_name, "peer", q.get("size", "brax"), q.get("recipe", "tf32"))
        return {"kind": "peer", "config": dataclasses.asdict(c),
                "eval_envs": int(q.get("eval_envs", 128))}
    raise ValueError(f"legged: unknown part {part!r}")


def program_settings(rec: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`program`'s settings for a record of this study (None: not derivable).

    A record holds its env, part-specific sizes (envs, steps, updates, seeds, layer sizes or
    size name, total steps) and recipe or variant, not the rest of its PPO config (learning
    rate, epochs, minibatches, the env's overrides): those come from params.yaml's section
    for the record's profile, and the record's own values replace params.yaml's where it
    holds them (a cell recorded at other settings gets another program: stale)."""
    from repro import studies

    sizes, extra = rec.get("sizes") or {}, rec.get("extra") or {}
    env_name, metric = sizes.get("env"), rec.get("metric")
    cell = (rec.get("program") or {}).get("cell") if isinstance(rec.get("program"),
                                                                   dict) else None
    try:
        p = studies.params(EXPERIMENT, rec.get("profile") or "full")
        if env_name not in p["envs"]:
            return None
        if metric in ("physics_env_steps_per_s", "loop_env_steps_per_s", "first_call_s",
                      "second_call_s"):
            st = cell_settings(p, env_name, "physics", num_envs=int(sizes["num_envs"]),
                               precision=sizes["precision"])
            st["config"]["backend"] = sizes.get("backend", st["config"]["backend"])
            st["steps"] = int(sizes["steps"])
            return st
        if metric == "random_return":
            if cell is not None and not cell.endswith("_random"):
                return None  # a physics cell's random floor: its steps are not recorded
            st = cell_settings(p, env_name, "random")
            st["num_envs"] = int(extra.get("num_envs", st["num_envs"]))
            if int(extra.get("episode_length", -1)) != st["config"]["episode_length"]:
                return None
            return st
        if "impl" in sizes:  # the peer cell
            st = cell_settings(p, env_name, "peer")
            for k in ("num_envs", "num_steps", "total_timesteps"):
                st["config"][k] = int(sizes[k])
            for k in ("policy_sizes", "value_sizes"):
                st["config"][k] = tuple(int(w) for w in sizes[k])
            st["config"]["recipe"] = rec.get("recipe") or st["config"]["recipe"]
            st["eval_envs"] = int(extra.get("eval_envs", st["eval_envs"]))
            return st
        if metric in ("env_steps_per_s", "loop_ms_per_update", "policy_ms_per_update",
                      "update_ms"):
            st = cell_settings(p, env_name, "speed", sizes["size"], rec["recipe"])
            cfg = st["config"]
            cfg.update(num_envs=int(sizes["num_envs"]), num_steps=int(sizes["num_steps"]),
                       policy_sizes=tuple(int(w) for w in sizes["policy_sizes"]),
                       value_sizes=tuple(int(w) for w in sizes["value_sizes"]))
            cfg["total_timesteps"] = cfg["num_envs"] * cfg["num_steps"] * int(sizes["updates"])
            if extra.get("timing") == "paired":  # a paired cell's record: its kit
                st["paired"] = True
            return st
        if metric == "final_return":
            variant = sizes.get("variant") or extra["variant"]
            recipe, _, critic = variant.partition("+critic-")
            st = cell_settings(p, env_name, "quality", sizes["size"], recipe, critic or None)
            cfg = st["config"]
            cfg.update(num_envs=int(sizes["num_envs"]),
                       total_timesteps=int(sizes["total_timesteps"]))
            if max(tuple(cfg["policy_sizes"]) + tuple(cfg["value_sizes"])) != \
                    int(sizes["width"]):
                return None
            st["seeds"] = int(sizes["seeds"])
            return st
    except (KeyError, TypeError, ValueError):
        return None
    return None


# ------------------------------------------------------------------------------ the study


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Physics:
    num_envs: tuple[int, ...] = positive()
    precisions: tuple[str, ...]
    steps: int = positive()
    repeats: int = positive()
    loop_at: tuple[int, ...] = ()
    precision_at: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Speed:
    num_envs: int = positive()
    updates: int = positive()
    repeats: int = positive()
    sizes: tuple[str, ...] = ()
    recipes: tuple[str, ...] = recipe_field(())
    paired: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Quality:
    seeds: int = positive()
    vmap_seeds: bool = True
    sizes: tuple[str, ...] = ()
    recipes: tuple[str, ...] = recipe_field(())
    critic_recipes: tuple[str, ...] = recipe_field(())
    more_seeds: dict[str, int] = dataclasses.field(default_factory=dict)
    ppo: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Random:
    num_envs: int = positive(64)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Peer:
    size: str = "brax"
    recipe: str = "tf32"
    seeds: tuple[int, ...] = (0,)
    evals: int = positive(5)
    eval_envs: int = positive(128)
    ppo: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schema(Section):
    """What ``params.yaml``'s ``legged`` section may hold (the study reads it as a mapping;
    the PPO overrides are checked by :func:`check` through the PPO config)."""

    envs: dict[str, dict[str, Any] | None]
    sizes: dict[str, dict[str, tuple[int, ...]]] = positive()
    ppo: dict[str, Any] = dataclasses.field(default_factory=dict)
    physics: _Physics
    speed: _Speed | None = None
    quality: _Quality | None = None
    random: _Random | None = None
    peer: _Peer | None = None
    last_fraction: float = fraction(0.1)
    compiler_options: dict[str, Any] | None = None


def check(p: Mapping[str, Any]) -> None:
    """Every cell's configuration, before the first cell runs (one-line ValueError)."""
    where = f"params.yaml: legged.{p.get('profile')}"
    check_mapping(dict(p), Schema, where)
    def checked(env_name, part, *args):
        try:
            config(p, env_name, part, *args)
        except ValueError as e:  # the PPO config of a cell: name where its keys come from
            raise ValueError(f"{where}: the PPO config of env {env_name}, part {part} (keys of "
                             f"ppo, envs.{env_name} and {part}.ppo): {e}") from None

    for env_name in p["envs"]:
        pe = for_env(p, env_name)
        check_mapping(pe, Schema, f"{where}.envs.{env_name}")
        checked(env_name, "physics")
        for part in ("speed", "quality"):
            for size in (pe.get(part) or {}).get("sizes", []):
                if size not in p["sizes"]:
                    raise ValueError(f"legged.{part}.sizes: unknown size {size!r}; valid: "
                                     f"{', '.join(p['sizes'])}")
                for recipe in pe[part]["recipes"]:
                    checked(env_name, part, size, recipe)
        q = pe.get("quality") or {}
        known = set(quality_variants(q))
        for v, n in dict(q.get("more_seeds") or {}).items():
            if v not in known:
                raise ValueError(f"legged.quality.more_seeds ({env_name}): unknown variant "
                                 f"{v!r}; valid: {', '.join(sorted(known))}")
            if int(n) % int(q["seeds"]) or int(n) < int(q["seeds"]):
                raise ValueError(f"legged.quality.more_seeds ({env_name}): {v}: {n} seeds is not "
                                 f"a multiple of quality.seeds ({q['seeds']})")
        if pe.get("peer"):
            checked(env_name, "peer", pe["peer"].get("size", "brax"),
                    pe["peer"].get("recipe", "tf32"))


def physics_runs(q: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(num_envs, precision) of the physics cells: every ``num_envs`` at the first precision,
    the others at the sizes of ``precision_at`` (default: all)."""
    first, *others = q["precisions"]
    at = q.get("precision_at", q["num_envs"])
    return ([(int(n), first) for n in q["num_envs"]]
            + [(int(n), prec) for prec in others for n in q["num_envs"] if n in at])


def quality_variants(q: Mapping[str, Any]) -> dict[str, tuple[str, str | None]]:
    """The quality part's variants in cell order: name -> (policy recipe, critic recipe or
    None): each recipe, then the same with each other recipe of ``critic_recipes`` as critic."""
    out = {}
    for r in q.get("recipes", []):
        out[r] = (r, None)
        for cr in q.get("critic_recipes", []):
            if cr != r:
                out[f"{r}+critic-{cr}"] = (r, cr)
    return out


def cells(p: Mapping[str, Any]) -> list[runner.Cell]:
    prof = p["profile"]
    out, later = [], []  # later: (first seed, cell) of the further seed blocks

    def cell(pe, name, fn, *args, recipes=(), settings=None, key="", **kw):
        programs = None if settings is None else (
            lambda: {key: program(**cell_settings(pe, *settings[0], **settings[1]))})
        return runner.Cell(name, lambda _budget: fn(pe, *args, prof, **kw), tuple(recipes),
                           programs=programs)

    for e in p["envs"]:
        pe = for_env(p, e)
        for n, prec in physics_runs(pe["physics"]):
            out.append(cell(pe, f"{e}_physics_e{n}_{prec}", physics_cell, e, n, prec,
                            settings=((e, "physics"), {"num_envs": n, "precision": prec})))
        if pe.get("random"):
            out.append(cell(pe, f"{e}_random", random_cell, e, settings=((e, "random"), {})))
        s = pe.get("speed") or {}
        if s.get("paired") and s.get("recipes"):  # first: the cells A11's speed is judged from
            rs = tuple(s["recipes"])
            for size in s.get("sizes", []):
                out.append(runner.Cell(
                    f"{e}_speed_{size}_paired",
                    lambda _budget, pe=pe, e=e, size=size, rs=rs: paired_speed_cell(
                        pe, e, size, rs, prof), rs,
                    programs=lambda pe=pe, e=e, size=size, rs=rs: {
                        r: program(**cell_settings(pe, e, "speed", size, r), paired=True)
                        for r in rs}))
        for size in s.get("sizes", []):
            for r in s.get("recipes", []):
                out.append(cell(pe, f"{e}_speed_{size}_{r}", speed_cell, e, size, r,
                                recipes=[r], settings=((e, "speed", size, r), {}), key=r))
        q = pe.get("quality") or {}
        more = {v: int(n) for v, n in dict(q.get("more_seeds") or {}).items()}
        for size in q.get("sizes", []):
            for v, (r, cr) in quality_variants(q).items():
                name = f"{e}_quality_{size}_{r}" + (f"_critic-{cr}" if cr else "")
                st = ((e, "quality", size, r, cr), {})
                out.append(cell(pe, name, quality_cell, e, size, r, recipes=[r], critic=cr,
                                settings=st))
                later += [(first, cell(pe, f"{name}_s{first}", quality_cell, e, size, r,
                                       recipes=[r], critic=cr, first_seed=first, settings=st))
                          for first in range(int(q["seeds"]), more.get(v, 0), int(q["seeds"]))]
        if pe.get("peer"):
            out.append(cell(pe, f"{e}_peer_brax", peer_cell, e,
                            recipes=[pe["peer"].get("recipe", "tf32")],
                            settings=((e, "peer"), {})))
    # after every environment's first cells, block by block: every variant's second block of
    # seeds before any third
    return out + [c for _, c in sorted(later, key=lambda fc: fc[0])]


STUDY = runner.Study(EXPERIMENT, CLAIMS, cells, check,
                     about="legged-robot PPO on MJX physics: physics speed, FP8 speed, quality")
