"""PPO with GAE on gymnax 1.0, PureJaxRL-shaped: ``make_train(config) -> train(rng)``.

The whole run (rollouts, GAE, epochs of minibatch updates) is ONE pure function of a PRNG key,
jitted once and ``jax.vmap``-ped over seeds::

    train = jax.jit(jax.vmap(ppo.make_train({"env": "CartPole-v1", "recipe": "fp8-delayed"})))
    out = train(jax.random.split(jax.random.key(0), 16))   # 16 seeds, about the cost of one
    out["episode_return"]                                   # [16, num_updates]

Every hyperparameter is a field of :class:`PPOConfig` (CleanRL's habit: all visible at the top;
:mod:`repro.models.ppo_config`, with its checks: one-line errors before anything is traced).
The precision recipe (``repro.precision.recipes``) goes to every Dense/Conv of the network
(``repro.models.networks``); the optimizer is ``repro.precision.optim.make_optimizer`` (master-weight storage,
Kahan, gradient and weight clipping, skip-nonfinite); FP16 recipes get dynamic loss scaling.
Delayed-scaling FP8 state (the ``FP8_META`` collection) is updated through the gradient by
``repro.precision.layers.apply_gradients``.

Only per-update scalars leave the jitted function (mean return of the episodes completed in the
update, their count, cumulative skipped steps, the loss scale, whether any parameter is
non-finite), so 16 MinAtar seeds fit in memory.

The pieces of an update (GAE, the losses, the update step) are :mod:`repro.models.ppo_core`'s;
this module is the training loop (:func:`make_train`) and hands on the others' names.

Speed options (they leave the arithmetic as it is). ``unroll`` (default 2): env
steps per iteration of the rollout ``lax.scan``; ``update_unroll``: the same for the epoch and
minibatch scans of an update (``epoch_unroll``, where set, for the epoch scan instead: an
unrolled minibatch loop inside a rolled epoch loop compiles one copy of the update's gradient
step per minibatch, not one per epoch and minibatch). On a GPU each while-loop iteration costs kernel launches (and may
cost a host round-trip for its predicate), and unrolled steps can be fused; the arithmetic is the
same (bitwise on CPU, tested; XLA may fuse unrolled GPU code differently), and compile time grows
with the unroll (a fully unrolled 32-step rollout took 2.5 minutes to compile on CPU).
``prng``: ``"threefry"`` uses the caller's key as it is; ``"rbg"``, ``"unsafe_rbg"`` or
``"philox4x32"`` run on a key of that JAX PRNG drawn from the caller's key inside
``train(rng)`` (:func:`run_key`): same interface, and the same key gives the same run, on other
random streams. Caveat (JAX's ``jax.random`` docs): under ``vmap``, rbg and unsafe_rbg draw a
batch's random numbers from its first key, so a seed's run depends on the other seeds of the
batch (threefry and philox do not)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from repro.models.ppo_config import (PRNGS, PPOConfig, build_network, check_common, make_env,
                                     obs_shape, valid_envs, validate)
from repro.models.ppo_core import (CATEGORICAL, SEQUENTIAL_MIN_ELEMENTS, Policy, Transition,
                                   _no_shard, bootstrap_reward, bootstrap_rollout,
                                   categorical_entropy, categorical_log_prob,
                                   categorical_sample, compute_gae, critic_values, init_state,
                                   learn, loss_grads, make_optimizer, make_update_step,
                                   place_update_args, policy_loss, ppo_loss, run_key,
                                   sequential_towers, shard_hook, update_metrics, value_loss)

# The PPO of this repository, one name per piece: its configuration (repro.models.ppo_config),
# its core (GAE, losses, the update step: repro.models.ppo_core, which the continuous-action
# PPO reuses) and the training loop below.
__all__ = [
    "PRNGS", "PPOConfig", "build_network", "check_common", "make_env", "obs_shape",
    "valid_envs", "validate", "CATEGORICAL", "SEQUENTIAL_MIN_ELEMENTS", "Policy", "Transition",
    "bootstrap_reward", "bootstrap_rollout", "categorical_entropy", "categorical_log_prob",
    "categorical_sample", "compute_gae", "critic_values", "init_state", "learn", "loss_grads",
    "make_optimizer", "make_update_step", "place_update_args", "policy_loss", "ppo_loss",
    "run_key", "sequential_towers", "shard_hook", "update_metrics", "value_loss", "make_train",
    "final_return",
]


def make_train(config: Mapping[str, Any] | PPOConfig, mesh=None, shard: Callable | None = None):
    """Validate ``config`` (one-line ValueError) and return the pure ``train(rng) -> metrics``.

    ``metrics``: dict of [num_updates] arrays -- ``episode_return`` (mean return of the episodes
    completed during the update's rollout, NaN if none), ``episodes`` (their count),
    ``skipped`` (cumulative optimizer steps skipped for non-finite gradients), ``loss_scale``,
    ``nonfinite_params`` (any parameter inf/NaN after the update).

    ``mesh`` (a ``jax.sharding.Mesh``): data parallelism, the environments (and each
    minibatch) split over the mesh's batch axes; env states, observations and trajectories
    are constrained to that split (``shard(tree, axis)``, which a caller may also pass
    directly). Without either nothing is constrained.
    """
    c = validate(config, mesh)
    if mesh is not None:
        shard = shard_hook(mesh)
    env, env_params = make_env(c.env)
    network = build_network(c, env, env_params)
    tx = make_optimizer(c)
    shard = shard or _no_shard
    update_step = make_update_step(c, network, tx, shard)

    def policy_value(variables, obs):
        return network.apply(variables, obs)

    def critic(variables, obs):
        return network.apply(variables, obs, method="value")

    def actor(variables, obs):
        return network.apply(variables, obs, method="policy")

    # Where the towers share nothing, the rollout runs the actor alone and learn() evaluates
    # the critic on the whole rollout in one batched pass.
    critic_after = getattr(network, "separate_towers", False)
    num_actions = env.action_space(env_params).n
    v_reset = jax.vmap(env.reset, in_axes=(0, None))
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def train(rng):
        rng, k_init, k_env = jax.random.split(run_key(rng, c.prng), 3)
        variables, opt_state = init_state(c, network, env, env_params, tx, k_init)
        obs, env_state = v_reset(jax.random.split(k_env, c.num_envs), env_params)
        ep_ret = jnp.zeros((c.num_envs,), jnp.float32)
        obs, env_state, ep_ret = shard((obs, env_state, ep_ret), 0)

        def env_step(carry, x):
            variables, env_state, obs, ep_ret = carry
            noise, k_step = x
            if critic_after:
                logits, value = actor(variables, obs), None
            else:
                logits, value = policy_value(variables, obs)
            action = jnp.argmax(logits.astype(jnp.float32) + noise, axis=-1)
            log_prob = categorical_log_prob(logits, action)
            obs2, env_state, reward, term, trunc, info = v_step(
                k_step, env_state, action, env_params)
            reward = reward.astype(jnp.float32)
            done = jnp.logical_or(term, trunc)
            ep_ret = ep_ret + reward
            finished = jnp.where(done, ep_ret, 0.0)
            tr = Transition(obs, action, log_prob, value, reward, done)
            # The truncation bootstrap needs V(final observation); it is evaluated for the
            # whole rollout at once after the scan (the parameters do not change during the
            # rollout): one batched critic pass per update instead of one per env step.
            boot = (info["final_observation"], term, trunc) if c.bootstrap_truncation else ()
            ep_ret = jnp.where(done, 0.0, ep_ret)
            env_state, obs2, ep_ret = shard((env_state, obs2, ep_ret), 0)
            return (variables, env_state, obs2, ep_ret), (tr, done, finished, boot)

        def update(carry, _):
            variables, opt_state, env_state, obs, ep_ret, rng = carry
            # the rollout's random numbers, drawn for all its steps at once: the Gumbel noise
            # of the action samples (jax.random.categorical's method) and the env-step keys
            rng, k_act, k_env, k_upd = jax.random.split(rng, 4)
            xs = (jax.random.gumbel(k_act, (c.num_steps, c.num_envs, num_actions)),
                  jax.random.split(k_env, (c.num_steps, c.num_envs)))
            xs = shard(xs, 1)
            (variables, env_state, obs, ep_ret), (traj, done, finished, boot) = (
                jax.lax.scan(env_step, (variables, env_state, obs, ep_ret), xs,
                             unroll=c.unroll))
            traj, done, finished, boot = shard((traj, done, finished, boot), 1)
            variables, opt_state = learn(c, update_step, critic, variables, opt_state, traj,
                                         boot, obs, k_upd)
            metrics = update_metrics(done, finished, variables, opt_state)
            return (variables, opt_state, env_state, obs, ep_ret, rng), metrics

        carry = (variables, opt_state, env_state, obs, ep_ret, rng)
        _, metrics = jax.lax.scan(update, carry, None, c.num_updates)
        return metrics

    train.config = c
    train.mesh = mesh
    return train


def final_return(metrics: Mapping[str, Any], last_fraction: float = 0.1) -> np.ndarray:
    """Per-seed final return: episode-weighted mean return over the last ``last_fraction`` of
    updates (at least one). ``metrics`` arrays are [seeds, num_updates] (or [num_updates]).
    A seed whose parameters went non-finite scores NaN (diverged)."""
    ret = np.atleast_2d(np.asarray(metrics["episode_return"], np.float64))
    n = np.atleast_2d(np.asarray(metrics["episodes"], np.float64))
    k = max(1, int(round(ret.shape[1] * last_fraction)))
    r, w = np.nan_to_num(ret[:, -k:]), n[:, -k:]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (r * w).sum(1) / w.sum(1)
    bad = np.atleast_2d(np.asarray(metrics["nonfinite_params"]))[:, -1].astype(bool)
    out[bad] = np.nan
    return out
