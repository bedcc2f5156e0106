"""The core of the PPO of :mod:`repro.models.ppo`: the categorical policy's pieces, GAE and
bootstrapping, the losses, and the update step (gradients, optimizer, epochs of minibatches);
the continuous-action PPO (:mod:`repro.models.ppo_continuous`) reuses it with its own policy.

Terminations and truncations (gymnax 1.0.1). ``env.step`` returns ``(obs, state, reward,
terminated, truncated, info)`` and auto-resets: when an episode ends, ``obs`` is already the
first observation of the next episode, and ``info["final_observation"]`` is the observation the
step really reached (gymnax 1.0.1, ``environment.py``). A TERMINATION ends the return: no
bootstrap. A TRUNCATION (time limit, ``state.time >= max_steps_in_episode``) does not: we
bootstrap through it by adding ``gamma * V(final_observation)`` to that step's reward and then
cutting the GAE recursion there, as for any episode end (``bootstrap_truncation=True``; it costs
one extra critic forward pass per step). When both flags are set, termination wins.

The rollout runs the actor alone where the towers share no parameter; :func:`learn` evaluates
the critic on the whole rollout in one batched pass (the parameters do not change during a
rollout). Its random numbers (the actions' Gumbel noise, the env-step keys) are drawn for all its
steps at once, before its scan.

Memory option. ``sequential_towers``: the update differentiates the critic's loss, then the
actor's (:func:`loss_grads`), so the two towers' activations are never alive together; the
gradients are the joint loss's. ``None`` (the default) does so for quantized recipes whose
minibatch activations are large (:func:`sequential_towers` says where and why).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from repro.models import sharding
from repro.precision import optim
from repro.models.ppo_config import PPOConfig, obs_shape, validate


def categorical_sample(key, logits):
    return jax.random.categorical(key, logits)


def categorical_log_prob(logits, actions):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return jnp.take_along_axis(logp, actions[..., None].astype(jnp.int32), -1)[..., 0]


def categorical_entropy(logits):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.sum(jnp.exp(logp) * logp, -1)


def bootstrap_reward(reward, terminated, truncated, final_value, gamma):
    """``reward + gamma * V(final_obs)`` where an episode was truncated (and not terminated)."""
    boot = jnp.logical_and(truncated, jnp.logical_not(terminated))
    return reward + gamma * final_value * boot.astype(reward.dtype)


def bootstrap_rollout(value_fn, rewards, final_obs, terminated, truncated, gamma):
    """:func:`bootstrap_reward` for a whole [T, N] rollout: ``value_fn`` (observations [B, ...]
    -> values [B]) runs once on all T * N final observations (the parameters are fixed during
    a rollout), instead of once per environment step."""
    T, N = terminated.shape
    final_value = value_fn(final_obs.reshape((T * N,) + final_obs.shape[2:])).reshape(T, N)
    return bootstrap_reward(rewards, terminated, truncated, final_value, gamma)


def compute_gae(rewards, values, dones, last_value, gamma, gae_lambda):
    """Generalised advantage estimation over a [T, ...] rollout.

    ``rewards`` already include any truncation bootstrap; ``dones[t]`` ends the episode after
    step t (termination or truncation), so neither the value nor the advantage of step t+1 flows
    back into step t. Returns (advantages, returns = advantages + values).
    """
    def step(carry, x):
        adv_next, v_next = carry
        r, v, d = x
        nd = 1.0 - d.astype(jnp.float32)
        delta = r + gamma * v_next * nd - v
        adv = delta + gamma * gae_lambda * nd * adv_next
        return (adv, v), adv

    init = (jnp.zeros_like(last_value), last_value)
    # unroll: the elementwise steps of 16 iterations fuse into one kernel (as in PureJaxRL)
    _, adv = jax.lax.scan(step, init, (rewards, values, dones), reverse=True, unroll=16)
    return adv, adv + values


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array  # with the truncation bootstrap
    done: jax.Array


class Policy(NamedTuple):
    """A policy's action distribution, from the network's policy output: ``log_prob(out,
    actions)`` and ``entropy(out)`` (per sample, float32)."""

    log_prob: Callable
    entropy: Callable


CATEGORICAL = Policy(categorical_log_prob, categorical_entropy)


def policy_loss(logits, batch: Transition, advantages, c: PPOConfig,
                policy: Policy = CATEGORICAL):
    """The actor's part of PPO's loss: the clipped surrogate minus the entropy bonus
    (float32). ``logits``: the network's policy output, read by ``policy``."""
    log_prob = policy.log_prob(logits, batch.action)
    if c.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = jnp.exp(log_prob - batch.log_prob)
    actor_loss = -jnp.mean(jnp.minimum(
        ratio * advantages, jnp.clip(ratio, 1 - c.clip_eps, 1 + c.clip_eps) * advantages))
    return actor_loss - c.ent_coef * jnp.mean(policy.entropy(logits))


def value_loss(values, batch: Transition, targets, c: PPOConfig):
    """The critic's part of PPO's loss, before ``vf_coef``: the clipped value error."""
    v_clipped = batch.value + jnp.clip(values - batch.value, -c.clip_eps, c.clip_eps)
    return 0.5 * jnp.mean(jnp.maximum(jnp.square(values - targets),
                                      jnp.square(v_clipped - targets)))


def ppo_loss(logits, values, batch: Transition, advantages, targets, c: PPOConfig,
             policy: Policy = CATEGORICAL):
    """PureJaxRL's clipped PPO loss (value clipping included); float32 throughout.
    ``logits``: the network's policy output, read by ``policy`` (categorical by default)."""
    return (policy_loss(logits, batch, advantages, c, policy)
            + c.vf_coef * value_loss(values, batch, targets, c))


def sequential_towers(c: PPOConfig, network) -> bool:
    """Whether the update differentiates the critic and then the actor (:func:`loss_grads`).
    Only where the network's towers share no parameter (``network.separate_towers``); then
    ``c.sequential_towers``, or where it is None, for a quantized recipe (FP8, MXFP8, NVFP4)
    whose widest layer holds at least ``SEQUENTIAL_MIN_ELEMENTS`` activations per minibatch.

    Why only those: XLA orders the two towers' kernels as it likes. For 16-bit recipes it ran
    one tower's forward and backward, then the other's, and forcing that order only cost
    memory; for FP8 it interleaved them (nothing orders the quantization kernels of one tower
    against the other's), keeping both towers' activation-sized buffers alive together. The
    H200 records of the 4096-wide MinAtar update (notebook 03) show the memory in sequence;
    the update's time did not change."""
    if not getattr(network, "separate_towers", False):
        return False
    if c.sequential_towers is not None:
        return c.sequential_towers
    return (c.resolved_recipe.quantized
            and c.minibatch_size * network.widest >= SEQUENTIAL_MIN_ELEMENTS)


# One layer's activations of a minibatch, in elements, from which a quantized recipe's update
# runs the towers one after the other by default (2**24 elements: 32 MiB in BF16).
SEQUENTIAL_MIN_ELEMENTS = 2 ** 24


def loss_grads(c: PPOConfig, network, policy: Policy = CATEGORICAL) -> Callable:
    """``grads(variables, batch, advantages, targets, scale)``: the gradient of ``ppo_loss *
    scale`` with respect to ``variables``.

    Where :func:`sequential_towers` holds, the critic's gradient is computed first and the
    actor's pass starts only once it exists (``lax.optimization_barrier``), so the two towers'
    activations and gradients are never alive together; the gradients are those of the joint
    loss (each term reaches only its own tower), added leaf by leaf. Otherwise one gradient of
    the joint loss, scheduled as XLA likes."""
    if not sequential_towers(c, network):
        def joint(variables, batch, adv, tgt, scale):
            def loss_fn(v):
                logits, values = network.apply(v, batch.obs)
                return ppo_loss(logits, values, batch, adv, tgt, c, policy) * scale
            return jax.grad(loss_fn)(variables)
        return joint

    def towers(variables, batch, adv, tgt, scale):
        def critic(v, obs):
            values = network.apply(v, obs, method="value")
            return c.vf_coef * value_loss(values, batch, tgt, c) * scale

        def actor(v, obs):
            logits = network.apply(v, obs, method="policy")
            return policy_loss(logits, batch, adv, c, policy) * scale

        g_critic = jax.grad(critic)(variables, batch.obs)
        g_critic, obs = jax.lax.optimization_barrier((g_critic, batch.obs))
        return jax.tree.map(jnp.add, g_critic, jax.grad(actor)(variables, obs))
    return towers


def init_state(c: PPOConfig, network, env, env_params, tx, key):
    """Initial variables (params cast to their storage format) and optimizer state."""
    from repro.precision import layers

    dummy = jnp.zeros((1, *obs_shape(env, env_params)), jnp.float32)
    variables = dict(network.init(key, dummy))
    variables["params"] = optim.to_storage(variables["params"], c.resolved_recipe.master_weights)
    variables = layers.init_amax_ring(variables, c.resolved_recipe)  # a "ring" recipe's histories
    return variables, tx.init(variables["params"])


def make_optimizer(c: PPOConfig) -> optax.GradientTransformation:
    steps = c.num_updates * c.update_epochs * c.num_minibatches
    lr = optax.linear_schedule(c.lr, 0.0, steps) if c.anneal_lr else c.lr
    return optim.make_optimizer(c.optimizer_config(), learning_rate=lr)


def run_key(rng, prng: str):
    """The key a run draws from: the caller's ``rng`` itself for ``"threefry"``, else a key of
    JAX's PRNG implementation ``prng`` whose data are random bits drawn from ``rng``."""
    if prng == "threefry":
        return rng
    shape = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=prng))).shape
    return jax.random.wrap_key_data(jax.random.bits(rng, shape, jnp.uint32), impl=prng)


def _no_shard(tree, axis):
    return tree


def shard_hook(mesh):
    """``shard(tree, axis)``: constrain ``axis`` of every leaf to ``mesh``'s batch axes."""
    def shard(tree, axis):
        return sharding.constrain_batch(mesh, axis)(tree)
    return shard


def place_update_args(mesh, variables, opt_state, traj, advantages, targets, key):
    """The update's arguments on ``mesh``: variables, optimizer state and key replicated; the
    rollout ``traj [T, N, ...]``, advantages and targets split on the environment axis N."""
    rep = sharding.replicated(mesh)
    put_rep = lambda t: jax.device_put(t, jax.tree.map(lambda _: rep, t))  # noqa: E731
    rollout = jax.tree.map(
        lambda x: jax.device_put(x, sharding.batch_sharding(mesh, x.ndim, 1)),
        (traj, advantages, targets))
    return (put_rep(variables), put_rep(opt_state), *rollout, jax.device_put(key, rep))


def make_update_step(c: PPOConfig, network, tx, shard: Callable | None = None, mesh=None,
                     policy: Policy = CATEGORICAL):
    """One PPO update (``update_epochs`` x ``num_minibatches`` gradient steps) on a rollout.

    ``(variables, opt_state, traj: Transition [T, N, ...], advantages, targets, key) ->
    (variables, opt_state)``. Used by ``make_train`` and timed alone by the throughput study.
    ``shard(tree, axis)``: optional sharding constraint on the batch axis ``axis`` of every
    leaf (data parallelism; ``mesh`` builds it); each minibatch is split by it. Place its
    inputs with :func:`place_update_args` and ``jax.jit`` it. ``policy``: the action
    distribution the loss reads from the network's policy output (categorical by default).
    """
    from repro.precision import layers

    if mesh is not None:
        c = validate(c, mesh)
        shard = shard_hook(mesh)
    shard = shard or _no_shard
    grads_of = loss_grads(c, network, policy)

    def minibatch_step(carry, mb):
        variables, opt_state = carry
        batch, adv, tgt = mb
        grads = grads_of(variables, batch, adv, tgt, optim.loss_scale(opt_state))
        variables, opt_state = layers.apply_gradients(variables, grads, tx, opt_state)
        return (variables, opt_state), None

    def epoch(carry, key):
        variables, opt_state, data = carry
        perm = jax.random.permutation(key, c.batch_size)
        shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=0), data)
        mbs = shard(jax.tree.map(lambda x: x.reshape(c.num_minibatches, c.minibatch_size,
                                                     *x.shape[1:]), shuffled), 1)
        (variables, opt_state), _ = jax.lax.scan(minibatch_step, (variables, opt_state), mbs,
                                                 unroll=c.update_unroll)
        return (variables, opt_state, data), None

    def update(variables, opt_state, traj, advantages, targets, key):
        flat = jax.tree.map(lambda x: x.reshape(c.batch_size, *x.shape[2:]),
                            (traj, advantages, targets))
        keys = jax.random.split(key, c.update_epochs)
        (variables, opt_state, _), _ = jax.lax.scan(
            epoch, (variables, opt_state, flat), keys,
            unroll=c.update_unroll if c.epoch_unroll is None else c.epoch_unroll)
        return variables, opt_state

    return update


def learn(c: PPOConfig, update_step, critic, variables, opt_state, traj: Transition, boot,
          last_obs, key):
    """One PPO update from a rollout ``traj [T, N, ...]``: the truncation bootstrap (``boot``:
    final observations, terminated, truncated; used when ``c.bootstrap_truncation``), GAE
    from ``critic(variables, last_obs)``, then ``update_step``. Returns (variables,
    opt_state).

    A rollout that left the critic out (``traj.value`` is None) gets its values here, in one
    batched critic pass over all its observations, the final observations of the bootstrap
    and ``last_obs`` (the parameters do not change during a rollout)."""
    value_of = lambda o: critic(variables, o)  # noqa: E731
    if traj.value is None:
        sets = (traj.obs, last_obs[None]) + ((boot[0],) if c.bootstrap_truncation else ())
        values = critic_values(value_of, *sets)
        traj, last_value = traj._replace(value=values[0]), values[1][0]
        if c.bootstrap_truncation:
            traj = traj._replace(reward=bootstrap_reward(traj.reward, boot[1], boot[2],
                                                         values[2], c.gamma))
    else:
        if c.bootstrap_truncation:
            traj = traj._replace(reward=bootstrap_rollout(value_of, traj.reward, *boot,
                                                          c.gamma))
        last_value = value_of(last_obs)
    adv, targets = compute_gae(traj.reward, traj.value, traj.done, last_value,
                               c.gamma, c.gae_lambda)
    return update_step(variables, opt_state, traj, adv, targets, key)


def critic_values(value_fn, *obs):
    """``value_fn`` (observations [B, ...] -> values [B]) on several observation arrays [K, N,
    ...] in ONE batched pass: their values, [K, N] each."""
    lead = [o.shape[:2] for o in obs]
    flat = jnp.concatenate([o.reshape((-1,) + o.shape[2:]) for o in obs])
    cuts = np.cumsum([k * n for k, n in lead])[:-1].tolist()
    return [v.reshape(s) for v, s in zip(jnp.split(value_fn(flat), cuts), lead)]


def update_metrics(done, finished, variables, opt_state) -> dict[str, jax.Array]:
    """The per-update scalars :func:`make_train` returns, from a rollout's episode ends
    ``done [T, N]`` and the returns of the episodes they finished (``finished``, 0 elsewhere)."""
    n = jnp.sum(done)
    return {
        "episode_return": jnp.where(n > 0, jnp.sum(finished) / jnp.maximum(n, 1), jnp.nan),
        "episodes": n.astype(jnp.int32),
        "skipped": optim.skipped_steps(opt_state),
        "loss_scale": optim.loss_scale(opt_state),
        "nonfinite_params": jnp.logical_not(optim.all_finite(variables["params"])),
    }
