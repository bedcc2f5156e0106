"""PureJaxRL's ``ppo.py`` made importable from a checkout (:func:`load`), for the
``rl_purejaxrl`` study (:mod:`repro.experiments.rl_purejaxrl.measure`) to run beside ours.

PureJaxRL is not a package and its code is not redistributed here: point ``--purejaxrl DIR`` at a
checkout of https://github.com/luchris429/purejaxrl (the folder that holds ``purejaxrl/ppo.py``).
Three adapters let that ``ppo.py`` run on this repository's stack; none changes what it computes:

- gymnax >= 1.0 steps return ``(obs, state, reward, terminated, truncated, info)``; ``ppo.py``
  and its wrappers expect gymnax 0.x's ``(obs, state, reward, done, info)``. ``gymnax.make`` is
  seen through :class:`FiveTupleStep`: ``done = terminated | truncated`` and ``info`` without the
  three keys gymnax 1.0 added (so PureJaxRL's per-step metrics are as large as on gymnax 0.x).
- ``distrax`` (for ``Categorical``) does not import under current JAX (its TensorFlow-Probability
  dependency fails); where it fails, :func:`distrax_stand_in` provides ``Categorical`` with the
  three methods ``ppo.py`` calls, written as distrax does (``jax.random.categorical``,
  ``log_softmax``).
- ``purejaxrl/wrappers.py`` imports ``brax`` (``brax.envs``, ``brax.envs.wrappers.training``) and
  ``navix`` for wrappers CartPole does not use, and ``chex`` for type annotations only; where
  one is missing, a package whose modules answer every attribute with ``typing.Any`` stands in.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

URL = "https://github.com/luchris429/purejaxrl"
GYMNAX_1_INFO = ("terminated", "truncated", "final_observation")


class FiveTupleStep:
    """A gymnax >= 1.0 environment with gymnax 0.x's ``step`` signature (see module doc)."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        out = self._env.step(key, state, action, params)
        if len(out) == 5:  # already gymnax 0.x
            return out
        obs, state, reward, terminated, truncated, info = out
        info = {k: v for k, v in info.items() if k not in GYMNAX_1_INFO}
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def distrax_stand_in() -> types.ModuleType:
    """A module ``distrax`` with ``Categorical(logits=...)``: ``sample``, ``log_prob``,
    ``entropy`` -- the part of distrax that PureJaxRL's discrete PPO uses."""

    class Categorical:
        def __init__(self, logits):
            self.logits = logits

        def sample(self, seed):
            return jax.random.categorical(seed, self.logits)

        def log_prob(self, value):
            logp = jax.nn.log_softmax(self.logits)
            return jnp.take_along_axis(logp, jnp.asarray(value)[..., None].astype(jnp.int32),
                                       axis=-1)[..., 0]

        def entropy(self):
            logp = jax.nn.log_softmax(self.logits)
            return -jnp.sum(jnp.exp(logp) * logp, axis=-1)

    mod = types.ModuleType("distrax")
    mod.Categorical = Categorical
    mod.REPRO_STAND_IN = True
    return mod


def _ensure_importable(name: str, make) -> str | None:
    """Import ``name``; where that fails, put ``make()`` (a module, or a package: a dict of
    dotted names to modules) in its place. Returns a note or None."""
    try:
        importlib.import_module(name)
        return None
    except Exception as e:  # ImportError, or a dependency that breaks at import time
        made = make()
        sys.modules.update(made if isinstance(made, dict) else {name: made})
        return f"{name} stand-in ({type(e).__name__})"


class _AnyTypes(types.ModuleType):
    """A module that answers every public attribute with ``typing.Any``."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Any


def _any_package(*names: str) -> dict[str, types.ModuleType]:
    """``_AnyTypes`` modules for dotted ``names``, each set as an attribute of its parent
    (``brax.envs.wrappers.training`` gives brax, brax.envs, brax.envs.wrappers and the leaf)."""
    mods: dict[str, types.ModuleType] = {}
    for dotted in names:
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            full = ".".join(parts[:i])
            if full not in mods:
                mods[full] = _AnyTypes(full)
                if i > 1:
                    setattr(mods[".".join(parts[:i - 1])], parts[i - 1], mods[full])
    return mods


def checkout_dir(path: str | Path) -> Path:
    """The folder holding ``purejaxrl/ppo.py`` (``path`` or its parent); a one-line
    ``ValueError`` if there is none."""
    path = Path(path).expanduser().resolve()
    if (path / "ppo.py").is_file() and path.name == "purejaxrl":
        path = path.parent
    if not (path / "purejaxrl" / "ppo.py").is_file():
        raise ValueError(f"--purejaxrl {path}: no purejaxrl/ppo.py there; pass the folder of "
                         f"a checkout of {URL}")
    return path


def load(path: str | Path):
    """Import PureJaxRL's ``ppo`` module from a checkout; returns (module, notes on adapters)."""
    path = checkout_dir(path)
    notes = [n for n in (
        _ensure_importable("distrax", distrax_stand_in),
        _ensure_importable("brax", lambda: _any_package("brax.envs.wrappers.training")),
        _ensure_importable("navix", lambda: _any_package("navix")),
        _ensure_importable("chex", lambda: _any_package("chex"))) if n]
    # ppo.py imports its wrappers as a top-level module (``from wrappers import ...``)
    for d in (path / "purejaxrl", path):
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    module = importlib.import_module("purejaxrl.ppo")
    import gymnax

    real_make = gymnax.make

    def make(name, **kw):
        env, params = real_make(name, **kw)
        return FiveTupleStep(env), params

    module.gymnax = types.SimpleNamespace(make=make)
    notes.append("gymnax>=1.0 step seen as 0.x (done = terminated | truncated)")
    return module, notes
