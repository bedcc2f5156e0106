"""Data-parallel PPO: the parallel environments split over devices, gradients all-reduced.

    from repro import distributed
    from repro.rl import sharded
    mesh = distributed.make_mesh()                       # ("data",) over every device
    train = jax.jit(sharded.make_train({"env": "CartPole-v1", "num_envs": 64}, mesh))
    metrics = train(jax.random.key(0))                   # same numbers as ppo.make_train's

This is ``ppo.make_train`` itself, given a sharding hook (``ppo.make_train(config, shard)``):

* the environment axis of the env states, observations and episode returns (``[num_envs,
  ...]``) and of the trajectories (``[num_steps, num_envs, ...]``) is constrained to the mesh's
  batch axes (``PartitionSpec("data")`` on that axis, ``with_sharding_constraint``), so each
  device steps ``num_envs / n`` environments and runs the policy on them;
* parameters, optimizer state and FP8_META state are replicated (computed identically on every
  device from the same key);
* each minibatch ``[minibatch_size, ...]`` is split the same way. The PPO loss is a mean over
  the minibatch, so XLA computes per-device partial sums and ALL-REDUCES them: the gradient
  all-reduce of data parallelism (visible in the compiled HLO, tested), and the same for the
  advantage normalisation statistics and every FP8 delayed-scaling amax (a ``jnp.max`` over a
  sharded array is the global max).

The shuffle of each epoch is the single-device one (a global permutation of the rollout), so a
sharded run computes the same values as ``ppo.make_train`` with the same key, up to the order
of floating-point reductions (tested on 8 simulated CPU devices). The price is that each epoch
gathers the rollout across devices for the shuffle; the rollouts (the expensive part of PPO on
gymnax) and the GEMMs are split.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
from jax.sharding import Mesh

from repro import distributed
from repro.rl import ppo


def shard_hook(mesh: Mesh):
    """``shard(tree, axis)`` for ``ppo.make_train`` / ``ppo.make_update_step``."""
    def shard(tree, axis):
        return distributed.constrain_batch(mesh, axis)(tree)
    return shard


def validate(config: Mapping[str, Any] | ppo.PPOConfig, mesh: Mesh) -> ppo.PPOConfig:
    """``ppo.validate`` plus: the environments and each minibatch divide over the devices."""
    c = ppo.validate(config)
    n = distributed.data_size(mesh)
    if c.num_envs % n:
        raise ValueError(f"num_envs={c.num_envs} is not divisible by the {n} devices of the "
                         "mesh's batch axes")
    if c.minibatch_size % n:
        raise ValueError(f"minibatch_size={c.minibatch_size} (num_envs*num_steps/"
                         f"num_minibatches) is not divisible by the {n} devices")
    return c


def make_train(config: Mapping[str, Any] | ppo.PPOConfig, mesh: Mesh):
    """``train(rng) -> metrics`` as ``ppo.make_train``, environments split over ``mesh``."""
    c = validate(config, mesh)
    train = ppo.make_train(c, shard=shard_hook(mesh))
    train.mesh = mesh
    return train


def make_update_step(c: ppo.PPOConfig, network, tx, mesh: Mesh):
    """``ppo.make_update_step`` with each minibatch split over ``mesh`` (not jitted, as the
    original). Place its inputs with :func:`place_update_args` and ``jax.jit`` it: jit takes
    the inputs' shardings (variables and optimizer state replicated, rollout split on N)."""
    c = validate(c, mesh)
    return ppo.make_update_step(c, network, tx, shard=shard_hook(mesh))


def place_update_args(mesh: Mesh, variables, opt_state, traj, advantages, targets, key):
    """The update's arguments on ``mesh``: variables, optimizer state and key replicated; the
    rollout ``traj [T, N, ...]``, advantages and targets split on the environment axis N."""
    rep = distributed.replicated(mesh)
    put_rep = lambda t: jax.device_put(t, jax.tree.map(lambda _: rep, t))  # noqa: E731
    rollout = jax.tree.map(
        lambda x: jax.device_put(x, distributed.batch_sharding(mesh, x.ndim, 1)),
        (traj, advantages, targets))
    return (put_rep(variables), put_rep(opt_state), *rollout, jax.device_put(key, rep))
