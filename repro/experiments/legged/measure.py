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
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from repro.experiments.legged.cells import (_emulated, _loop_timing, _timing, compile_,
                                            matmul_facts, paired_speed_cell, peer_cell,
                                            physics_cell, physics_rollout, quality_cell,
                                            random_cell, random_record, run_ours,
                                            speed_cell, speed_config, speed_parts,
                                            speed_programs, speed_records)
from repro.experiments.legged.schema import (CLAIMS, EXPERIMENT, PARTS, Schema, check,
                                             config, for_env, physics_runs,
                                             quality_variants)
from repro.models import envs, ppo
from repro.models import ppo_continuous as pc
from repro.studies import runner
from repro.studies.lowering import compiled_facts
from repro.studies.timing import Timing, time_fn, time_rounds

__all__ = [
    "CLAIMS", "EXPERIMENT", "PARTS", "STUDY", "Schema", "Timing", "cell_settings", "cells",
    "check", "compile_", "config", "envs", "for_env", "matmul_facts", "paired_speed_cell",
    "peer_cell", "physics_cell", "physics_rollout", "physics_runs", "program",
    "program_settings", "quality_cell", "quality_variants", "random_cell", "random_record",
    "run_ours", "speed_cell", "speed_config", "speed_parts", "speed_programs",
    "speed_records", "time_fn", "time_rounds", "_emulated", "_loop_timing", "_timing",
]


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
