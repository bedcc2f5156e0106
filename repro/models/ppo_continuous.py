"""Continuous-action PPO on brax / MuJoCo Playground physics: ``make_train(config) -> train(rng)``.

The same shape as :mod:`repro.models.ppo` (whose clipped loss, GAE, truncation bootstrap,
optimizer and update step it uses): the whole run is one pure function of a PRNG key, jitted
once and ``jax.vmap``-ped over seeds::

    train = jax.jit(jax.vmap(ppo_continuous.make_train({"env": "ant", "recipe": "bf16"})))
    out = train(jax.random.split(jax.random.key(0), 8))   # 8 seeds
    out["episode_return"]                                  # [8, num_updates]

What differs from the discrete PPO:

* the policy is a diagonal Gaussian (``repro.models.networks.GaussianActorCritic``: mean from
  the actor tower, a learned state-independent log standard deviation); actions are sampled
  unbounded, stored as sampled (their log-probability is exact) and clipped to [-1, 1] only
  where they enter the environment (CleanRL's ``ppo_continuous_action`` does the same);
* observations are normalised by running statistics (mean and variance over every
  observation seen so far, Chan's parallel update after each rollout; brax and Playground PPO
  normalise too): the rollout stores the normalised observations, so the update sees exactly
  what the policy saw, and the statistics change between rollouts only; normalised values are
  clipped to [-10, 10];
* rewards are multiplied by ``reward_scaling`` for learning (brax's knob); the recorded
  episode returns are unscaled;
* the environments are :mod:`repro.models.envs` adapters (brax ant/humanoid on MJX, Playground
  Go1), whose final observation feeds the truncation bootstrap.

Every precision recipe applies to the actor and critic towers as in the discrete networks;
``critic_recipe`` runs the critic under another one (e.g. an FP8 policy with an FP32 value
function), while weight storage and the optimizer follow ``recipe``. The physics keeps its own
matmul precision (``physics_precision``; :mod:`repro.models.envs`).

Defaults: brax's ant networks (``brax.training.agents.ppo.networks``: 4 x 32 policy, 5 x 256
value, swish); MuJoCo Playground's locomotion PPO settings (``mujoco_playground/config/
locomotion_params.py``: discount 0.97, learning rate 3e-4, entropy cost 0.01, 20-step unrolls,
32 minibatches, 4 passes, gradient norm clipped at 1.0); brax's trainer's clip of 0.3 and its
learner's reward scaling of 10. This loop runs one rollout of ``num_envs`` environments per
update, so Playground's 8192 environments x 20 steps per update (256 x 32 trajectories) is
``num_envs=8192``. ``network``, ``width`` and ``depth`` of :class:`ppo.PPOConfig` are not used
(``policy_sizes`` and ``value_sizes`` are).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from repro.models import envs, networks, ppo
from repro.precision import optim
from repro.precision.recipes import Recipe, resolve

OBS_CLIP = 10.0
LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True)
class ContinuousPPOConfig(ppo.PPOConfig):
    env: str = "ant"
    backend: str = "mjx"  # brax envs: mjx | generalized | positional | spring
    episode_length: int = 1000
    action_repeat: int = 1
    obs_key: str = "state"  # the entry of a dict observation (Playground's Go1)
    physics_precision: str | None = None  # None: JAX's default matmul precision
    num_envs: int = 2048
    num_steps: int = 20
    total_timesteps: int = 10_240_000
    policy_sizes: tuple[int, ...] = (32, 32, 32, 32)
    value_sizes: tuple[int, ...] = (256, 256, 256, 256, 256)
    activation: str = "swish"
    init_std: float = 1.0  # the policy's initial standard deviation (brax's init_noise_std)
    critic_recipe: str | None = None  # the critic tower's recipe (None: ``recipe``)
    normalize_observations: bool = True
    reward_scaling: float = 10.0
    num_minibatches: int = 32
    gamma: float = 0.97
    clip_eps: float = 0.3
    lr: float = 3e-4
    anneal_lr: bool = False
    grad_clip: float | None = 1.0

    @property
    def resolved_critic_recipe(self) -> Recipe | None:
        """``critic_recipe`` as a ``Recipe`` (None: the critic runs under ``recipe``)."""
        return None if self.critic_recipe is None else resolve(self.critic_recipe)


def validate(config: Mapping[str, Any] | ContinuousPPOConfig) -> ContinuousPPOConfig:
    """The config as a :class:`ContinuousPPOConfig`, or a one-line ValueError (nothing is
    traced or built here)."""
    c = ContinuousPPOConfig.from_dict(config)
    c = dataclasses.replace(c, policy_sizes=tuple(int(w) for w in c.policy_sizes),
                            value_sizes=tuple(int(w) for w in c.value_sizes))
    envs.check(c.env, c.backend, c.physics_precision)
    if not c.policy_sizes or not c.value_sizes or min(c.policy_sizes + c.value_sizes) < 1:
        raise ValueError(f"policy_sizes {c.policy_sizes} and value_sizes {c.value_sizes} "
                         "need at least one layer each, every width >= 1")
    ppo.check_common(c, ("episode_length", "action_repeat"))  # init_std > 0 too
    if c.critic_recipe is not None:
        c.resolved_critic_recipe  # a one-line error naming the registry's recipes
    return c


# ------------------------------------------------------------------------- Gaussian policy


def gaussian_log_prob(out, actions):
    """log N(actions; mean, exp(log_std)^2), summed over the action axis; ``out = (mean,
    log_std)``."""
    mean, log_std = out
    z = (actions.astype(jnp.float32) - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * LOG_2PI, axis=-1)


def gaussian_entropy(out):
    """Entropy of the diagonal Gaussian, summed over the action axis."""
    _, log_std = out
    return jnp.sum(log_std + 0.5 * (1.0 + LOG_2PI), axis=-1)


def gaussian_sample(key, out):
    mean, log_std = out
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, jnp.float32)


GAUSSIAN = ppo.Policy(gaussian_log_prob, gaussian_entropy)


# ---------------------------------------------------------------- observation statistics


class RunningStats(NamedTuple):
    """Mean and (population) variance of every observation seen, and how many."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def init_stats(size: int) -> RunningStats:
    return RunningStats(jnp.zeros(size, jnp.float32), jnp.ones(size, jnp.float32),
                        jnp.zeros((), jnp.float32))


def update_stats(stats: RunningStats, x) -> RunningStats:
    """Fold the observations ``x [..., D]`` into ``stats`` (Chan et al.'s parallel update; the
    initial unit variance carries no weight: count 0)."""
    x = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    n = jnp.float32(x.shape[0])
    b_mean, b_var = jnp.mean(x, 0), jnp.var(x, 0)
    total = stats.count + n
    delta = b_mean - stats.mean
    mean = stats.mean + delta * n / total
    m2 = stats.var * stats.count + b_var * n + jnp.square(delta) * stats.count * n / total
    return RunningStats(mean, m2 / total, total)


def normalize(stats: RunningStats, x, enabled: bool = True):
    if not enabled:
        return x
    return jnp.clip((x - stats.mean) * jax.lax.rsqrt(stats.var + 1e-8), -OBS_CLIP, OBS_CLIP)


# ----------------------------------------------------------------------------- building


def make_env(c: ContinuousPPOConfig) -> envs.Adapter:
    return envs.make(c.env, c.backend, c.episode_length, c.action_repeat, c.obs_key,
                     c.physics_precision)


def build_network(c: ContinuousPPOConfig, action_size: int) -> networks.GaussianActorCritic:
    return networks.GaussianActorCritic(action_size, c.resolved_recipe, c.policy_sizes,
                                        c.value_sizes, c.activation, math.log(c.init_std),
                                        c.resolved_critic_recipe)


def init_state(c: ContinuousPPOConfig, network, obs_size: int, tx, key):
    """Initial variables (params cast to their storage format) and optimizer state."""
    variables = dict(network.init(key, jnp.zeros((1, obs_size), jnp.float32)))
    variables["params"] = optim.to_storage(variables["params"], c.resolved_recipe.master_weights)
    return variables, tx.init(variables["params"])


def make_act(c: ContinuousPPOConfig, network):
    """``act(variables, obs, key) -> (action, log_prob, value)``: one policy step on
    normalised observations (the rollout's network work)."""
    def act(variables, obs, key):
        out, value = network.apply(variables, obs)
        action = gaussian_sample(key, out)
        return action, gaussian_log_prob(out, action), value

    return act


def make_train(config: Mapping[str, Any] | ContinuousPPOConfig, env: envs.Adapter | None = None,
               final_state: bool = False):
    """Validate ``config`` (one-line ValueError) and return the pure ``train(rng) -> metrics``
    (the metrics of :func:`repro.models.ppo.make_train`, [num_updates] arrays). ``env``: an
    adapter to use instead of building one from the config (tests pass a stand-in).
    ``final_state``: ``train`` returns ``(metrics, (variables, obs_stats))``, the trained
    policy for :func:`make_evaluate`."""
    c = validate(config)
    env = env if env is not None else make_env(c)
    network = build_network(c, env.action_size)
    tx = ppo.make_optimizer(c)
    update_step = ppo.make_update_step(c, network, tx, policy=GAUSSIAN)
    act = make_act(c, network)
    norm = c.normalize_observations

    def critic(variables, obs):
        return network.apply(variables, obs, method="value")

    def env_step(carry, _):
        variables, stats, env_state, raw_obs, ep_ret, rng = carry
        rng, k_act = jax.random.split(rng)
        obs = normalize(stats, raw_obs, norm)
        action, log_prob, value = act(variables, obs, k_act)
        raw_next, env_state, reward, term, trunc, final = env.step(
            env_state, jnp.clip(action, -1.0, 1.0))
        done = term | trunc
        ep_ret = ep_ret + reward
        finished = jnp.where(done, ep_ret, 0.0)
        tr = ppo.Transition(obs, action, log_prob, value, reward * c.reward_scaling, done)
        boot = (normalize(stats, final, norm), term, trunc) if c.bootstrap_truncation else ()
        carry = (variables, stats, env_state, raw_next, jnp.where(done, 0.0, ep_ret), rng)
        return carry, (tr, done, finished, boot, raw_obs)

    def update(carry, _):
        variables, opt_state, stats, env_state, raw_obs, ep_ret, rng = carry
        (_, _, env_state, raw_obs, ep_ret, rng), (traj, done, finished, boot, seen) = (
            jax.lax.scan(env_step, (variables, stats, env_state, raw_obs, ep_ret, rng), None,
                         c.num_steps, unroll=c.unroll))
        rng, k_upd = jax.random.split(rng)
        variables, opt_state = ppo.learn(c, update_step, critic, variables, opt_state, traj,
                                         boot, normalize(stats, raw_obs, norm), k_upd)
        stats = update_stats(stats, seen) if norm else stats
        metrics = ppo.update_metrics(done, finished, variables, opt_state)
        return (variables, opt_state, stats, env_state, raw_obs, ep_ret, rng), metrics

    def train(rng):
        rng, k_init, k_env = jax.random.split(ppo.run_key(rng, c.prng), 3)
        variables, opt_state = init_state(c, network, env.obs_size, tx, k_init)
        raw_obs, env_state = env.reset(k_env, c.num_envs)
        carry = (variables, opt_state, init_stats(env.obs_size), env_state, raw_obs,
                 jnp.zeros((c.num_envs,), jnp.float32), rng)
        (variables, _, stats, *_), metrics = jax.lax.scan(update, carry, None, c.num_updates)
        return (metrics, (variables, stats)) if final_state else metrics

    train.config = c
    train.network = network
    train.env = env
    return train


def make_evaluate(c: ContinuousPPOConfig, env: envs.Adapter, network, num_envs: int = 128):
    """``evaluate(variables, obs_stats, key) -> [num_envs]``: the return of one episode per
    environment (the first, up to ``episode_length`` steps) under the stochastic policy, as
    brax's evaluator measures it (``deterministic_eval=False``)."""
    act = make_act(c, network)

    def evaluate(variables, stats, key):
        k_env, key = jax.random.split(key)
        raw_obs, state = env.reset(k_env, num_envs)

        def step(carry, _):
            state, raw_obs, ret, alive, key = carry
            key, k = jax.random.split(key)
            action, _, _ = act(variables, normalize(stats, raw_obs, c.normalize_observations), k)
            raw_obs, state, reward, term, trunc, _ = env.step(state, jnp.clip(action, -1, 1))
            ret = ret + reward * alive
            return (state, raw_obs, ret, alive * (1.0 - (term | trunc)), key), None

        init = (state, raw_obs, jnp.zeros(num_envs), jnp.ones(num_envs), key)
        (_, _, ret, _, _), _ = jax.lax.scan(step, init, None, c.episode_length)
        return ret

    return evaluate
