"""RL training quality per precision variant (claims A5-A8, A10, C2).

    repro record rl_quality --profile full                       # every (env, variant) cell
    repro record rl_quality --profile full --recipe fp8-delayed  # the variants built on it

Per (env, variant): ``final_return`` per seed (mean return of the episodes completed over the
last ``last_fraction`` of updates; NaN if the parameters went non-finite), seeds under
``jax.vmap``; the learning curve and skip counts in ``extra``. Per env also ``random_return``
(uniform random policy, for normalisation) and a determinism check (``same_seed_identical``:
one variant run twice with the same seeds; ``different_seeds_differ``). Variants are entries of
the precision registry (``repro.precision``): a recipe plus optimizer/network flags, the
ablations of the FP8 recipe (no scaling, no Kahan, no gradient clipping, no weight clipping,
all layers FP8). Sizes come from ``params.yaml`` (section ``rl_quality``, :class:`Params`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro import results
from repro.config import Section, fraction, positive, recipe_names
from repro.experiments.rl_throughput.measure import _device_peak_bytes
from repro.models import ppo
from repro.precision.recipes import resolve
from repro.studies.measures import _curve
from repro.studies.runner import Cell, Study

QUALITY = "rl_quality"
QUALITY_REPEAT = "rl_quality_repeat"  # a repeat of recorded cells, compared bitwise (A10)


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``rl_quality`` section: ``ppo`` holds PPOConfig defaults, ``envs``
    per-env overrides of them; ``determinism_variant`` is run twice per env (A10)."""

    seeds: int = positive()
    envs: dict[str, dict[str, Any] | None]
    variants: tuple[str, ...] = recipe_names()
    ppo: dict[str, Any] | None = None
    last_fraction: float = fraction(0.1)
    determinism_variant: str | None = recipe_names(None)


def random_return(env_name: str, num_envs: int = 64, num_steps: int = 2000,
                  seed: int = 0) -> float:
    """Mean return of the episodes a uniform random policy completes (normalisation floor)."""
    run = jax.jit(random_rollout(env_name, num_envs, num_steps))
    tot, n = jax.device_get(run(jax.random.key(seed)))
    return float(tot / n) if n > 0 else float("nan")


def random_rollout(env_name: str, num_envs: int = 64, num_steps: int = 2000):
    """``run(key) -> (sum of the returns of the episodes completed, their count)``: a uniform
    random policy for ``num_steps`` steps of ``num_envs`` environments (:func:`random_return`)."""
    env, env_params = ppo.make_env(env_name)
    n_act = env.action_space(env_params).n

    def run(key):
        k0, key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(k0, num_envs), env_params)

        def step(carry, _):
            state, ep, key = carry
            key, ka, ks = jax.random.split(key, 3)
            a = jax.random.randint(ka, (num_envs,), 0, n_act)
            _, state, r, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(ks, num_envs), state, a, env_params)
            ep = ep + r
            done = term | trunc
            out = (jnp.sum(jnp.where(done, ep, 0.0)), jnp.sum(done))
            return (state, jnp.where(done, 0.0, ep), key), out

        _, (tot, n) = jax.lax.scan(step, (state, jnp.zeros(num_envs), key), None, num_steps)
        return tot.sum(), n.sum()

    return run


def quality_config(env_name: str, variant: str, p: Params) -> ppo.PPOConfig:
    return ppo.validate({**dict(p.ppo or {}), **dict(p.envs[env_name] or {}),
                         "env": env_name, "recipe": variant})


def seeds_runner(c: ppo.PPOConfig):
    """``run(seeds) -> metrics`` (numpy, [seeds, updates]): one jitted, vmapped PPO."""
    train = jax.jit(jax.vmap(ppo.make_train(c)))

    def run(seeds: Sequence[int]) -> dict[str, np.ndarray]:
        keys = jax.vmap(jax.random.key)(jnp.asarray(list(seeds), jnp.uint32))
        return {k: np.asarray(v) for k, v in jax.device_get(train(keys)).items()}

    return run


def run_seeds(c: ppo.PPOConfig, seeds: Sequence[int]) -> dict[str, np.ndarray]:
    return seeds_runner(c)(seeds)


def quality_cell(env_name: str, variant: str, p: Params) -> list[dict[str, Any]]:
    c = quality_config(env_name, variant, p)
    seeds, profile = list(range(p.seeds)), p.profile
    t0 = time.perf_counter()
    m = run_seeds(c, seeds)
    wall = time.perf_counter() - t0
    peak = _device_peak_bytes()
    final = ppo.final_return(m, p.last_fraction)
    from repro.precision import ops

    r = c.resolved_recipe  # the variant's Recipe
    emulated = bool(ops.is_emulated(r))
    sizes = {"env": env_name, "variant": variant, "network": c.network, "width": c.width,
             "total_timesteps": c.total_timesteps, "num_envs": c.num_envs,
             "seeds": len(seeds)}
    cfg = {"recipe": r.family, "master_weights": r.master_weights, "kahan": r.kahan,
           "grad_clip": r.grad_clip, "weight_clip": r.weight_clip, "scope": r.scope}
    recs = []
    for i, s in enumerate(seeds):
        recs.append(results.make_record(
            QUALITY, "final_return", final[i], "return", claims=list(r.claims),
            recipe=r.family, sizes={**sizes, "seed": s}, emulated=emulated, profile=profile,
            extra={"variant": variant, "variant_config": cfg,
                   "curve": _curve(m["episode_return"][i]),
                   "skipped_steps": int(m["skipped"][i, -1]),
                   "final_loss_scale": float(m["loss_scale"][i, -1]),
                   "diverged": bool(m["nonfinite_params"][i, -1]),
                   "last_fraction": p.last_fraction,
                   "wall_s_all_seeds": wall,
                   # all seeds of the cell train together: the process's device peak so far
                   # (an upper bound for this cell; None where the backend has no stats)
                   "peak_device_bytes": peak}))
    return recs


def determinism_cell(env_name: str, variant: str, p: Params) -> list[dict[str, Any]]:
    """Run ``variant`` twice on seeds (0, 1, 0): A10's "same seed, same result"."""
    run = seeds_runner(quality_config(env_name, variant, p))
    c = quality_config(env_name, variant, p)
    a = run([0, 1, 0])["episode_return"]
    b = run([0, 1, 0])["episode_return"]
    same = bool(np.array_equal(a, b, equal_nan=True)
                and np.array_equal(a[0], a[2], equal_nan=True))
    differ = not np.array_equal(a[0], a[1], equal_nan=True)
    common = dict(claims=["A10"], recipe=resolve(c.recipe).family, profile=p.profile,
                  sizes={"env": env_name, "variant": variant,
                         "total_timesteps": c.total_timesteps},
                  extra={"variant": variant, "compared": "per-update mean returns, bitwise",
                         "runs": "two jitted calls on seeds (0, 1, 0)"})
    return [results.make_record(QUALITY, "same_seed_identical", float(same), "bool", **common),
            results.make_record(QUALITY, "different_seeds_differ", float(differ), "bool",
                                **common)]


def random_cell(env_name: str, p: Params) -> list[dict[str, Any]]:
    """The return of a uniform random policy (the normalisation floor)."""
    return [results.make_record(
        QUALITY, "random_return", random_return(env_name), "return", claims=["A10"],
        sizes={"env": env_name, "variant": "random"}, profile=p.profile,
        extra={"policy": "uniform random", "num_envs": 64, "num_steps": 2000})]


def program(env: str, variant: str, seeds: int = 1, ppo_config: dict[str, Any] | None = None,
            determinism: bool = False, num_envs: int = 64, num_steps: int = 2000):
    """What a cell's records measure (:mod:`repro.program`), from the cell's settings alone.

    ``variant="random"``: the random policy's rollout of :func:`random_return` (``num_envs``,
    ``num_steps``). Otherwise the whole trained function of the cell: ``jax.vmap`` of
    ``ppo.make_train`` over ``seeds`` keys for the PPO config ``ppo_config`` (the section's
    ``ppo`` merged with the env's overrides) with ``env`` and ``recipe=variant``; its kit, the
    statistics of the records: the final return and curve, or with ``determinism`` (A10's
    cell: seeds (0, 1, 0), run twice) the comparison of the two runs."""
    from repro.program import Program

    key_of = lambda n: jax.eval_shape(  # noqa: E731
        lambda: jax.vmap(jax.random.key)(jnp.zeros((n,), jnp.uint32)))
    if variant == "random":
        return Program(random_rollout(env, num_envs, num_steps),
                       (jax.eval_shape(lambda: jax.random.key(0)),), kit=(random_return,))
    c = ppo.validate({**dict(ppo_config or {}), "env": env, "recipe": variant})
    kit = (seeds_runner, determinism_cell) if determinism else \
        (seeds_runner, run_seeds, ppo.final_return, _curve)
    return Program(jax.vmap(ppo.make_train(c)), (key_of(seeds),), kit=kit)


def _ppo_overrides(p: Params, env_name: str) -> dict[str, Any]:
    """The PPO settings of ``env_name``'s cells but env and recipe (:func:`quality_config`)."""
    return {**dict(p.ppo or {}), **dict(p.envs[env_name] or {})}


def program_settings(rec: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`program`'s settings for a record of this study (``rl_quality`` and the
    ``rl_quality_repeat`` copies of its cells; None: not derivable).

    A record holds its env, variant, seed count, network, width, num_envs and
    total_timesteps, not the rest of its PPO config (lr, num_steps, epochs, minibatches):
    those come from params.yaml's section for the record's profile, and only where everything
    the record holds agrees with it (params.yaml's rl_quality section has not changed since
    the committed records were made)."""
    from repro import studies

    sizes, extra = rec.get("sizes") or {}, rec.get("extra") or {}
    env, variant = sizes.get("env"), sizes.get("variant") or extra.get("variant")
    if not env or not variant:
        return None
    if rec.get("metric") == "random_return":
        return {"env": env, "variant": "random", "num_envs": int(extra.get("num_envs", 64)),
                "num_steps": int(extra.get("num_steps", 2000))}
    try:
        p = studies.params(QUALITY, rec.get("profile") or "full")
        if env not in p.envs:
            return None
        over = _ppo_overrides(p, env)
        c = ppo.validate({**over, "env": env, "recipe": variant})
    except (ValueError, KeyError, TypeError):
        return None
    determinism = rec.get("metric") in ("same_seed_identical", "different_seeds_differ")
    held = {"total_timesteps": c.total_timesteps}
    if not determinism:
        held.update(network=c.network, width=c.width, num_envs=c.num_envs)
    if any(k in sizes and sizes[k] != v for k, v in held.items()):
        return None  # made with other settings than params.yaml's now: not derivable
    seeds = 3 if determinism else sizes.get("seeds")
    if not isinstance(seeds, int):
        return None
    return {"env": env, "variant": variant, "seeds": seeds, "ppo_config": over,
            "determinism": determinism}


def check(p: Params) -> None:
    for env_name in p.envs:
        for v in p.variants:
            try:  # every cell's PPO config, before the first run
                quality_config(env_name, v, p)
            except ValueError as e:
                raise ValueError(f"rl_quality: the PPO config of ppo and envs.{env_name} "
                                 f"(variant {v}): {e}") from None


def cells(p: Params) -> list[Cell]:
    """Per env: the random policy, each variant, then the determinism check. ``--recipe R``
    keeps the variants named R or built on R."""
    out, det = [], p.determinism_variant

    def tags(v):
        return tuple(dict.fromkeys([v, resolve(v).family]))

    def programs(env_name, variant, **kw):
        return lambda: {"": program(env_name, variant, ppo_config=_ppo_overrides(p, env_name),
                                    **kw)}

    for env_name in p.envs:
        out.append(Cell(f"{env_name}_random", lambda _b, e=env_name: random_cell(e, p),
                        programs=lambda e=env_name: {"": program(e, "random")}))
        out += [Cell(f"{env_name}_{v}", lambda _b, e=env_name, v=v: quality_cell(e, v, p),
                     tags(v), programs=programs(env_name, v, seeds=p.seeds))
                for v in p.variants]
        if det and det in p.variants:
            out.append(Cell(f"{env_name}_determinism_{det}",
                            lambda _b, e=env_name: determinism_cell(e, det, p), tags(det),
                            programs=programs(env_name, det, seeds=3, determinism=True)))
    return out


STUDY = Study(QUALITY, ("A5", "A6", "A7", "A8", "A10", "C2"), cells, check,
              about="PPO returns per precision variant", params=Params)
