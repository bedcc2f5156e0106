"""The studies' registry and what they share (the runner, timing, the measuring kit). Each
experiment's study is its package's ``measure`` module (``repro/experiments/<name>/measure.py``),
which exports ``STUDY`` (:class:`repro.studies.runner.Study`); :data:`EXPERIMENTS` lists them,
from :mod:`repro.catalogue`.

The registry is the one path of a record: :func:`record` and :func:`run` run a study (the only
caller of :func:`repro.studies.runner.run`, under the lock of its results folder); :func:`cell_programs`
builds the programs a record measured, as the runner stamped them; :func:`checker` is the
freshness test, the staleness checker handed those builders (:mod:`repro.provenance` imports
no study).

    from repro import studies
    studies.record("gemm", "smoke")            # what `repro record gemm --profile smoke` does
    studies.params("rl_throughput", "full")    # a study's typed params.yaml section
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
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
    :func:`run`. Returns the run's :class:`~repro.studies.runner.Outcome`."""
    from repro import results

    p = with_inputs(name, params(name, profile), inputs)
    prof = getattr(p, "profile", None) or p["profile"]
    root = Path(root) if root is not None else results.record_root(prof)
    return run(study(name), p, root, **options)


def run(s, p: Any, root: str | Path, *, hardware: str | None = None, **options):
    """Run study ``s`` with parameters ``p`` (typed and checked) into ``root``, under
    ``hardware``'s name (default: the detected one): :func:`repro.studies.runner.run`
    (``options``: ``force``, ``only``, ``recipes``, ``time_budget_s``, ``note``...) judging
    recorded cells with :func:`checker`, while it holds the lock of its results folder
    (:func:`repro.results.record_lock`: a second run into the same folder is refused with
    :class:`repro.results.Busy`, as two runs at once would time each other's load)."""
    from repro import hardware as hw
    from repro import results
    from repro.studies import runner

    root = Path(root)
    slug = results.slug(hardware) if hardware else hw.detect().slug
    with results.record_lock(root, slug, s.experiment):
        return runner.run(s, p, root, hardware=hardware, checker=checker(), **options)


# ----------------------------------------------------------------- a record's programs


def cell_programs(experiment: str, cell: str, profile: str = "full", platform: str = "gpu",
                  kind: str = "", rec: dict[str, Any] | None = None) -> dict[str, Any] | str:
    """``{key: Program}`` of a cell of ``experiment`` (a records folder) as its study defines
    it now from params.yaml's ``profile`` (its cells listed as on ``platform``: a study may
    offer cells only where they run), with the hash of what the run read of its params.yaml
    section among their settings (:func:`repro.studies.runner.cell_programs`: what the runner
    stamped on the records), or why there is none (one line). Where the cell is not among
    them (a device count this machine lacks, a study without a params.yaml section), ``rec``'s
    own settings make its program (the study's ``program`` and ``program_settings``)."""
    from repro import hardware
    from repro.studies import runner

    st = study(of_records(experiment))
    found = []
    # built for the record's device: a program may choose its path as it is built
    # (fp8-auto keeps BF16 on a device without FP8 arithmetic)
    with contextlib.redirect_stdout(io.StringIO()), hardware.target(platform, kind):
        if st.params_section:  # (redirected: a study's notes on skipping)
            found = [c for c in st.cells(params(st.experiment, profile)) if c.name == cell]
        if found and found[0].programs is not None:
            return runner.cell_programs(st, found[0], profile)
        if found:
            return f"{experiment} names no program for cell {cell}"
        return _from_record(st, experiment, cell, profile, rec)


def _from_record(st, experiment: str, cell: str, profile: str,
                 rec: dict[str, Any] | None) -> dict[str, Any] | str:
    from repro import program as P

    missing = (f"cell {cell} is not among {experiment}'s cells of params.yaml's "
               f"{profile} profile here")
    module = importlib.import_module(st.source_module)
    program = getattr(module, "program", None)
    settings_of = getattr(module, "program_settings", None)
    if rec is None or program is None or settings_of is None:
        return missing
    settings = settings_of(rec)
    if settings is None:
        return f"{missing}, and its record's settings do not make its program"
    key = str((rec.get("program") or {}).get("key") or "")
    return {key: P.with_settings(program(**settings), st.params_section, profile)}


def checker(lock: Path | None = None, trace: bool = True):
    """The freshness test: a :class:`repro.provenance.Checker` handed :func:`cell_programs`,
    after reading params.yaml (programs hash their params.yaml sections, so one that cannot be
    read stops every reader here with one line naming the file and the position, rather than
    making every such record "stale")."""
    from repro import config, provenance

    config.load_params()
    return provenance.Checker(lock, trace, programs=cell_programs)
