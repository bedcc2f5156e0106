"""Actor-critic networks whose every Dense / Conv runs under a precision recipe.

* :class:`MLPActorCritic` -- separate actor and critic towers of ``depth`` x ``width`` (any width
  up to 4096 and beyond), tanh by default, PPO gains (PureJaxRL / CleanRL).
* :class:`GaussianActorCritic` -- continuous actions (legged robots): an actor tower giving the
  mean of a diagonal Gaussian, a learned state-independent log standard deviation, and a
  critic tower; the towers' hidden sizes are free (brax's 4 x 32 policy and 5 x 256 value,
  MuJoCo Playground's 512-256-128), swish by default as in both.
* :class:`CNNActorCritic` -- ``kind="minatar"``: one 3x3 conv (16 channels) on MinAtar's 10x10xC
  frames, a 128-wide Dense, actor and critic heads (the MinAtar paper's network).
  ``kind="large"``: the Nature-DQN conv stack (32x8x8/4, 64x4x4/2, 64x3x3/1, Dense 512) for
  pixel-like inputs; ``upsample`` repeats each input pixel (MinAtar 10x10 -> 80x80 with 8), so a
  gymnax task can drive a pixel-sized network.

The recipe's ``scope`` "default": for a QUANTIZED recipe (fp8-*, mxfp8, nvfp4) the first layer
of each tower and the output heads run as a dense GEMM in the recipe's compute dtype (BF16)
instead of FP8. This is what Transformer Engine users, DeepSeek-V3 and NVIDIA's NVFP4 recipe do
(first/last layers stay wide): the first layer has a tiny contraction (4 inputs for CartPole)
where FP8 saves nothing and costs accuracy, and the heads produce logits/values. Unquantized
recipes (fp32/tf32/bf16/fp16) run every layer in their own precision. Scope "all" (the recipe
``fp8-all-layers``) puts every layer in FP8 (an ablation).

Initialisation: PPO's per-layer gains (sqrt(2) hidden, 0.01 policy head, 1.0 value head) on a
Gaussian of variance gain^2 / fan_in, not orthogonal matrices: orthogonal init needs a QR
decomposition, and under ``jax.vmap`` over seeds XLA's CPU LAPACK QR kernel deadlocked here
(JAX 0.10.2: ``lapack_sorgqr_ffi`` waiting in ``ParallelBatchMap``), so the smoke profile and
tests could hang. The forward scale per layer is the same.

Outputs (logits, value) are float32 whatever the recipe; the observation is cast to float32
first (MinAtar frames are booleans).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax.numpy as jnp
from flax import linen as nn

from repro.precision import layers
from repro.precision.recipes import Recipe, resolve

NETWORKS = ("mlp", "cnn", "cnn-large")
ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "swish": nn.swish}


def io_recipe(recipe: Recipe) -> Recipe:
    """The recipe of first/last layers: a dense GEMM in the compute dtype for quantized recipes
    of scope "default"; the recipe itself for scope "all"."""
    if recipe.scope == "default" and recipe.quantized:
        return recipe.replace(name=recipe.name + "/io-dense", gemm="dense", scaling="none")
    return recipe


def _has_field(cls, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(cls)}


def gain_init(gain: float):
    """Gaussian with variance gain^2 / fan_in (see the module docstring for why not orthogonal)."""
    return nn.initializers.variance_scaling(gain * gain, "fan_in", "normal")


def dense(features: int, recipe: Recipe, scale: float, name: str | None = None):
    kw = {"kernel_init": gain_init(scale)} if _has_field(
        layers.Dense, "kernel_init") else {}
    return layers.Dense(features, recipe=recipe, name=name, **kw)


def conv(features: int, kernel: int, stride: int, recipe: Recipe, name: str | None = None):
    kw = {"kernel_init": gain_init(math.sqrt(2))} if _has_field(
        layers.Conv, "kernel_init") else {}
    return layers.Conv(features, kernel_size=(kernel, kernel), strides=(stride, stride),
                       padding="VALID", recipe=recipe, name=name, **kw)


class Tower(nn.Module):
    """``depth`` hidden Dense layers of ``width`` then an output Dense of ``out``; ``sizes``
    (one width per hidden layer), when given, replaces ``width`` and ``depth``."""

    width: int
    depth: int
    out: int
    recipe: Recipe
    first: Recipe
    last: Recipe
    out_scale: float = 1.0
    activation: str = "tanh"
    sizes: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for i, w in enumerate(self.sizes or (self.width,) * self.depth):
            x = act(dense(w, self.first if i == 0 else self.recipe, math.sqrt(2),
                          name=f"hidden_{i}")(x))
        return dense(self.out, self.last, self.out_scale, name="out")(x)


class MLPActorCritic(nn.Module):
    num_actions: int
    recipe: Recipe
    width: int = 64
    depth: int = 2
    activation: str = "tanh"
    obs_ndim: int = 1  # trailing observation axes, flattened (MinAtar frames: 3)
    separate_towers = True  # no parameter is shared by the actor and the critic (not a field)

    def setup(self):
        r = self.recipe
        io = io_recipe(r)
        first = io
        self.actor = Tower(self.width, self.depth, self.num_actions, r, first, io, 0.01,
                           self.activation)
        self.critic = Tower(self.width, self.depth, 1, r, first, io, 1.0, self.activation)

    def _flat(self, obs):
        obs = jnp.asarray(obs, jnp.float32)
        return obs.reshape(*obs.shape[:obs.ndim - self.obs_ndim], -1)

    @property
    def widest(self) -> int:
        return self.width

    def __call__(self, obs):
        return self.policy(obs), self.value(obs)

    def policy(self, obs):
        return self.actor(self._flat(obs)).astype(jnp.float32)

    def value(self, obs):
        return self.critic(self._flat(obs))[..., 0].astype(jnp.float32)


class GaussianActorCritic(nn.Module):
    """Continuous-action actor-critic: ``(mean [..., A], log_std [..., A]), value [...]``.

    The actor tower (``policy_sizes``) gives the Gaussian's mean; ``log_std`` is one learned
    parameter per action dimension (not a function of the observation), starting at
    ``init_log_std``; the critic tower (``value_sizes``) gives the value. Layers and scope as
    :class:`MLPActorCritic` (first layer and heads in the compute dtype for quantized recipes
    of scope "default"); the log standard deviation is a parameter, not a GEMM.
    ``critic_recipe`` (None: ``recipe``) runs the critic tower under another recipe, e.g. a
    BF16 or FP8 policy with an FP32 value function.
    """

    action_size: int
    recipe: Recipe
    policy_sizes: tuple[int, ...] = (32, 32, 32, 32)
    value_sizes: tuple[int, ...] = (256, 256, 256, 256, 256)
    activation: str = "swish"
    init_log_std: float = 0.0
    critic_recipe: Recipe | None = None
    separate_towers = True  # no parameter is shared by the actor and the critic (not a field)

    def setup(self):
        r = self.recipe
        io = io_recipe(r)
        rc = r if self.critic_recipe is None else self.critic_recipe
        self.actor = Tower(0, 0, self.action_size, r, io, io, 0.01, self.activation,
                           tuple(self.policy_sizes))
        self.critic = Tower(0, 0, 1, rc, io_recipe(rc), io_recipe(rc), 1.0, self.activation,
                            tuple(self.value_sizes))
        self.log_std = self.param("log_std", nn.initializers.constant(self.init_log_std),
                                  (self.action_size,))

    @property
    def widest(self) -> int:
        return max((*self.policy_sizes, *self.value_sizes))

    def __call__(self, obs):
        return self.policy(obs), self.value(obs)

    def policy(self, obs):
        mean = self.actor(jnp.asarray(obs, jnp.float32)).astype(jnp.float32)
        log_std = jnp.broadcast_to(jnp.asarray(self.log_std, jnp.float32), mean.shape)
        return mean, log_std

    def value(self, obs):
        return self.critic(jnp.asarray(obs, jnp.float32))[..., 0].astype(jnp.float32)


class CNNActorCritic(nn.Module):
    num_actions: int
    recipe: Recipe
    kind: str = "minatar"  # "minatar" | "large"
    upsample: int = 1
    width: int = 0  # Dense width after the convs; 0: 128 (minatar) / 512 (large)

    def setup(self):
        r = self.recipe
        io = io_recipe(r)
        if self.kind == "minatar":
            self.convs = [conv(16, 3, 1, io, name="conv_0")]
            w = self.width or 128
        elif self.kind == "large":
            self.convs = [conv(32, 8, 4, io, name="conv_0"), conv(64, 4, 2, r, name="conv_1"),
                          conv(64, 3, 1, r, name="conv_2")]
            w = self.width or 512
        else:
            raise ValueError(f"unknown CNN kind {self.kind!r}; valid: minatar, large")
        self.torso = dense(w, r, math.sqrt(2), name="torso")
        self.pi = dense(self.num_actions, io, 0.01, name="pi")
        self.v = dense(1, io, 1.0, name="v")

    def _features(self, obs):
        x = jnp.asarray(obs, jnp.float32)
        if x.ndim < 4:
            raise ValueError(f"CNN needs [batch, H, W, C] observations, got shape {x.shape}")
        lead = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:])
        if self.upsample > 1:
            x = jnp.repeat(jnp.repeat(x, self.upsample, axis=1), self.upsample, axis=2)
        for c in self.convs:
            x = nn.relu(c(x))
        x = x.reshape(x.shape[0], -1)
        return nn.relu(self.torso(x)), lead

    def __call__(self, obs):
        h, lead = self._features(obs)
        logits = self.pi(h).astype(jnp.float32)
        value = self.v(h)[..., 0].astype(jnp.float32)
        return logits.reshape(*lead, -1), value.reshape(lead)

    def value(self, obs):
        return self(obs)[1]


def make_network(network: str, num_actions: int, recipe: Recipe | str, *, width: int = 64,
                 depth: int = 2, activation: str = "tanh",
                 upsample: int | None = None, obs_shape: Sequence[int] | None = None):
    """The actor-critic named ``network`` ("mlp", "cnn", "cnn-large").

    For "cnn" ``width`` is the Dense width after the conv (0 or 64 -> 128, the MinAtar network)
    and for "cnn-large" too (0 or 64 -> 512). ``upsample`` (cnn-large): default 8 for frames
    smaller than 40 pixels, so MinAtar's 10x10 becomes 80x80. ``recipe``: a ``Recipe`` or its
    name (resolved here, once; the networks' modules take the ``Recipe``).
    """
    recipe = resolve(recipe)
    if network == "mlp":
        return MLPActorCritic(num_actions, recipe, width, depth, activation,
                              len(obs_shape) if obs_shape is not None else 1)
    if network in ("cnn", "cnn-large"):
        kind = "minatar" if network == "cnn" else "large"
        if upsample is None:
            small = obs_shape is not None and len(obs_shape) == 3 and obs_shape[0] < 40
            upsample = 8 if (kind == "large" and small) else 1
        w = 0 if width == 64 else width
        return CNNActorCritic(num_actions, recipe, kind, upsample, w)
    raise ValueError(f"unknown network {network!r}; valid: {', '.join(NETWORKS)}")
