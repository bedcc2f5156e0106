"""The records as evidence: loaded, checked, and each said to be fresh or stale.

This is the one loader of records (:mod:`repro.results` is the store: where a record lives,
how it is written, read and checked). Every record file under a records root is found by one
walk (:func:`record_files`) and read by one loop (:func:`records`), each record checked against itself (:func:`repro.record_checks.verify`) and
judged by the one freshness test, :func:`repro.studies.checker` (:mod:`repro.provenance`'s
staleness checker handed the studies' program builders).

* :func:`load_records`: every record as one DataFrame, each row saying whether it is stale,
  why, and since which commit: what the notebooks and the verdicts read;
* :func:`scan_cells` / :func:`stale_cells`: the stale cells and the defective records,
  without pandas: what ``repro status`` shows and ``repro record --stale`` records again;
* :func:`write_index`: ``results/programs/index.json``, HEAD's program of every recorded cell,
  so that checking them needs no tracing until their code changes again.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

import pandas as pd

from repro import checkout, record_checks, results, studies
from repro.provenance import PROGRAM_INDEX, Checker, judged_program, program_key

Roots = Path | Iterable[Path] | None


def _roots(roots: Roots, default: list[Path]) -> list[Path]:
    if roots is None:
        return default
    return [Path(roots)] if isinstance(roots, (str, Path)) else [Path(r) for r in roots]


class StrayFileWarning(UserWarning):
    """A file in a records folder that is not a record file (a temporary file an interrupted
    write left, an editor's backup, a record file out of place): not read, and named."""


# Folders of a records root that hold no records: the program texts (repro.program.TEXTS).
NOT_RECORDS = ("programs",)


def record_files(root: Path, experiment: str | None = None) -> list[Path]:
    """The record files under ``root``: ``HARDWARE/EXPERIMENT/CELL.json`` (of ``experiment``'s
    folder only, where given), sorted. Any other file met on the way (a hidden file such as
    a temporary file an interrupted write left, ``CELL.json~``, a ``.json`` outside an
    experiment folder or below one) is not read, and a :class:`StrayFileWarning` names it;
    documentation (``*.md``) is left alone."""
    import warnings

    root, out = Path(root), []

    def stray(path: Path, why: str) -> None:
        warnings.warn(f"{path}: not a record file ({why}): not read", StrayFileWarning,
                      stacklevel=2)

    def files(folder: Path):
        try:
            return sorted(folder.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def look(path: Path, depth: int) -> None:
        if path.is_dir():
            if depth == 3:
                for p in path.rglob("*"):
                    if p.is_file():
                        stray(p, "below an experiment folder: move it to "
                              "HARDWARE/EXPERIMENT/CELL.json")
                return
            if depth == 1 and path.name in NOT_RECORDS:
                return
            if depth == 2 and experiment is not None and path.name != results.safe(experiment):
                return
            for p in files(path):
                look(p, depth + 1)
        elif path.suffix == ".md" and not path.name.startswith("."):
            return
        elif depth == 3 and path.suffix == ".json" and not path.name.startswith("."):
            out.append(path)
        elif path.name.startswith("."):
            if str(path) not in results.IN_FLIGHT:  # (this process is writing it now)
                stray(path, "a hidden file: a cell being written, or one an interrupted "
                      "write left: remove it when no run is recording")
        elif path.suffix == ".json":
            stray(path, "outside an experiment folder: move it to "
                  "HARDWARE/EXPERIMENT/CELL.json")
        else:
            stray(path, "a record file is HARDWARE/EXPERIMENT/CELL.json: remove it")

    for p in files(root):
        look(p, 1)
    return out


def records(roots: Roots = None, experiment: str | None = None
            ) -> Iterator[tuple[Path, Path, int, Any, str | None]]:
    """``(root, path, index, record, problem)`` of every record in every record file under
    ``roots`` (default: the committed ``results/``), of ``experiment``'s folder only where
    given: ``problem`` is what is wrong with a record that is no known defect
    (:func:`repro.record_checks.verify`: its value, commit or time), else None."""
    for root in _roots(roots, [results.results_dir()]):
        known = checkout.history(root)
        for path in record_files(root, experiment):
            for i, rec in enumerate(results.read_cell_file(path, root)):
                problem = None
                if isinstance(rec, dict) and not results.defect_of(rec):
                    problem = record_checks.verify(rec, known)
                yield root, path, i, rec, problem


def load_records(experiment: str | None = None, roots: Roots = None,
                 keep_defective: bool = False) -> pd.DataFrame:
    """All records (every hardware) as one DataFrame.

    By default reads the committed ``results/`` and this machine's smoke records in
    ``build/results/``; ``source`` names each row's file. ``sizes`` entries are also spread
    into ``size_<name>`` columns for plotting. Records matching a known defect
    (:func:`repro.results.defects`) are dropped unless ``keep_defective``; then the ``defect``
    column gives the reason. Every row says whether it is ``stale``
    (:mod:`repro.provenance`), ``stale_reason`` (one line; ``stale_summary``: the same without
    the record's commit) and ``stale_since`` (the first commit that changed its code, where
    git knows it). Stale rows are kept: each analysis decides what to do with them, and says
    so. A file that is not valid JSON, or a record that fails
    :func:`repro.record_checks.check_record` (and is not a known defect), raises
    :class:`repro.record_checks.RecordError` naming the file. A record that fails its own check
    (:func:`repro.record_checks.verify`: its value, commit or time) is defective: left out, even
    with ``keep_defective``, and named (:class:`repro.record_checks.DefectiveRecordWarning`).
    """
    checker = studies.checker()
    rows: list[dict[str, Any]] = []
    default = [results.results_dir(), results.scratch_results_dir()]
    for _, path, i, rec, problem in records(_roots(roots, default), experiment):
        results.check_loaded(rec, path, i)
        rec = dict(rec)
        rec["source"] = str(path)
        rec["defect"] = results.defect_of(rec)
        if problem:
            _warn_defective(path, i, rec, problem)
            continue
        if rec["defect"] is None or keep_defective:
            st = checker(rec)
            rec.update(stale=st.stale, stale_reason=st.reason, stale_since=st.since,
                       stale_summary=st.summary)
            rows.append(rec)
    df = pd.DataFrame(rows, columns=None if rows else
                      results.RECORD_FIELDS + results.LOADED_FIELDS)
    if rows:
        sizes = pd.json_normalize(df["sizes"].tolist()).add_prefix("size_")
        df = pd.concat([df.reset_index(drop=True), sizes], axis=1)
    return df


def _warn_defective(path: Path, i: int, rec: dict[str, Any], problem: str) -> None:
    warnings.warn(f"{path}: record {i}{record_checks.what(rec)}: {problem}: left out of every "
                  "analysis (restore the file from git, or record the cell again)",
                  record_checks.DefectiveRecordWarning, stacklevel=3)


def stale_cells(roots: Roots = None) -> list[dict[str, Any]]:
    """Every cell file under ``roots`` (default: the committed ``results/``) with stale
    records, without pandas or JAX: ``experiment``, ``hardware``, ``cell``, ``path``,
    ``stale`` (of ``records``), ``reason`` (the distinct reasons), ``summary`` (the same
    without commits), ``commits`` (the records'), ``since`` and the ``claims`` its records
    serve. Known defects and defective records are left out, as in :func:`load_records`."""
    return scan_cells(roots)[0]


def scan_cells(roots: Roots = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(:func:`stale_cells`, the defective records under ``roots``): each record that fails its
    own check (:func:`repro.record_checks.verify`) with ``experiment``, ``folder``, ``hardware``,
    ``cell``, ``path``, ``record`` (its index in the file), ``metric``, ``recipe`` and
    ``problem``."""
    checker, defective = studies.checker(), []
    cells: dict[Path, list[dict[str, Any]]] = {}
    for _, path, i, r, problem in records(roots):
        recs = cells.setdefault(path, [])
        if not isinstance(r, dict) or results.defect_of(r):
            continue
        if problem:
            defective.append({
                "experiment": r.get("experiment") or path.parent.name,
                "folder": path.parent.name, "hardware": path.parent.parent.name,
                "cell": path.stem, "path": str(path), "record": i,
                "metric": r.get("metric"), "recipe": r.get("recipe"), "problem": problem})
            continue
        recs.append(r)
    out = []
    for path, recs in cells.items():
        verdicts = [checker(r) for r in recs]
        stale = [v for v in verdicts if v.stale]
        if not stale:
            continue
        out.append({
            "experiment": recs[0].get("experiment") or path.parent.name,
            "folder": path.parent.name, "hardware": path.parent.parent.name,
            "cell": path.stem, "path": str(path), "records": len(recs),
            "stale": len(stale), "reason": "; ".join(dict.fromkeys(v.reason for v in stale)),
            "summary": "; ".join(dict.fromkeys(v.summary for v in stale)),
            "commits": sorted({str(r.get("git_commit") or "unknown")[:7] for r in recs}),
            "since": next((v.since for v in stale if v.since), None),
            "claims": sorted({c for r in recs for c in r.get("claims") or []})})
    return out, defective


# ------------------------------------------------------------------- the program index


def _traced_text(checker: Checker, args: tuple[str, ...], profile: str, rec: dict[str, Any],
                 digest: str) -> str | None:
    """HEAD's text of a cell's program traced now, where its hash is ``digest``."""
    from repro import program as P

    experiment, cell, key, platform, kind = args
    progs = checker.cell_programs(experiment, cell, profile, platform, kind, rec)
    prog = None if isinstance(progs, str) else progs.get(key, progs.get(""))
    if prog is None:
        return None
    traced = P.trace(prog, platform, kind)
    return traced.text if traced.hash == digest else None


def write_index(recs: Iterable[dict[str, Any]] | None = None, checker: Checker | None = None
                ) -> tuple[Path, int]:
    """Write ``results/programs/index.json``: HEAD's program of every (cell, key, platform)
    the records ``recs`` name (default: every committed record but known defects), with the
    files its trace ran, so that a checkout whose files changed since the records were made
    (but not since the index) needs no tracing to tell they are fresh; HEAD's text of every
    program that changed since a record is committed beside it (``results/programs``), so
    that a stale note names its first differing line on every machine. Returns (its path,
    the number of programs traced to make it)."""
    from repro import program as P

    checker = checker or studies.checker()
    if recs is None:
        recs = [r for *_, r, _ in records() if isinstance(r, dict) and not results.defect_of(r)]
    index: dict[str, dict[str, Any]] = {}
    for rec in recs:
        prog = rec.get("program")
        if not isinstance(prog, dict) or not prog.get("hash"):
            continue
        prog = judged_program(prog, checker._env["jax"])
        args = (str(rec.get("experiment")), str(prog.get("cell")), str(prog.get("key") or ""),
                str(prog.get("platform")), str(prog.get("device_kind") or ""))
        if prog.get("jax") and prog["jax"] != checker._env["jax"]:
            continue  # traced with its platform's JAX only: not comparable here
        profile = str(rec.get("profile") or "full")
        name = program_key(*args) if profile == "full" else f"{profile}:{program_key(*args)}"
        if name in index:
            continue
        now = checker.program_now(*args, profile=profile, rec=rec)
        if isinstance(now, dict):
            index[name] = {k: v for k, v in now.items() if k != "text"}
            if now["hash"] != prog["hash"] and checker.committed_text(now["hash"]) is None:
                text = now.get("text") or checker.text(now["hash"]) or \
                    _traced_text(checker, args, profile, rec, now["hash"])
                if text:  # committed: a stale note names the first line that differs
                    P.save_text(checkout.CHECKOUT / "results", P.Traced(
                        now["hash"], now["kit"], {}, args[3], args[4], text),
                        f"the text of {name}")
    path = checkout.CHECKOUT.joinpath(*PROGRAM_INDEX)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return path, checker.traced
