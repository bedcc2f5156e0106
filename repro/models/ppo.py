"""PPO with GAE on gymnax 1.0, PureJaxRL-shaped: ``make_train(config) -> train(rng)``.

The whole run (rollouts, GAE, epochs of minibatch updates) is ONE pure function of a PRNG key,
jitted once and ``jax.vmap``-ped over seeds::

    train = jax.jit(jax.vmap(ppo.make_train({"env": "CartPole-v1", "recipe": "fp8-delayed"})))
    out = train(jax.random.split(jax.random.key(0), 16))   # 16 seeds, about the cost of one
    out["episode_return"]                                   # [16, num_updates]

Every hyperparameter is a field of :class:`PPOConfig` (CleanRL's habit: all visible at the top).
The precision recipe (``repro.precision.recipes``) goes to every Dense/Conv of the network
(``repro.models.networks``); the optimizer is ``repro.precision.optim.make_optimizer`` (master-weight storage,
Kahan, gradient and weight clipping, skip-nonfinite); FP16 recipes get dynamic loss scaling.
Delayed-scaling FP8 state (the ``FP8_META`` collection) is updated through the gradient by
``repro.precision.layers.apply_gradients``.

Terminations and truncations (gymnax 1.0.1). ``env.step`` returns ``(obs, state, reward,
terminated, truncated, info)`` and auto-resets: when an episode ends, ``obs`` is already the
first observation of the next episode, and ``info["final_observation"]`` is the observation the
step really reached (gymnax 1.0.1, ``environment.py``). A TERMINATION ends the return: no
bootstrap. A TRUNCATION (time limit, ``state.time >= max_steps_in_episode``) does not: we
bootstrap through it by adding ``gamma * V(final_observation)`` to that step's reward and then
cutting the GAE recursion there, as for any episode end (``bootstrap_truncation=True``; it costs
one extra critic forward pass per step). When both flags are set, termination wins.

Only per-update scalars leave the jitted function (mean return of the episodes completed in the
update, their count, cumulative skipped steps, the loss scale, whether any parameter is
non-finite), so 16 MinAtar seeds fit in memory.

The rollout runs the actor alone where the towers share no parameter; :func:`learn` evaluates
the critic on the whole rollout in one batched pass (the parameters do not change during a
rollout). Its random numbers (the actions' Gumbel noise, the env-step keys) are drawn for all its
steps at once, before its scan.

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
batch (threefry and philox do not).

Memory option. ``sequential_towers``: the update differentiates the critic's loss, then the
actor's (:func:`loss_grads`), so the two towers' activations are never alive together; the
gradients are the joint loss's. ``None`` (the default) does so for quantized recipes whose
minibatch activations are large (:func:`sequential_towers` says where and why).

Configuration errors (unknown env, recipe, network, prng; an unroll < 1; minibatches that do not
divide the batch; fewer steps than one update) raise ``ValueError`` with one line, in
``make_train``, before anything is traced or compiled.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from repro.models import networks, sharding
from repro.precision import optim
from repro.precision.recipes import resolve


@dataclass(frozen=True)
class PPOConfig:
    # environment
    env: str = "CartPole-v1"
    num_envs: int = 4
    num_steps: int = 128
    total_timesteps: int = 500_000
    bootstrap_truncation: bool = True
    # network and precision
    network: str = "mlp"  # mlp | cnn | cnn-large
    width: int = 64
    depth: int = 2
    activation: str = "tanh"
    recipe: str = "fp32"  # a name of repro.precision's registry (storage, Kahan, clipping too)
    # PPO (PureJaxRL's CartPole defaults)
    update_epochs: int = 4
    num_minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    normalize_advantages: bool = True
    # optimizer (repro.precision.optim.make_optimizer)
    lr: float = 2.5e-4
    anneal_lr: bool = True
    adam_eps: float = 1e-5
    grad_clip: float | None = 0.5  # global norm; the recipe's grad_clip=False disables it
    loss_scale: bool | None = None  # None: the recipe's loss_scaling (fp16)
    loss_scale_period: int = 200
    # speed only (see the module doc): scan unrolling and the run's PRNG
    unroll: int = 2  # env steps per iteration of the rollout scan
    update_unroll: int = 1  # iterations per loop iteration of the epoch and minibatch scans
    epoch_unroll: int | None = None  # the epoch scan's alone (None: update_unroll)
    prng: str = "threefry"  # threefry (the caller's key as is) | rbg | unsafe_rbg | philox4x32
    # memory: differentiate the critic, then the actor (None: for quantized recipes where
    # activations are large; see sequential_towers)
    sequential_towers: bool | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | "PPOConfig") -> "PPOConfig":
        if isinstance(d, PPOConfig):
            return d
        fields = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - fields)
        moved = [k for k in bad if k in _RECIPE_FIELDS]
        if moved:
            raise ValueError(f"PPO config key(s) {moved} are recipe fields: name a recipe that "
                             f"has them, e.g. recipe='fp8-delayed:{moved[0]}=...' "
                             "(repro.precision.recipes)")
        if bad:
            raise ValueError(f"unknown PPO config key(s) {bad}; valid keys: {sorted(fields)}")
        return cls(**dict(d))

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    @property
    def uses_loss_scale(self) -> bool:
        return resolve(self.recipe).loss_scaling if self.loss_scale is None else self.loss_scale

    def optimizer_config(self) -> dict[str, Any]:
        r = resolve(self.recipe)
        return optim.optimizer_config(
            lr=self.lr, adam_eps=self.adam_eps,
            grad_clip=self.grad_clip if r.grad_clip else None, weight_clip=r.weight_clip,
            master_weights=r.master_weights, kahan=r.kahan, loss_scale=self.uses_loss_scale,
            loss_scale_period=self.loss_scale_period)


_RECIPE_FIELDS = ("keep_io_precise", "master_weights", "kahan", "weight_clip", "scope")


PRNGS = ("threefry", "rbg", "unsafe_rbg", "philox4x32")


def valid_envs() -> list[str]:
    import gymnax

    return list(gymnax.registered_envs)


_POSITIVE = ("total_timesteps", "lr", "adam_eps", "loss_scale_period", "grad_clip",
             "reward_scaling", "num_envs", "num_steps", "update_epochs", "num_minibatches",
             "unroll", "update_unroll", "epoch_unroll", "episode_length", "action_repeat")
_UNIT = ("gamma", "gae_lambda")  # in [0, 1]


def _kind_ok(v: Any, hint: Any) -> bool:
    """``v`` is of the annotated type ``hint`` (an int is a float; a tuple's elements are of
    its element type; floats are finite)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        return isinstance(v, tuple) and all(_kind_ok(x, args[0]) for x in v)
    kinds = args if args else (hint,)
    if not any(v is None if k is type(None) else (
            type(v) is k or (k is float and type(v) is int)) for k in kinds):
        return False
    return not (isinstance(v, float) and not math.isfinite(v))


def _check_values(c: PPOConfig) -> None:
    """Each field of its annotated type (an int for an int field, a finite number for a float
    one...), sizes and rates > 0, coefficients >= 0, discounts in [0, 1]: one line naming it."""
    hints = typing.get_type_hints(type(c))
    for f in dataclasses.fields(c):
        v, hint = getattr(c, f.name), hints[f.name]
        items = v if isinstance(v, tuple) else (v,)
        ok = _kind_ok(v, hint) and all(
            x is None or isinstance(x, (bool, str)) or not (
                x <= 0 if f.name in _POSITIVE or isinstance(v, tuple)
                else not 0 <= x <= 1 if f.name in _UNIT else x < 0) for x in items)
        if not ok:
            kinds = typing.get_args(hint) or (hint,)
            want = " or ".join("None" if k is type(None) else getattr(k, "__name__", str(k))
                               for k in kinds)
            rule = ("> 0" if f.name in _POSITIVE or isinstance(v, tuple) else
                    "in [0, 1]" if f.name in _UNIT else ">= 0")
            raise ValueError(f"PPO config {f.name}={v!r}: expected {want}"
                             + ("" if str in kinds or bool in kinds else f", {rule}"))


def check_common(c: PPOConfig, positive: tuple[str, ...] = ()) -> None:
    """The checks every PPO configuration shares (field types and ranges, recipe, activation,
    prng, counts >= 1 -- ``positive`` names more --, minibatches dividing the batch, at least
    one update): a one-line ValueError."""
    _check_values(c)
    try:
        resolve(c.recipe)  # a registry name or a variant 'base:field=value,...'
    except ValueError as e:
        raise ValueError(" ".join(str(e).split())) from None
    if c.activation not in networks.ACTIVATIONS:
        raise ValueError(f"unknown activation {c.activation!r}; valid: "
                         f"{', '.join(networks.ACTIVATIONS)}")
    if c.prng not in PRNGS:
        raise ValueError(f"unknown prng {c.prng!r}; valid: {', '.join(PRNGS)}")
    for name in ("num_envs", "num_steps", "update_epochs", "num_minibatches", "unroll",
                 "update_unroll") + tuple(positive):
        if getattr(c, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(c, name)}")
    if c.batch_size % c.num_minibatches:
        raise ValueError(f"num_minibatches={c.num_minibatches} does not divide the batch "
                         f"num_envs*num_steps={c.num_envs}*{c.num_steps}={c.batch_size}")
    if c.num_updates < 1:
        raise ValueError(f"total_timesteps={c.total_timesteps} is less than one update "
                         f"(num_envs*num_steps={c.batch_size})")


def validate(config: Mapping[str, Any] | PPOConfig, mesh=None) -> PPOConfig:
    """The config as a PPOConfig, or a one-line ValueError (nothing is traced here). With a
    ``mesh``: the environments and each minibatch must divide over its batch devices."""
    c = PPOConfig.from_dict(config)
    envs = valid_envs()
    if c.env not in envs:
        raise ValueError(f"unknown env {c.env!r}; valid envs: {', '.join(envs)}")
    if c.network not in networks.NETWORKS:
        raise ValueError(f"unknown network {c.network!r}; valid: {', '.join(networks.NETWORKS)}")
    check_common(c)
    if mesh is not None:
        n = sharding.data_size(mesh)
        for name, size in (("num_envs", c.num_envs), ("minibatch_size", c.minibatch_size)):
            if size % n:
                raise ValueError(f"{name}={size} is not divisible by the {n} devices of the "
                                 "mesh's batch axes")
    return c


def make_env(name: str):
    import gymnax

    return gymnax.make(name)


def obs_shape(env, env_params) -> tuple[int, ...]:
    return tuple(env.observation_space(env_params).shape)


def build_network(c: PPOConfig, env, env_params):
    shape = obs_shape(env, env_params)
    if c.network != "mlp" and len(shape) != 3:
        raise ValueError(f"network {c.network!r} needs image observations [H, W, C]; "
                         f"{c.env} gives shape {shape}")
    return networks.make_network(c.network, env.action_space(env_params).n, c.recipe,
                                 width=c.width, depth=c.depth, activation=c.activation,
                                 obs_shape=shape)


# ------------------------------------------------------------------------------- pieces


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
    return (resolve(c.recipe).quantized
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


# ----------------------------------------------------------------------------- training


def init_state(c: PPOConfig, network, env, env_params, tx, key):
    """Initial variables (params cast to their storage format) and optimizer state."""
    from repro.precision import layers

    dummy = jnp.zeros((1, *obs_shape(env, env_params)), jnp.float32)
    variables = dict(network.init(key, dummy))
    variables["params"] = optim.to_storage(variables["params"], resolve(c.recipe).master_weights)
    variables = layers.init_amax_ring(variables, c.recipe)  # a "ring" recipe's amax histories
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
