"""Refreshing the ledger within a device budget: which stale cells to record again, in which
order, and what that costs.

A stale cell's cost is estimated from its own records: the runner's ``cell_s`` (its wall time,
compiles included) where they hold it; else the time between the newest record of the cell
recorded just before it in the same run (same experiment, hardware and commit) and its own
newest record, unless that gap is more than :data:`GAP_OVER_OWN` times what its own compile
and sample fields account for; else those fields; :data:`UNKNOWN_S` where nothing says. Cells whose
records serve a claim come first (a verdict rests on them), then the rest (figures only); in
each group the experiments keep the order of :data:`repro.studies.EXPERIMENTS`.

    repro status                                    # ... and the cost of refreshing it all
    repro record --stale --plan                     # the plan, nothing run
    repro record --stale --claim B6 --time-budget 1500
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import fnmatch
from pathlib import Path
from typing import Any, Iterable

UNKNOWN_S = 120.0  # a cell whose records say nothing about its duration
MAX_GAP_S = 2 * 3600.0  # a longer gap between two cells is another run
GAP_OVER_OWN = 3.0  # a gap beyond this many times a cell's own compiles and samples: not its
CELL_FIELD = "cell_s"  # the runner's wall time of the whole cell (compiles included)
_WALL_FIELDS = ("wall_s_all_seeds_with_compile", "wall_s_all_seeds")
_COMPILE_FIELDS = ("compile_s", "compile_e2e_s", "compile_update_s")
_SAMPLE_FIELDS = ("samples_s", "samples_ms")


def _when(rec: dict[str, Any]) -> float | None:
    try:
        return _dt.datetime.fromisoformat(str(rec["timestamp"])).timestamp()
    except (KeyError, ValueError):
        return None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _own_fields(recs: list[dict[str, Any]]) -> float | None:
    """Seconds the records' own fields account for, or None: the runner's ``cell_s`` (the
    whole cell, compiles included) where recorded; else the longest wall time a record holds
    (the records of one cell repeat their cell's fields); else, at least, the compiles of its
    programs plus its timed samples (one compile per distinct recipe and field)."""
    extras = [r.get("extra") or {} for r in recs]
    cell = max((x for e in extras if (x := _number(e.get(CELL_FIELD))) is not None),
               default=None)
    if cell:
        return cell
    longest = max((x for e in extras for f in _WALL_FIELDS
                   if (x := _number(e.get(f))) is not None), default=0.0)
    if longest > 0:
        return longest
    compiles = {(r.get("recipe"), f): x for r, e in zip(recs, extras) for f in _COMPILE_FIELDS
                if (x := _number(e.get(f))) is not None}
    # a cell's records often repeat one list of samples (one per metric): count each once
    lists = {(f, tuple(e[f])) for e in extras for f in _SAMPLE_FIELDS
             if isinstance(e.get(f), list)}
    timed = sum(sum(_number(v) or 0.0 for v in vals) / (1000.0 if f.endswith("_ms") else 1.0)
                for f, vals in lists)
    total = sum(compiles.values()) + timed
    return total if total > 0 else None


def estimates(paths: Iterable[Path]) -> dict[str, float]:
    """{cell file: estimated seconds to record it again} (see the module docstring)."""
    cells = []
    for path in paths:
        try:
            recs = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        recs = [r for r in (recs if isinstance(recs, list) else [recs]) if isinstance(r, dict)]
        times = [t for r in recs if (t := _when(r)) is not None]
        commit = str((recs[0].get("git_commit") if recs else "") or "")
        cells.append((Path(path).parent, commit, max(times) if times else None, str(path), recs))
    out = {}
    runs: dict[tuple, list] = {}
    for folder, commit, t, path, recs in cells:
        runs.setdefault((folder, commit), []).append((t, path, recs))
    for group in runs.values():
        group.sort(key=lambda c: (c[0] is None, c[0] or 0))
        prev = None
        for t, path, recs in group:
            gap = t - prev if t is not None and prev is not None else None
            own = _own_fields(recs)
            if any(_number((r.get("extra") or {}).get(CELL_FIELD)) for r in recs):
                out[path] = own  # measured by the runner: nothing to infer
            elif gap is not None and 0 < gap <= MAX_GAP_S:
                # the gap, unless it is more than GAP_OVER_OWN times what the cell's own
                # compiles and samples account for: then something else ran in between
                out[path] = max(min(gap, GAP_OVER_OWN * own) if own else gap, own or 0.0)
            else:
                out[path] = own if own is not None else UNKNOWN_S
            prev = t if t is not None else prev
    return out


def cell_estimate(root: Path, hardware: str, experiment: str, cell: str
                  ) -> tuple[float, str]:
    """(estimated seconds to record ``cell`` of ``experiment`` on ``hardware``, where the
    estimate comes from): ``"own"`` its records there (:func:`estimates`, with the cells
    recorded beside it in the same run), else the name of another hardware whose records of
    the cell say it, else for a paired cell the compiles and samples of its recipes' separate
    cells there, else ``"default"`` (:data:`UNKNOWN_S`)."""
    here = Path(root) / hardware / experiment
    path = here / f"{cell}.json"
    if path.is_file():
        return _folder_estimates(here).get(str(path), UNKNOWN_S), "own"
    for other in sorted(p for p in Path(root).glob(f"*/{experiment}/{cell}.json")):
        est = _folder_estimates(other.parent).get(str(other))
        if est is not None:
            return est, other.parent.parent.name
    if cell.endswith(PAIRED) and here.is_dir():  # its recipes' separate cells, compiled apart
        prefix = cell[:-len(PAIRED)] + "_"
        parts = [_own_fields(json.loads(f.read_text())) for f in sorted(here.glob("*.json"))
                 if f.stem.startswith(prefix) and not f.stem.endswith(PAIRED)]
        if parts and all(x is not None for x in parts):
            return sum(parts), "its recipes' separate cells"
    return UNKNOWN_S, "default"


PAIRED = "_paired"  # a cell timing its recipes in rounds; theirs alone: the prefix, then each


def _folder_estimates(folder: Path) -> dict[str, float]:
    """:func:`estimates` of every cell file of one folder (a run's cells lie side by side),
    read once per folder state."""
    files = sorted(folder.glob("*.json"))
    key = (str(folder), tuple((f.name, f.stat().st_mtime_ns) for f in files))
    if key not in _FOLDERS:
        _FOLDERS[key] = estimates(files)
    return _FOLDERS[key]


_FOLDERS: dict[tuple, dict[str, float]] = {}


def plan(cells: list[dict[str, Any]], *, hardware: str | None = None,
         experiment: str | None = None, claims: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The stale ``cells`` (:func:`repro.evidence.stale_cells`) to record again, ordered (see
    the module docstring), each with ``estimate_s``; only those of ``hardware``,
    ``experiment`` and serving one of ``claims`` where given."""
    from repro import studies

    order = {name: i for i, name in enumerate(studies.EXPERIMENTS)}
    wanted = set(claims)
    chosen = [c for c in cells
              if (hardware is None or c["hardware"] == hardware)
              and (experiment is None or c["folder"] == experiment)
              and (not wanted or wanted & set(c["claims"]))]
    cost = estimates(Path(c["path"]) for c in chosen)
    out = [{**c, "estimate_s": cost.get(c["path"], UNKNOWN_S),
            "recordable": c["folder"] in studies.EXPERIMENTS} for c in chosen]
    out.sort(key=lambda c: (not c["claims"], order.get(c["folder"], len(order)), c["cell"]))
    return out


STALE_SET = ("results", "programs", "stale.json")  # committed beside the program index
_SINCE = re.compile(r" \((?:since [0-9a-f]+|uncommitted edits)\)")
# the files a record without a program fingerprint names as changed: more with every edit
_FILES = re.compile(r"(no program fingerprint, and its code changed): [^;]*")


def stale_set(cells: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The stale cells (:func:`repro.evidence.stale_cells`) as committed in
    ``results/programs/stale.json``: ``{"HARDWARE/EXPERIMENT/CELL": {"records", "stale",
    "why", "ledger"}}``. ``why`` leaves out the commit the code changed at (git history a
    shallow clone lacks), the line where a program first differs (known only where the
    recorded program's text is on disk; `repro status` shows it) and, for a record without a
    program fingerprint, the files changed since (more with every edit); ``ledger`` names the
    claims whose verdict reads the cell. A commit that stales a cell shows it in this file's
    diff."""
    from repro.claims import ledger_set
    from repro.claims.staleness import PROGRAM_TEXT

    def why(summary: str) -> str:
        return PROGRAM_TEXT.sub("", _FILES.sub(r"\1", _SINCE.sub("", summary)))

    ents = ledger_set.entries()
    out = {f"{c['hardware']}/{c['folder']}/{c['cell']}": {
        "records": c["records"], "stale": c["stale"], "why": why(c["summary"]),
        "ledger": ledger_set.claims_of(c["hardware"], c["folder"], c["cell"], ents)}
        for c in cells}
    return dict(sorted(out.items()))


def write_stale_set(root: Path, cells: list[dict[str, Any]]) -> Path:
    path = Path(root).joinpath(*STALE_SET)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stale_set(cells), indent=1, sort_keys=True) + "\n")
    return path


def human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe(steps: list[dict[str, Any]]) -> list[str]:
    """One line per experiment of a plan: cells, records, estimated time, claims served."""
    lines, groups = [], {}
    for c in steps:
        g = groups.setdefault((c["folder"], c["hardware"]), {"cells": 0, "s": 0.0,
                                                              "claims": set(), "ok": True})
        g["cells"] += 1
        g["s"] += c["estimate_s"]
        g["claims"] |= set(c["claims"])
        g["ok"] = c["recordable"]
    for (folder, hw), g in groups.items():
        claims = ", ".join(sorted(g["claims"])) or "figures only"
        note = "" if g["ok"] else " (not recorded by `repro record`: see docs/RECORDING.md)"
        lines.append(f"{folder} on {hw}: {g['cells']} cell(s), ~{human(g['s'])} ({claims})"
                     f"{note}")
    total = sum(c["estimate_s"] for c in steps)
    lines.append(f"total: {len(steps)} cell(s), ~{human(total)} of device time "
                 f"(~{max(1, -(-int(total) // 1500))} half-hour device call(s) of 25 min)")
    return lines


# ------------------------------------------------------------- the ledger set's plan


def _study_cells(experiment: str, platform: str, kind: str) -> list[str] | None:
    """The full-profile cell names of the study that writes ``experiment`` on ``platform``
    (None: no such study, or one ``repro record`` does not run)."""
    import contextlib
    import io

    from repro import hardware, studies

    name = studies.of_records(experiment)
    if name not in studies.EXPERIMENTS:
        return None
    st = studies.study(name)
    with contextlib.redirect_stdout(io.StringIO()), hardware.target(platform, kind):
        cells = st.cells(studies.params(name, "full"))
    if experiment != name:  # a folder another study writes (its repeats): the cells it holds
        return None
    return [c.name for c in cells]


def _platform(hardware: str) -> tuple[str, str]:
    """(platform, device kind) a registry hardware name runs as (``cpu`` for unknown)."""
    from repro import hardware as hw

    if hardware == "cpu":
        return "cpu", ""
    try:
        info = hw.lookup(hardware)
    except (KeyError, ValueError):
        return "gpu", ""
    return getattr(info, "backend", None) or "gpu", getattr(info, "name", "") or ""


def ledger_plan(hardware: str, claims: Iterable[str] = (), quality: bool | None = None,
                stale: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The ledger cells ``hardware`` records (``repro record --ledger``): those named for it,
    plus with ``quality`` the ``any`` cells (an accelerator) and the ``cpu`` cells (any
    machine); ``quality`` None: only the ``cpu`` cells on a CPU, else only the hardware's own.
    Without ``claims``, the claims judged on this hardware: a projection's cells only where
    ``claims`` names it (a cell it shares with another claim stays).
    One row per concrete cell: ``experiment``, ``cell``, ``claims``, ``status`` (missing,
    stale or fresh, of this hardware's records), ``estimate_s`` (:func:`cell_estimate`: from the cell's own records here, else another hardware's, else a
    default) and ``recordable`` (``repro record`` runs its study). Ordered so that the
    verdicts needing the fewest cells to record come first. ``stale``: the stale cells
    (:func:`repro.evidence.stale_cells`, computed where not given)."""
    from repro import evidence, results
    from repro.claims.ledger_set import ANY, CPU, entries, projections

    if quality is None:
        quality = hardware == CPU
    wanted = set(claims)
    skip = set() if wanted else projections()
    ents = [e for e in entries() if not e.fallback and (
        e.claim in wanted if wanted else e.claim not in skip) and (
        e.where == hardware or (quality and (e.where == CPU or
                                             (e.where == ANY and hardware != CPU))))]
    platform, kind = _platform(hardware)
    root = results.results_dir()
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    known: dict[str, list[str] | None] = {}
    for e in ents:
        if e.experiment not in known:
            try:
                known[e.experiment] = _study_cells(e.experiment, platform, kind)
            except ValueError:
                known[e.experiment] = None
        names = known[e.experiment]
        if names is None:  # not a study of `repro record`: the cells on disk
            names = sorted({p.stem for p in root.glob(f"*/{e.experiment}/*.json")})
        hits = [n for n in names if fnmatch.fnmatchcase(n, e.pattern)]
        variant_of = None
        if not hits:  # named, but not among the study's cells now (a cell named after the
            # --recipe it was recorded with, or a pattern of such cells): listed as missing
            hits = [e.pattern]
            base = re.split(r"[*?\[]", e.pattern)[0].rstrip("_")
            if base != e.pattern and base in (known[e.experiment] or ()):
                variant_of = base  # a --recipe cell of a study cell
        for n in hits:
            c = cells.setdefault((e.experiment, n), {
                "experiment": e.experiment, "cell": n, "claims": [], "hardware": hardware,
                "recordable": known[e.experiment] is not None and n in known[e.experiment],
                "anywhere": True})
            if variant_of:
                c["variant_of"] = variant_of
            c["anywhere"] &= e.anywhere
            if e.claim not in c["claims"]:
                c["claims"].append(e.claim)
    stale = evidence.stale_cells() if stale is None else stale
    stale_on = {(c["hardware"], c["folder"], c["cell"]) for c in stale}
    for (exp, n), c in cells.items():
        path = root / hardware / exp / f"{n}.json"
        c["status"] = "missing" if not path.is_file() else \
            "stale" if (hardware, exp, n) in stale_on else "fresh"
        # a cell any hardware may hold is not recorded again here where another holds it fresh
        elsewhere = [p.parent.parent.name for p in root.glob(f"*/{exp}/{n}.json")
                     if (p.parent.parent.name, exp, n) not in stale_on]
        if c.pop("anywhere") and c["status"] != "fresh" and elsewhere:
            c["status"] = f"fresh on {elsewhere[0]}"
        c["estimate_s"], c["estimate_from"] = cell_estimate(root, hardware, exp, n)
    need: dict[str, int] = {}
    for c in cells.values():
        for cl in c["claims"]:
            need[cl] = need.get(cl, 0) + (not c["status"].startswith("fresh"))
    rank = {cl: (need.get(cl, 0), i) for i, cl in enumerate(dict.fromkeys(
        e.claim for e in ents))}
    return sorted(cells.values(), key=lambda c: (min(rank[cl] for cl in c["claims"]),
                                                 c["experiment"]))


def describe_ledger(rows: list[dict[str, Any]], hardware: str) -> list[str]:
    """The plan as lines: one per cell (status, estimate, claims), then the totals."""
    lines = []
    for c in rows:
        note = "" if c["recordable"] else (
            f" (a --recipe cell: `repro record {c['experiment']} --profile full --only "
            f"{c['variant_of']} --recipe ...`, docs/RECORDING.md)" if c.get("variant_of")
            else " (not by `repro record`: docs/RECORDING.md)")
        lines.append(f"{c['status']:12s} ~{human(c['estimate_s']):>6s}  {c['experiment']}/"
                     f"{c['cell']}  [{', '.join(c['claims'])}]"
                     + (f" (estimate: {c['estimate_from']})" if c["estimate_from"] != "own"
                        else "") + note)
    todo = [c for c in rows if not c["status"].startswith("fresh")]
    lines.append(f"ledger set on {hardware}: {len(rows)} cell(s), ~"
                 f"{human(sum(c['estimate_s'] for c in rows))} to record all of it; "
                 f"{len(todo)} to record now (missing or stale), ~"
                 f"{human(sum(c['estimate_s'] for c in todo))}")
    return lines
