"""Checks of the ``repro`` command line, made before anything runs or is written: argparse
types for numbers and names, the ``--hardware`` label against the detected device, and the
refusal of a full-profile study on a CPU without ``--yes``. Each failure is one line naming
the argument (``repro: error: ...``, exit status 2)."""

from __future__ import annotations

import argparse
import math


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


def check_label(args) -> None:
    """``--hardware``: a name for this machine, checked against the detected device
    (:func:`repro.hardware.check_label`)."""
    if args.hardware is not None:
        from repro import hardware

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
