"""What ``params.yaml``'s ``legged`` section may hold and how a cell reads it: the section as
one environment runs it (:func:`for_env`), a cell's PPO configuration (:func:`config`), the
schema and its check before the first cell runs (:func:`check`), and the physics runs and
quality variants the section names (the study: :mod:`repro.experiments.legged.measure`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from repro.config import Section, check_mapping, fraction, positive
from repro.config import recipe_names as recipe_field
from repro.models import ppo_continuous as pc
from repro.schema import suggest

EXPERIMENT = "legged"
CLAIMS = ("A11",)


PARTS = ("physics", "random", "speed", "quality", "peer")


def for_env(p: Mapping[str, Any], env: str) -> dict[str, Any]:
    """The section as environment ``env`` runs it. In ``envs.<env>``, a key naming a part
    (:data:`PARTS`) is merged over the section's part (null drops the part for this env);
    the other keys are PPO overrides, applied over the section's ``ppo``."""
    own = dict(p["envs"][env] or {})
    out = dict(p)
    for part in PARTS:
        if part in own:
            out[part] = (None if own[part] is None
                         else {**dict(p.get(part) or {}), **dict(own[part])})
    out["ppo"] = {**dict(p.get("ppo") or {}),
                  **{k: v for k, v in own.items() if k not in PARTS}}
    return out


def config(p: Mapping[str, Any], env: str, part: str, size: str | None = None,
           recipe: str = "fp32", **over) -> pc.ContinuousPPOConfig:
    """The PPO configuration of a cell: ``ppo`` of the section, then the env's overrides,
    the part's (``speed``, ``quality``, ``peer``) ``ppo``, the size's layer widths, ``over``."""
    p = for_env(p, env)
    part_p = p.get(part) or {}
    sizes = p["sizes"][size] if size is not None else {}
    return pc.validate({**p["ppo"], **dict(part_p.get("ppo") or {}), **dict(sizes),
                        "env": env, "recipe": recipe, **over})


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Physics:
    num_envs: tuple[int, ...] = positive()
    precisions: tuple[str, ...]
    steps: int = positive()
    repeats: int = positive()
    loop_at: tuple[int, ...] = ()
    precision_at: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Speed:
    num_envs: int = positive()
    updates: int = positive()
    repeats: int = positive()
    sizes: tuple[str, ...] = ()
    recipes: tuple[str, ...] = recipe_field(())
    paired: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Quality:
    seeds: int = positive()
    vmap_seeds: bool = True
    sizes: tuple[str, ...] = ()
    recipes: tuple[str, ...] = recipe_field(())
    critic_recipes: tuple[str, ...] = recipe_field(())
    more_seeds: dict[str, int] = dataclasses.field(default_factory=dict)
    ppo: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Random:
    num_envs: int = positive(64)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Peer:
    size: str = "brax"
    recipe: str = "tf32"
    seeds: tuple[int, ...] = (0,)
    evals: int = positive(5)
    eval_envs: int = positive(128)
    ppo: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schema(Section):
    """What ``params.yaml``'s ``legged`` section may hold (the study reads it as a mapping;
    the PPO overrides are checked by :func:`check` through the PPO config)."""

    envs: dict[str, dict[str, Any] | None]
    sizes: dict[str, dict[str, tuple[int, ...]]] = positive()
    ppo: dict[str, Any] = dataclasses.field(default_factory=dict)
    physics: _Physics
    speed: _Speed | None = None
    quality: _Quality | None = None
    random: _Random | None = None
    peer: _Peer | None = None
    last_fraction: float = fraction(0.1)
    compiler_options: dict[str, Any] | None = None


def check(p: Mapping[str, Any]) -> None:
    """Every cell's configuration, before the first cell runs (one-line ValueError)."""
    where = f"params.yaml: legged.{p.get('profile')}"
    check_mapping(dict(p), Schema, where)
    def checked(env_name, part, *args):
        try:
            config(p, env_name, part, *args)
        except ValueError as e:  # the PPO config of a cell: name where its keys come from
            raise ValueError(f"{where}: the PPO config of env {env_name}, part {part} (keys of "
                             f"ppo, envs.{env_name} and {part}.ppo): {e}") from None

    for env_name in p["envs"]:
        pe = for_env(p, env_name)
        check_mapping(pe, Schema, f"{where}.envs.{env_name}")
        checked(env_name, "physics")
        for part in ("speed", "quality"):
            for size in (pe.get(part) or {}).get("sizes", []):
                if size not in p["sizes"]:
                    raise ValueError(f"legged.{part}.sizes: unknown size {size!r}"
                                     f"{suggest(size, p['sizes'])}; valid: "
                                     f"{', '.join(p['sizes'])}")
                for recipe in pe[part]["recipes"]:
                    checked(env_name, part, size, recipe)
        q = pe.get("quality") or {}
        known = set(quality_variants(q))
        for v, n in dict(q.get("more_seeds") or {}).items():
            if v not in known:
                raise ValueError(f"legged.quality.more_seeds ({env_name}): unknown variant "
                                 f"{v!r}{suggest(v, sorted(known))}; valid: "
                                 f"{', '.join(sorted(known))}")
            if int(n) % int(q["seeds"]) or int(n) < int(q["seeds"]):
                raise ValueError(f"legged.quality.more_seeds ({env_name}): {v}: {n} seeds is not "
                                 f"a multiple of quality.seeds ({q['seeds']})")
        if pe.get("peer"):
            checked(env_name, "peer", pe["peer"].get("size", "brax"),
                    pe["peer"].get("recipe", "tf32"))


def physics_runs(q: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(num_envs, precision) of the physics cells: every ``num_envs`` at the first precision,
    the others at the sizes of ``precision_at`` (default: all)."""
    first, *others = q["precisions"]
    at = q.get("precision_at", q["num_envs"])
    return ([(int(n), first) for n in q["num_envs"]]
            + [(int(n), prec) for prec in others for n in q["num_envs"] if n in at])


def quality_variants(q: Mapping[str, Any]) -> dict[str, tuple[str, str | None]]:
    """The quality part's variants in cell order: name -> (policy recipe, critic recipe or
    None): each recipe, then the same with each other recipe of ``critic_recipes`` as critic."""
    out = {}
    for r in q.get("recipes", []):
        out[r] = (r, None)
        for cr in q.get("critic_recipes", []):
            if cr != r:
                out[f"{r}+critic-{cr}"] = (r, cr)
    return out
