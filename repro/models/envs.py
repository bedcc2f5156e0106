"""Brax and MuJoCo Playground environments for PPO: a batched adapter that keeps the final
observation of an episode for the truncation bootstrap.

    env = envs.make("ant")                          # brax ant on MuJoCo MJX physics
    obs, state = env.reset(key, num_envs=64)        # obs [64, 27]
    obs, state, reward, terminated, truncated, final_obs = env.step(state, action)

The interface is the one :mod:`repro.models.ppo` uses for gymnax, batched: after an episode
ends, ``obs`` is already the first observation of the next episode and ``final_obs`` the
observation the step really reached (equal to ``obs`` where nothing ended). brax's and
Playground's own ``AutoResetWrapper`` overwrite it, so this adapter does the auto-reset itself,
on top of brax's ``VmapWrapper`` and ``EpisodeWrapper`` (the step counter and time limit):
``truncated`` is the wrapper's ``info["truncation"]`` (the time limit was reached and the
environment did not end the episode itself), ``terminated = done & ~truncated``. Like brax and
Playground (``full_reset=False``), an ended environment restarts from its cached first state
(physics state and observation; its ``info`` carries over).

Environments (:data:`ENVS`): brax's ant, humanoid, hopper, walker2d and halfcheetah
(``backend``: ``"mjx"`` by default, or brax's ``"generalized"``, ``"positional"``,
``"spring"``); MuJoCo Playground's ``Go1JoystickFlatTerrain`` on MJX's JAX implementation
(``impl="jax"``; Playground's default is Warp).

Go1's model reads its meshes from mujoco_menagerie, which Playground clones from GitHub at run
time. In the feet-only Go1 model the meshes are visual only (no contacts: ``contype=0``,
``conaffinity=0``; every body has an explicit inertial), so :func:`offline_menagerie` writes
placeholder mesh files where Playground looks and the physics is unchanged
(``tests/test_legged.py`` checks this: two different placeholder meshes give bit-identical
MuJoCo rollouts and the XML's masses). A real menagerie checkout is used when one exists.

The physics step runs inside ``jax.named_scope("physics")``, under ``physics_precision``
(``jax.default_matmul_precision``: None keeps JAX's global default; MJX's products are
``Precision.DEFAULT``, i.e. TF32 on NVIDIA GPUs for float32). A network's precision recipe sets
its own precision per GEMM and does not touch the physics'.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct as flax_struct

BRAX_ENVS = ("ant", "humanoid", "hopper", "walker2d", "halfcheetah")
PLAYGROUND_ENVS = ("Go1JoystickFlatTerrain",)
ENVS = BRAX_ENVS + PLAYGROUND_ENVS
BRAX_BACKENDS = ("mjx", "generalized", "positional", "spring")
PRECISIONS = (None, "default", "high", "highest")
PHYSICS_SCOPE = "physics"
GO1_MESHES = ("trunk", "hip", "thigh_mirror", "calf", "thigh")


def check(name: str, backend: str = "mjx", precision: str | None = None) -> None:
    """A one-line ValueError for an unknown environment, backend or physics precision."""
    if name not in ENVS:
        raise ValueError(f"unknown legged env {name!r}; valid: {', '.join(ENVS)}")
    if name in BRAX_ENVS and backend not in BRAX_BACKENDS:
        raise ValueError(f"unknown brax backend {backend!r}; valid: {', '.join(BRAX_BACKENDS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown physics_precision {precision!r}; valid: "
                         f"{', '.join(map(str, PRECISIONS))}")


@flax_struct.dataclass
class EnvState:
    """The wrapped environments' state and the first state each restarts from."""

    inner: Any  # brax / Playground State, batched, after brax's EpisodeWrapper
    first_obs: jax.Array
    first_physics: Any


@dataclass(frozen=True)
class Adapter:
    """A brax / Playground environment, batched, with auto-reset that keeps the final
    observation (module docstring). ``obs_key``: the entry of a dict observation to use
    (Playground's Go1 gives ``state`` and ``privileged_state``)."""

    env: Any  # the raw (unbatched) brax / Playground environment
    name: str
    episode_length: int = 1000
    action_repeat: int = 1
    obs_key: str = "state"
    physics_precision: str | None = None
    physics_field: str = "pipeline_state"  # the simulator state: brax's; Playground: "data"

    @property
    def wrapped(self):
        from brax.envs.wrappers import training

        return training.EpisodeWrapper(training.VmapWrapper(self.env), self.episode_length,
                                       self.action_repeat)

    @functools.cached_property
    def obs_size(self) -> int:
        # from the reset's shapes (brax's observation_size runs a reset op by op)
        obs = jax.eval_shape(self.env.reset, jax.random.PRNGKey(0)).obs
        return int((obs[self.obs_key] if isinstance(obs, dict) else obs).shape[-1])

    @property
    def action_size(self) -> int:
        return int(self.env.action_size)

    def _obs(self, obs):
        return (obs[self.obs_key] if isinstance(obs, dict) else obs).astype(jnp.float32)

    def _precision(self):
        if self.physics_precision is None:
            return contextlib.nullcontext()
        return jax.default_matmul_precision(self.physics_precision)

    def reset(self, key, num_envs: int):
        """``(obs [num_envs, obs_size], EnvState)``; ``key``: any JAX PRNG key (brax wants raw
        threefry key data, drawn from it)."""
        keys = jax.random.bits(key, (num_envs, 2), jnp.uint32)
        with jax.named_scope(PHYSICS_SCOPE), self._precision():
            s = self.wrapped.reset(keys)
        s = _strong(s.replace(done=jnp.zeros(num_envs, jnp.float32),
                              reward=jnp.zeros(num_envs, jnp.float32)))
        return self._obs(s.obs), EnvState(s, s.obs, getattr(s, self.physics_field))

    def step(self, state: EnvState, action):
        """``(obs, state, reward, terminated, truncated, final_obs)`` for ``action
        [num_envs, action_size]`` (float32, clipped to [-1, 1] by the caller)."""
        with jax.named_scope(PHYSICS_SCOPE), self._precision():
            s = self.wrapped.step(state.inner, action)
        done = s.done > 0
        truncated = s.info["truncation"] > 0
        terminated = done & ~truncated

        def where_done(first, now):
            return jnp.where(done.reshape(done.shape + (1,) * (now.ndim - 1)), first, now)

        raw_obs = jax.tree.map(where_done, state.first_obs, s.obs)
        physics = jax.tree.map(where_done, state.first_physics, getattr(s, self.physics_field))
        info = {**s.info, "steps": jnp.where(done, 0.0, s.info["steps"]).astype(jnp.float32)}
        final_obs = self._obs(s.obs)
        s = s.replace(**{self.physics_field: physics}, obs=raw_obs, info=info,
                      done=jnp.zeros_like(s.done, jnp.float32),
                      reward=s.reward.astype(jnp.float32))
        return (self._obs(raw_obs), state.replace(inner=_strong(s)), s.reward, terminated,
                truncated, final_obs)


def _strong(tree):
    """``tree`` without weak types: brax's reset and step states differ in weak types (``done``
    and some metrics), so a jitted step called on a reset state compiles a second time on its
    own output."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.result_type(x)), tree)


def dot_precisions(lowered_text: str, scope: str = PHYSICS_SCOPE) -> dict[str, dict[str, int]]:
    """How many matrix products of a lowered program (``jax.jit(f).lower(...).as_text(
    debug_info=True)``) carry each precision, inside ``jax.named_scope(scope)`` and outside:
    ``{"physics": {"DEFAULT": 56}, "other": {"HIGHEST": 12}}``."""
    names = dict(re.findall(r'^(#loc\d+) = loc\("([^"]*)"', lowered_text, re.M))
    out: dict[str, collections.Counter] = {scope: collections.Counter(),
                                           "other": collections.Counter()}
    for line in lowered_text.splitlines():
        if "stablehlo.dot_general" not in line:
            continue
        prec = re.search(r"precision = \[(\w+)", line)
        loc = re.search(r"loc\((#loc\d+)\)\s*$", line)
        where = names.get(loc.group(1), "") if loc else ""
        key = scope if f"/{scope}/" in f"/{where}" else "other"
        out[key][prec.group(1) if prec else "DEFAULT"] += 1
    return {k: dict(v) for k, v in out.items()}


# ------------------------------------------------------------------------------ building


def _stl(path: Path, scale: float) -> None:
    """A tetrahedron as a binary STL file (a placeholder mesh)."""
    v = [(0, 0, 0), (scale, 0, 0), (0, scale, 0), (0, 0, scale)]
    faces = ((0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3))
    out = bytearray(80) + struct.pack("<I", len(faces))
    for face in faces:
        out += struct.pack("<3f", 0, 0, 0)
        for i in face:
            out += struct.pack("<3f", *v[i])
        out += b"\0\0"
    path.write_bytes(bytes(out))


def offline_menagerie(root: str | Path | None = None, scale: float = 0.01) -> Path:
    """Point Playground at a menagerie folder holding placeholder Go1 meshes (module
    docstring) unless its own checkout exists; returns the folder used. ``root``: where to
    write them (default: a temporary folder); ``scale``: the placeholder's size in metres."""
    from etils import epath
    from mujoco_playground._src import mjx_env

    if (Path(mjx_env.MENAGERIE_PATH) / "unitree_go1").exists():
        return Path(mjx_env.MENAGERIE_PATH)
    root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="menagerie-"))
    assets = root / "unitree_go1" / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    for name in GO1_MESHES:
        _stl(assets / f"{name}.stl", scale)
    mjx_env.MENAGERIE_PATH = epath.Path(root)
    return root


def make_raw(name: str, backend: str = "mjx"):
    """The unbatched brax / Playground environment ``name``."""
    check(name, backend)
    if name in BRAX_ENVS:
        from brax import envs as brax_envs

        return brax_envs.get_environment(name, backend=backend)
    from mujoco_playground import registry

    if name.startswith("Go1"):
        offline_menagerie()
    return registry.load(name, config_overrides={"impl": "jax"})


def make(name: str, backend: str = "mjx", episode_length: int = 1000, action_repeat: int = 1,
         obs_key: str = "state", physics_precision: str | None = None) -> Adapter:
    """The :class:`Adapter` of environment ``name`` (:data:`ENVS`)."""
    check(name, backend, physics_precision)
    return Adapter(make_raw(name, backend), name, int(episode_length), int(action_repeat),
                   obs_key, physics_precision,
                   "pipeline_state" if name in BRAX_ENVS else "data")
