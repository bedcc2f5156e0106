"""Checks of the ``repro`` command line, made before anything runs or is written: argparse
types for numbers and names, the ``--hardware`` label against the detected device, the
refusal of a full-profile study on a CPU without ``--yes``, the profile, the experiment's
name. Each failure is one line naming the argument (``repro: error: ...``, exit status 2).
And what every command group shares to say what it did (:func:`one_line`, :func:`rel`,
:func:`report`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from repro.checkout import repo_root
from repro.config import ConfigError


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


def number(kind: type, low: float, what: str):
    """An argparse type: a finite ``kind`` (int or float) > ``low``, else one line."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if not (math.isfinite(v) and v > low):
            raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
        return v
    return parse


def text(value: str) -> str:
    """An argparse type: a value that is not blank."""
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value")
    return value


def split(values: list[str] | None, option: str = "--recipe") -> list[str] | None:
    """Repeated and comma-separated names as one list (None: the option was not given)."""
    if not values:
        return None
    out = [v.strip() for item in values for v in item.split(",") if v.strip()]
    if not out:
        raise UsageError(f"{option}: no name given (got {values!r})")
    return out


def parse_params(pairs: list[str] | None) -> dict[str, Any]:
    """``-p KEY=VALUE`` pairs as a mapping, each value parsed as YAML."""
    import yaml

    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-p expects key=value with a Python identifier as key, got {pair!r}")
        if key in out:
            raise UsageError(f"-p {key}: given twice")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def notebook_profile(option: str | None, param: Any) -> str | None:
    """The profile of ``repro notebook``: ``--profile`` or ``-p profile=``, not two that
    disagree; checked (:func:`repro.config.resolve_profile`) where it is named."""
    from repro.config import ConfigError, resolve_profile

    if param is not None and option is not None and param != option:
        raise UsageError(f"-p profile={param} and --profile {option} disagree; give one")
    chosen = option if option is not None else param
    try:
        return None if chosen is None else resolve_profile(chosen)
    except ConfigError as e:
        raise UsageError(f"{'--profile' if option is not None else '-p profile'}: {e}") from None


def check_label(args) -> None:
    """``--hardware``: a name for this machine, not a path (:func:`repro.results.slug`),
    checked against the detected device (:func:`repro.hardware.check_label`)."""
    if args.hardware is not None:
        from repro import hardware, results

        results.slug(args.hardware)
        hardware.check_label(args.hardware)


def check_cpu_full(args, profile: str, experiments: list[str]) -> None:
    """A full-profile study is sized for a GPU: on a CPU it runs only with ``--yes``; the
    refusal says roughly how long it would take (:func:`repro.hardware.cpu_estimate`)."""
    from repro import hardware, results

    if profile != "full" or args.yes or hardware.detect().backend != "cpu":
        return
    name, *more = experiments
    also = f" (and {len(more)} more experiment(s))" if more else ""
    raise UsageError(f"repro record {args.experiment} --profile full on a CPU: the full profile "
                     f"is sized for a GPU; {name}: "
                     f"{hardware.cpu_estimate(name, results.results_dir())}{also}; use "
                     "--profile smoke, or add --yes to run it here anyway")


# Committed folders: evidence (results/, written only by `repro record --profile full`) and the
# outputs the notebooks regenerate from it. No path a user sets may point into them.
def one_line(msg: Any) -> str:
    return " ".join(str(msg).split())


def rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path)


def resolved_profile(arg: str | None) -> str:
    """``--profile`` or params.yaml's ``profile``, ``auto`` resolved; params.yaml checked."""
    from repro import config

    params = config.load_params()
    if arg is None:
        return config.resolve_profile(params.get("profile", "smoke"))
    try:
        return config.resolve_profile(arg)
    except ConfigError as e:
        raise UsageError(f"--profile: {e}") from None


def check_experiment(name: str) -> None:
    from repro import studies

    if name not in studies.EXPERIMENTS:
        hint = " (it is traced: repro trace)" if name in studies.TRACES else ""
        raise UsageError(f"unknown experiment {name!r}{hint}; valid experiments: "
                         f"{', '.join(studies.EXPERIMENTS)} (or all)")


def check_numerics(profile: str) -> None:
    """Full-profile records are evidence: refuse to write them on a device where a rounding
    the experiments rely on is skipped (``repro.precision.check``; a one-line error)."""
    if profile == "full":
        from repro.precision import check as numerics

        numerics.require()


def report(name: str, profile: str, out, root: Path) -> str:
    for path in out.written:
        print(path)
    return (f"{name} [{profile}]: wrote {len(out.written)} cell(s) under {root}"
            + (f", {len(out.skipped)} already recorded (--force redoes them)" if out.skipped
               else "") + (f"; stopped: {out.stopped}" if out.stopped else ""))
