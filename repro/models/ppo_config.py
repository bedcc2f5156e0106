"""The configuration of the PPO of :mod:`repro.models.ppo`: :class:`PPOConfig` and its checks.

Every hyperparameter is a field of :class:`PPOConfig` (CleanRL's habit: all visible at the top).
The precision recipe (``repro.precision.recipes``) goes to every Dense/Conv of the network
(``repro.models.networks``); the optimizer is ``repro.precision.optim.make_optimizer`` (master-weight storage,
Kahan, gradient and weight clipping, skip-nonfinite); FP16 recipes get dynamic loss scaling.
Delayed-scaling FP8 state (the ``FP8_META`` collection) is updated through the gradient by
``repro.precision.layers.apply_gradients``.

Configuration errors (unknown env, recipe, network, prng; an unroll < 1; minibatches that do not
divide the batch; fewer steps than one update) raise ``ValueError`` with one line, in
``make_train``, before anything is traced or compiled.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from repro.models import networks, sharding
from repro.precision import optim
from repro.precision.recipes import Recipe, resolve
from repro.schema import CHECK, NONNEGATIVE, POSITIVE, Range, suggest, type_name


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
            raise ValueError(f"unknown PPO config key(s) {bad}{suggest(bad[0], fields)}; "
                             f"valid keys: {sorted(fields)}")
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
    def resolved_recipe(self) -> Recipe:
        """``recipe`` as a ``Recipe`` (a registry name or a variant, resolved)."""
        return resolve(self.recipe)

    @property
    def uses_loss_scale(self) -> bool:
        return self.resolved_recipe.loss_scaling if self.loss_scale is None else self.loss_scale

    def optimizer_config(self) -> dict[str, Any]:
        r = self.resolved_recipe
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
             "unroll", "update_unroll", "epoch_unroll", "episode_length", "action_repeat",
             "init_std")


_UNIT = ("gamma", "gae_lambda")  # in [0, 1]


def _range(name: str, v: Any) -> Range:
    """The numbers field ``name`` (value ``v``) may hold: sizes and rates > 0 (every item of a
    tuple too), discounts in [0, 1], any other number >= 0."""
    return (POSITIVE if name in _POSITIVE or isinstance(v, tuple) else
            Range(0, 1) if name in _UNIT else NONNEGATIVE)


def _check_values(c: PPOConfig) -> None:
    """Each field of its annotated type (an int for an int field, a finite number for a float
    one...), sizes and rates > 0, coefficients >= 0, discounts in [0, 1]: one line naming it."""
    hints = typing.get_type_hints(type(c))
    for f in dataclasses.fields(c):
        v, hint, rule = getattr(c, f.name), hints[f.name], _range(f.name, getattr(c, f.name))
        items = v if isinstance(v, tuple) else (v,)
        if not (CHECK.conforms(v, hint) and all(
                x is None or isinstance(x, (bool, str)) or x in rule for x in items)):
            kinds = typing.get_args(hint) or (hint,)
            raise ValueError(f"PPO config {f.name}={v!r}: expected {type_name(hint)}"
                             + ("" if str in kinds or bool in kinds else f", {rule}"))


def check_common(c: PPOConfig, positive: tuple[str, ...] = ()) -> None:
    """The checks every PPO configuration shares (field types and ranges, recipe, activation,
    prng, counts >= 1 -- ``positive`` names more --, minibatches dividing the batch, at least
    one update): a one-line ValueError."""
    _check_values(c)
    try:
        c.resolved_recipe  # a registry name or a variant 'base:field=value,...'
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
