"""Parameters from ``params.yaml``: the profile and each experiment's sizes.

``params.yaml`` has a top-level ``profile`` (``smoke``: CPU-sized, minutes; ``full``: the GPU
study; ``auto``: ``full`` when a GPU is present) and one section per experiment, each with
``smoke`` and ``full`` sub-sections (and optionally ``common``, shared by both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PROFILES = ("smoke", "full", "auto")


class ConfigError(ValueError):
    """A malformed params.yaml or an invalid parameter: one clear line."""


def params_path() -> Path:
    from repro.results import repo_root

    return repo_root() / "params.yaml"


def load_params(path: str | Path | None = None) -> dict[str, Any]:
    path = Path(path or params_path())
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    resolve_profile(data.get("profile", "smoke"))  # validate early
    return data


def resolve_profile(profile: str) -> str:
    """``auto`` -> ``full`` on a GPU, else ``smoke``; anything else must be a known profile."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; valid profiles: {', '.join(PROFILES)}")
    if profile == "auto":
        import jax

        return "full" if jax.default_backend() == "gpu" else "smoke"
    return profile


def stage_params(section: str, profile: str | None = None,
                 params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parameters of one experiment for one profile (``common`` merged under it)."""
    params = params if params is not None else load_params()
    profile = resolve_profile(profile or params.get("profile", "smoke"))
    if section not in params or not isinstance(params[section], dict):
        raise ConfigError(f"params.yaml has no section {section!r}; sections: "
                          f"{', '.join(k for k, v in params.items() if isinstance(v, dict))}")
    sec = params[section]
    if profile not in sec:
        raise ConfigError(f"params.yaml section {section!r} has no {profile!r} profile")
    out = {**sec.get("common", {}), **sec[profile]}
    out["profile"] = profile
    return out
