"""Both implementations as the ``rl_purejaxrl`` study runs them
(:mod:`repro.experiments.rl_purejaxrl.measure`): PureJaxRL's CartPole configuration and ours
from it (:func:`ours_config`), their compiled programs warmed up and timed side by side
(:func:`compare`), and their final returns read alike (:func:`final_returns`)."""

from __future__ import annotations

import hashlib
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from repro.models import ppo


# PureJaxRL's ppo.py __main__ configuration for CartPole-v1 (DEBUG off: no host callbacks).
CARTPOLE = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 5e5,
            "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95,
            "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5,
            "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True, "DEBUG": False}


SPEED_OPTIONS = ("unroll", "update_unroll", "epoch_unroll", "prng")  # PPO as it is


def ours_config(cfg: dict[str, Any], recipe: str = "tf32",
                options: Mapping[str, Any] | None = None) -> ppo.PPOConfig:
    """The same PPO in ``repro.models.ppo``'s terms (its defaults equal PureJaxRL's otherwise), with
    ``options``: speed options of :class:`repro.models.ppo.PPOConfig` (:data:`SPEED_OPTIONS`)."""
    options = dict(options or {})
    if bad := sorted(set(options) - set(SPEED_OPTIONS)):
        raise ValueError(f"ours option set {options} sets {bad}: only "
                         f"{', '.join(SPEED_OPTIONS)} may differ from PureJaxRL's config")
    return ppo.validate({
        "env": cfg["ENV_NAME"], "num_envs": cfg["NUM_ENVS"], "num_steps": cfg["NUM_STEPS"],
        "total_timesteps": int(cfg["TOTAL_TIMESTEPS"]), "update_epochs": cfg["UPDATE_EPOCHS"],
        "num_minibatches": cfg["NUM_MINIBATCHES"], "gamma": cfg["GAMMA"],
        "gae_lambda": cfg["GAE_LAMBDA"], "clip_eps": cfg["CLIP_EPS"],
        "ent_coef": cfg["ENT_COEF"], "vf_coef": cfg["VF_COEF"], "grad_clip": cfg["MAX_GRAD_NORM"],
        "activation": cfg["ACTIVATION"], "anneal_lr": cfg["ANNEAL_LR"], "lr": cfg["LR"],
        "width": 64, "depth": 2, "network": "mlp", "recipe": recipe, **options})


def label(options: Mapping[str, Any] | None) -> str:
    """``repro`` for the defaults, else e.g. ``repro[prng=unsafe_rbg,unroll=8]``."""
    inner = ",".join(f"{k}={v}" for k, v in sorted((options or {}).items()))
    return f"repro[{inner}]" if inner else "repro"


def cell_name(cfg: dict[str, Any], seeds: int, options: Mapping[str, Any] | None) -> str:
    """``CartPole-v1_s1024`` for the defaults (the cells recorded before options existed), else
    e.g. ``CartPole-v1_s1024_prng-unsafe_rbg_unroll-8``."""
    return "_".join([f"{cfg['ENV_NAME']}_s{seeds}",
                     *(f"{k}-{v}" for k, v in sorted((options or {}).items()))])


def _keys(n: int):
    return jax.vmap(jax.random.key)(jnp.arange(n, dtype=jnp.uint32))


def returns_digest(metrics) -> str:
    """A fingerprint of a run's per-update episode returns (all seeds): equal digests mean
    bitwise-equal returns, so option sets that keep the random streams (``unroll``,
    ``update_unroll``) can be checked to compute the same PPO on the device that timed them."""
    return hashlib.sha256(np.asarray(metrics["episode_return"]).tobytes()).hexdigest()[:16]

FINAL_FRACTION = 0.1  # the final return: mean over the last 10% of updates


def final_returns(out, impl: str, fraction: float = FINAL_FRACTION) -> np.ndarray | None:
    """Each seed's final return as every RL study here defines it (:func:`repro.models.ppo.
    final_return`: the episode-weighted mean return over the last ``fraction`` of updates),
    from a vmapped run's output: ours (its metrics) or PureJaxRL's (``metrics`` = the
    LogWrapper's info, [seeds, updates, steps, envs]: ``returned_episode_returns`` where
    ``returned_episode``). None if PureJaxRL's output lacks those."""
    if impl != "purejaxrl":
        return ppo.final_return(out, fraction)
    info = out.get("metrics") if isinstance(out, Mapping) else None
    if not isinstance(info, Mapping) or "returned_episode_returns" not in info:
        return None
    done = jnp.asarray(info["returned_episode"], jnp.float32)
    n = done.sum(axis=(2, 3))
    total = (jnp.asarray(info["returned_episode_returns"], jnp.float32) * done).sum(axis=(2, 3))
    return ppo.final_return({"episode_return": total / jnp.maximum(n, 1), "episodes": n,
                             "nonfinite_params": jnp.zeros(n.shape, bool)}, fraction)


def _warm(fn, keys, impl: str):
    """``fn`` compiled and run once (the warm-up), and the facts of that run: its per-seed
    ``final_returns`` and (ours only) its ``returns_digest``."""
    compiled = fn.lower(keys).compile()
    out = jax.block_until_ready(compiled(keys))  # warm-up
    facts = {"final_returns": final_returns(out, impl)}
    if impl != "purejaxrl":
        facts["returns_digest"] = returns_digest(out)
    del out
    return compiled, facts


def compile_theirs(module, cfg: dict[str, Any], seeds: int):
    """PureJaxRL's program for ``seeds`` vmapped seeds: (compiled, keys, facts), warmed up."""
    keys = jax.random.split(jax.random.PRNGKey(30), seeds)
    compiled, facts = _warm(jax.jit(jax.vmap(module.make_train(dict(cfg)))), keys, "purejaxrl")
    return compiled, keys, facts


def compare(theirs, cfg: dict[str, Any], seeds: int, repeats: int, recipe: str = "tf32",
            options: Mapping[str, Any] | None = None):
    """Time the option set ``options`` of ours against PureJaxRL (``theirs``: its
    :func:`compile_theirs`): ``(label, samples, facts)``. ``samples`` are seconds per whole
    training run of ``seeds`` vmapped seeds, ``{"purejaxrl": [...], label: [...]}``, the two
    timed round-robin (repeat i of each, back to back) after a warm-up run of each;
    ``facts[name]``: :func:`_warm`'s facts of that warm-up run."""
    name, c = label(options), ours_config(cfg, recipe, options)
    keys_ours = _keys(seeds)
    mine, facts = _warm(jax.jit(jax.vmap(ppo.make_train(c))), keys_ours, name)
    compiled, theirs_keys, theirs_facts = theirs
    runs = {"purejaxrl": (compiled, theirs_keys), name: (mine, keys_ours)}
    samples: dict[str, list[float]] = {n: [] for n in runs}
    for _ in range(repeats):
        for n, (fn, keys) in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(keys))
            samples[n].append(time.perf_counter() - t0)
    return name, samples, {"purejaxrl": theirs_facts, name: facts}


def env_steps(cfg: dict[str, Any], seeds: int) -> int:
    """Environment steps of one vmapped run, as PureJaxRL counts them (whole updates)."""
    updates = int(cfg["TOTAL_TIMESTEPS"]) // cfg["NUM_STEPS"] // cfg["NUM_ENVS"]
    return seeds * updates * cfg["NUM_STEPS"] * cfg["NUM_ENVS"]


def _summary(finals: np.ndarray | None) -> dict[str, Any] | None:
    """Mean, sample SD and count of per-seed final returns (seeds with no episode left out)."""
    if finals is None:
        return None
    f = np.asarray(finals, np.float64)
    f = f[np.isfinite(f)]
    return {"mean": float(f.mean()) if len(f) else None,
            "sd": float(f.std(ddof=1)) if len(f) > 1 else None, "n": int(len(f)),
            "last_fraction": FINAL_FRACTION}
