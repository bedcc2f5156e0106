"""The studies' registry and what they share (the runner, timing, the measuring kit). Each
experiment's study is its package's ``measure`` module (``repro/experiments/<name>/measure.py``),
which exports ``STUDY`` (:class:`repro.studies.runner.Study`); :data:`EXPERIMENTS` lists them,
from :mod:`repro.catalogue`.

    from repro import studies
    studies.record("gemm", "smoke")            # what `repro record gemm --profile smoke` does
    studies.params("rl_throughput", "full")    # a study's typed params.yaml section
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from repro import catalogue

# experiment (the records' folder) -> module, imported when first used. `repro record` runs
# these (`all`: in this order), each with its params.yaml section (repro.catalogue).
EXPERIMENTS: dict[str, str] = {e.name: e.study for e in catalogue.RECORDED}
# `repro trace`: studies whose parameters come from the command line.
TRACES: dict[str, str] = {e.name: e.study for e in catalogue.EXPERIMENTS if not e.recorded}
# record folders written by a study of another name (its determinism repeats)
RECORDED_BY: dict[str, str] = catalogue.RECORDED_BY


def of_records(folder: str) -> str:
    """The experiment whose study writes the records of ``folder`` (``results/HW/FOLDER``)."""
    return RECORDED_BY.get(folder, folder)


def study(name: str):
    """The :class:`~repro.studies.runner.Study` of experiment ``name``; a one-line
    ``ValueError`` naming the valid ones if there is none."""
    module = EXPERIMENTS.get(name) or TRACES.get(name)
    if module is None:
        raise ValueError(f"unknown experiment {name!r}; valid experiments: "
                         f"{', '.join(EXPERIMENTS)}")
    return importlib.import_module(module).STUDY


def params(name: str, profile: str | None = None, raw: dict[str, Any] | None = None):
    """Experiment ``name``'s ``params.yaml`` section for ``profile``, typed and checked
    (``raw``: the whole params.yaml, already loaded)."""
    from repro import config

    s = study(name)
    if s.params_section is None:
        raise ValueError(f"{name} has no params.yaml section: its parameters come from the "
                         "command line")
    return config.section(s.params_section, s.params, profile, raw)


def check_params(name: str, raw: dict[str, Any] | None = None) -> None:
    """Experiment ``name``'s ``params.yaml`` section typed and checked for every profile it
    has (a bad ``common`` value hides behind one profile's override and breaks the other)."""
    from repro import config

    s = study(name)
    if s.params_section is None:
        return
    raw = raw if raw is not None else config.load_params()
    for profile in ("smoke", "full"):
        if profile in (raw.get(s.params_section) or {}):
            p = config.section(s.params_section, s.params, profile, raw)
            if s.params is None and s.check is not None:  # read as a mapping: its own check
                s.check(p)


def with_inputs(name: str, p: Any, inputs: dict[str, Any] | None) -> Any:
    """``p`` with the values of command-line inputs set (``{"purejaxrl": DIR}``); a one-line
    ``ValueError`` for a missing required one or one the study does not take."""
    s, inputs = study(name), {k: v for k, v in (inputs or {}).items() if v is not None}
    fields = {f.name for f in dataclasses.fields(p)} if dataclasses.is_dataclass(p) else set()
    if bad := sorted(set(inputs) - fields):
        raise ValueError(f"{name} does not take --{bad[0].replace('_', '-')}")
    if missing := [k for k in s.requires if k not in inputs and getattr(p, k, None) is None]:
        raise ValueError(f"{name} needs --{missing[0].replace('_', '-')}")
    return dataclasses.replace(p, **inputs) if inputs else p


def record(name: str, profile: str | None = None, root: str | Path | None = None, *,
           inputs: dict[str, Any] | None = None, **options):
    """Run experiment ``name`` with its ``params.yaml`` section for ``profile`` (default: the
    file's); records go to ``root`` (default ``results.record_root(profile)``). ``inputs``:
    values of the study's command-line inputs (:func:`with_inputs`); ``options``: those of
    :func:`repro.studies.runner.run` (``force``, ``only``, ``recipes``...). Returns the run's
    :class:`~repro.studies.runner.Outcome`."""
    from repro import results
    from repro.studies import runner

    p = with_inputs(name, params(name, profile), inputs)
    prof = getattr(p, "profile", None) or p["profile"]
    root = Path(root) if root is not None else results.record_root(prof)
    return runner.run(study(name), p, root, **options)
