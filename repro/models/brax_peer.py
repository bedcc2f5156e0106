"""brax's own PPO trainer (``brax.training.agents.ppo.train``) on a continuous PPO config, as a
speed and return peer of :mod:`repro.models.ppo_continuous`
(``repro.experiments.legged.measure``).

brax 0.14.2's trainer calls ``jax.device_put_replicated``, which JAX has removed:
:func:`_replicated_standin` puts a stand-in on the ``jax`` module for the duration of the call
(one copy per device, placed by ``jax.pmap`` as the trainer's ``pmap`` expects) and takes it
away again. brax warns on import that its pipelines are no longer actively maintained.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import jax.numpy as jnp

from repro.models import ppo_continuous as pc


@contextlib.contextmanager
def _replicated_standin():
    """``jax.device_put_replicated`` (removed from JAX, called by brax 0.14.2's trainer) for
    the duration: every leaf gets a leading axis of one copy per device."""
    if hasattr(jax, "device_put_replicated"):
        yield
        return

    def device_put_replicated(x, devices):
        stacked = jax.tree.map(lambda a: jnp.stack([jnp.asarray(a)] * len(devices)), x)
        return jax.pmap(lambda t: t, devices=devices)(stacked)  # placed as pmap places them

    jax.device_put_replicated = device_put_replicated
    try:
        yield
    finally:
        del jax.device_put_replicated


def brax_kwargs(c: pc.ContinuousPPOConfig, num_evals: int, eval_envs: int) -> dict[str, Any]:
    """brax's ``ppo.train`` arguments equal to ``c``: one unroll of every environment per
    training step (``batch_size * num_minibatches = num_envs``), the same network sizes and
    a Gaussian policy with a learned state-independent log standard deviation, the value loss
    clipped like ours. At a time-limit end brax zeroes that step's TD error (its default; its
    ``bootstrap_on_timeout`` wants an ``info["time_out"]`` that its wrappers do not set) where
    ours bootstraps from the final observation."""
    from brax.training.agents.ppo import networks as brax_networks
    from flax import linen

    if c.num_envs % c.num_minibatches:
        raise ValueError(f"peer: num_minibatches={c.num_minibatches} must divide "
                         f"num_envs={c.num_envs} (brax's batch_size = num_envs / minibatches)")
    factory = functools.partial(
        brax_networks.make_ppo_networks, policy_hidden_layer_sizes=c.policy_sizes,
        value_hidden_layer_sizes=c.value_sizes, activation=getattr(linen, c.activation),
        distribution_type="normal", noise_std_type="log",
        init_noise_std=float(c.init_std))
    return dict(num_timesteps=c.total_timesteps, num_envs=c.num_envs,
                episode_length=c.episode_length, action_repeat=c.action_repeat,
                unroll_length=c.num_steps, batch_size=c.num_envs // c.num_minibatches,
                num_minibatches=c.num_minibatches, num_updates_per_batch=c.update_epochs,
                learning_rate=c.lr, entropy_cost=c.ent_coef, discounting=c.gamma,
                gae_lambda=c.gae_lambda, clipping_epsilon=c.clip_eps,
                max_grad_norm=c.grad_clip, clipping_epsilon_value=c.clip_eps,
                normalize_observations=c.normalize_observations,
                reward_scaling=c.reward_scaling, vf_loss_coefficient=c.vf_coef,
                normalize_advantage=c.normalize_advantages,
                network_factory=factory,
                num_evals=num_evals, num_eval_envs=eval_envs, deterministic_eval=False)


def _clipped(env):
    """``env`` with actions clipped to [-1, 1], as our adapter's callers clip them (brax's
    Gaussian policy hands the environment unbounded samples)."""
    from brax.envs.base import Wrapper

    class ClipActions(Wrapper):
        def step(self, state, action):
            return self.env.step(state, jnp.clip(action, -1.0, 1.0))

    return ClipActions(env)


def run(c: pc.ContinuousPPOConfig, seed: int, num_evals: int, eval_envs: int):
    """brax's PPO on ``c``: (rates of the epochs after the second, final eval return). Its
    first epoch compiles, and its second compiles again (seen on a CPU with JAX 0.11)."""
    from brax.training.agents.ppo import train as brax_ppo

    log: list[dict[str, Any]] = []
    with _replicated_standin():
        brax_ppo.train(_clipped(pc.make_env(c).env), seed=seed,
                       **brax_kwargs(c, num_evals, eval_envs),
                       progress_fn=lambda step, m: log.append(dict(m)))
    rates = [float(m["training/sps"]) for m in log if "training/sps" in m][2:]
    if not rates:
        raise ValueError(f"peer: evals={num_evals} leaves no brax epoch after the two that "
                         "compile; use evals >= 4")
    return rates, float(log[-1]["eval/episode_reward"])
