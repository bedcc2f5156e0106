from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro import config, results
from repro.models import ppo
from repro.precision.recipes import resolve
from repro.studies.rl_throughput import CellsFailed, _cell_failed, _device_peak_bytes, _select

QUALITY = "rl_quality"


def random_return(env_name: str, num_envs: int = 64, num_steps: int = 2000,
                  seed: int = 0) -> float:
    """Mean return of the episodes a uniform random policy completes (normalisation floor)."""
    env, env_params = ppo.make_env(env_name)
    n_act = env.action_space(env_params).n

    @jax.jit
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

    tot, n = jax.device_get(run(jax.random.key(seed)))
    return float(tot / n) if n > 0 else float("nan")


def quality_config(env_name: str, variant: str, p: Mapping[str, Any]) -> ppo.PPOConfig:
    envs = p["envs"]
    return ppo.validate({**dict(p.get("ppo", {})), **dict(envs[env_name] or {}),
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


def _curve(x: np.ndarray, points: int = 100) -> list[float | None]:
    """A learning curve thinned to at most ``points`` (means over equal chunks)."""
    chunks = np.array_split(np.asarray(x, np.float64), min(points, len(x)))
    with np.errstate(all="ignore"):
        return [None if not np.isfinite(v) else float(v)
                for v in (np.nanmean(ch) if np.isfinite(ch).any() else np.nan for ch in chunks)]


def quality_cell(env_name: str, variant: str, p: Mapping[str, Any],
                 profile: str) -> list[dict[str, Any]]:
    c = quality_config(env_name, variant, p)
    seeds = list(range(int(p["seeds"])))
    t0 = time.perf_counter()
    m = run_seeds(c, seeds)
    wall = time.perf_counter() - t0
    peak = _device_peak_bytes()
    final = ppo.final_return(m, float(p.get("last_fraction", 0.1)))
    from repro.precision import ops

    emulated = bool(ops.is_emulated(resolve(c.recipe)))
    sizes = {"env": env_name, "variant": variant, "network": c.network, "width": c.width,
             "total_timesteps": c.total_timesteps, "num_envs": c.num_envs,
             "seeds": len(seeds)}
    r = resolve(variant)
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
                   "last_fraction": float(p.get("last_fraction", 0.1)),
                   "wall_s_all_seeds": wall,
                   # all seeds of the cell train together: the process's device peak so far
                   # (an upper bound for this cell; None where the backend has no stats)
                   "peak_device_bytes": peak}))
    return recs


def determinism_cell(env_name: str, variant: str, p: Mapping[str, Any],
                     profile: str) -> list[dict[str, Any]]:
    """Run ``variant`` twice on seeds (0, 1, 0): A10's "same seed, same result"."""
    run = seeds_runner(quality_config(env_name, variant, p))
    c = quality_config(env_name, variant, p)
    a = run([0, 1, 0])["episode_return"]
    b = run([0, 1, 0])["episode_return"]
    same = bool(np.array_equal(a, b, equal_nan=True)
                and np.array_equal(a[0], a[2], equal_nan=True))
    differ = not np.array_equal(a[0], a[1], equal_nan=True)
    common = dict(claims=["A10"], recipe=resolve(c.recipe).family, profile=profile,
                  sizes={"env": env_name, "variant": variant,
                         "total_timesteps": c.total_timesteps},
                  extra={"variant": variant, "compared": "per-update mean returns, bitwise",
                         "runs": "two jitted calls on seeds (0, 1, 0)"})
    return [results.make_record(QUALITY, "same_seed_identical", float(same), "bool", **common),
            results.make_record(QUALITY, "different_seeds_differ", float(differ), "bool",
                                **common)]


def quality_cells(p: Mapping[str, Any], variants: Sequence[str]) -> list[tuple]:
    cells = []
    det = p.get("determinism_variant")
    for env_name in p["envs"]:
        cells.append((f"{env_name}_random", "random", env_name, None))
        for v in variants:
            cells.append((f"{env_name}_{v}", "variant", env_name, v))
        if det and det in variants:
            cells.append((f"{env_name}_determinism_{det}", "determinism", env_name, det))
    return cells


def record_quality(profile: str, root: str | Path | None = None, force: bool = False,
                   recipes: Sequence[str] | None = None,
                   only: Sequence[str] | None = None) -> list[Path]:
    """Run the ``rl_quality`` study of ``params.yaml`` for ``profile``; returns paths.

    ``recipes`` restricts the run to the variants built on those recipes; ``only`` (globs on
    cell names such as ``"CartPole-v1_*"`` or ``"*_fp8-e2e*"``) to some cells.
    """
    from tqdm import tqdm

    p = config.stage_params(QUALITY, profile)
    profile = p["profile"]
    variants = list(p["variants"])
    for v in variants:
        resolve(v)  # one-line error for an unknown variant
    for r in recipes or []:
        resolve(r)
    if recipes is not None:
        variants = [v for v in variants if resolve(v).family in recipes]
    for env_name in p["envs"]:
        for v in variants:
            quality_config(env_name, v, p)  # validate every cell before the first run
    root = Path(root) if root is not None else results.record_root(profile)
    written = []
    cells, failures = _select(quality_cells(p, variants), only), []
    for cell, kind, env_name, v in (bar := tqdm(cells, desc=f"{QUALITY} [{profile}]",
                                                unit="cell")):
        if not force and results.have_cell(QUALITY, cell, root=root):
            continue
        bar.set_postfix_str(cell)
        try:
            if kind == "random":
                recs = [results.make_record(
                    QUALITY, "random_return", random_return(env_name), "return", claims=["A10"],
                    sizes={"env": env_name, "variant": "random"}, profile=profile,
                    extra={"policy": "uniform random", "num_envs": 64, "num_steps": 2000})]
            elif kind == "determinism":
                recs = determinism_cell(env_name, v, p, profile)
            else:
                recs = quality_cell(env_name, v, p, profile)
        except Exception as e:  # noqa: BLE001 - logged, the study goes on, raised at the end
            _cell_failed(QUALITY, cell, e, failures)
            continue
        written.append(results.write_records(recs, QUALITY, cell, root=root))
    if failures:
        raise CellsFailed(QUALITY, failures)
    return written

QUALITY_REPEAT = "rl_quality_repeat"
