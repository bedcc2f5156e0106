"""The one loop that runs a study: select cells, skip finished ones, run, write, report.

A study module describes its experiment as a :class:`Study`: its name, the claims it serves,
and a function from its (typed) parameters to a list of :class:`Cell`. A cell is one resumable
unit of work (a recipe at a size, an environment and a variant...): ``run()`` returns its
records, and the runner writes them atomically to
``<root>/<hardware>/<experiment>/<cell>.json``. Everything else lives here, once:

* resume: a cell already recorded on this hardware is skipped (``force`` redoes it), unless
  its records are stale: made by other code than the study's closure now, or by other
  jax/jaxlib/flax versions (:mod:`repro.provenance`); a stale cell is recorded again;
* provenance: every record is stamped with the fingerprint of the study's code (``code``) and
  the versions of the packages on its path (``versions``), hashed when the run starts, and
  with what ``nvidia-smi`` saw on its GPUs before and after its cell ran (``conditions``:
  whether it ran alone, :func:`repro.conditions.run_conditions`);
* selection: ``only`` (glob patterns on cell names) and ``recipes`` (the recipes a cell uses;
  a study whose cells time several recipes together narrows its parameters instead);
* failures: a cell that raises is reported in one line and the study goes on; the run ends
  with :class:`CellsFailed` naming every failed cell (a cell the device cannot compile must
  not cost the rest of an unattended GPU call); a cell whose records cannot be written (a
  full disk, no permission) stops the run with :class:`WriteFailed`, finished cells kept;
* a time budget: no new cell starts once it is spent (cells that checkpoint get what is left);
* Ctrl-C: finished cells are kept; the interrupt propagates to the caller;
* cross-call ratios: a note when a run would record some cells of a ``group`` (cells that are
  compared with each other) whose other cells an earlier call recorded;
* progress: one tqdm bar per study.

    STUDY = Study("mlp_step", claims=("A2",), cells=cells)   # in a study module
    studies.record("mlp_step", "full", only=["w4096*"])     # runs it, under its folder's lock
"""

from __future__ import annotations

import fnmatch
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from repro import checkout, results

Records = list[dict[str, Any]]


@dataclass(frozen=True)
class Cell:
    """One resumable unit of a study.

    ``run(budget_s)`` returns the cell's records (``budget_s``: seconds left of the run's time
    budget, or None; most cells ignore it). A cell whose ``run`` returns None stopped early on
    purpose (e.g. at its time budget, with a checkpoint): nothing is written and the study
    stops there; ``[]``: nothing to record here (e.g. a trace without device kernels on a CPU).
    ``recipes``: the recipe names the cell runs, for ``--recipe`` selection. ``group``: cells
    whose records are compared with each other (ratios need both from one call).
    ``restart``: called before a forced run (``force``), for a cell that would otherwise
    resume from a checkpoint. ``programs``: ``() -> {key: repro.program.Program}``, what the
    cell's records measure, built from the cell's settings alone (no device work): a record
    takes the program of its ``recipe`` (or the one keyed ``""``); its fingerprint decides
    when the record is stale (:mod:`repro.program`). None: the study's import closure decides,
    file by file.
    """

    name: str
    run: Callable[[float | None], Records | None]
    recipes: tuple[str, ...] = ()
    group: str | None = None
    restart: Callable[[], None] | None = None
    programs: Callable[[], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Study:
    """An experiment: ``cells(params) -> [Cell, ...]`` in the order they should run.

    ``check(params)`` (optional) validates everything a run needs before the first cell
    starts (names of recipes, environments, sizes), raising a one-line ``ValueError``.
    ``params``: the dataclass of its ``params.yaml`` section (``repro.config.Section``; None:
    the section as a plain mapping). ``section``: that section's name ("": the experiment's;
    None: no section, the parameters come from the command line). ``narrow(params, recipes)``:
    for a study whose cells time several recipes together, the parameters restricted to
    ``recipes`` (``--recipe``). ``requires``: command-line options the study cannot run
    without (fields of its parameters, e.g. ``purejaxrl``: a checkout to compare against).
    ``data``: data files (paths in the checkout, e.g. ``repro/data/lm_corpus.txt.gz``) whose
    bytes the records depend on: hashed into each record's ``code`` with the source files.
    ``module``: the module whose import closure made the records (default: the module that
    defines ``cells``).
    """

    experiment: str
    claims: tuple[str, ...]
    cells: Callable[[Any], list[Cell]]
    check: Callable[[Any], None] | None = None
    about: str = ""
    params: type | None = None
    section: str | None = ""
    narrow: Callable[[Any, Sequence[str]], Any] | None = None
    requires: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    module: str | None = None

    @property
    def source_module(self) -> str:
        return self.module or self.cells.__module__

    @property
    def params_section(self) -> str | None:
        return self.experiment if self.section == "" else self.section


class CellsFailed(RuntimeError):
    """Cells of a study that raised; every other selected cell was run and written."""

    def __init__(self, experiment: str, failures: list[str]):
        self.experiment, self.failures = experiment, failures
        super().__init__(f"{experiment}: {len(failures)} cell(s) failed, the others were "
                         "written: " + "; ".join(failures))


def select(cells: Sequence[Cell], only: Sequence[str] | None = None,
           recipes: Sequence[str] | None = None) -> list[Cell]:
    """The cells whose name matches one of the ``only`` globs and that run one of
    ``recipes`` (a cell that names no recipe is kept by ``recipes``)."""
    out = list(cells)
    if only:
        out = [c for c in out if any(fnmatch.fnmatch(c.name, pat) for pat in only)]
    if recipes:
        keep = set(recipes)
        out = [c for c in out if not c.recipes or keep & set(c.recipes)]
    return out


def plan(study: Study, params: Any, only: Sequence[str] | None = None,
         recipes: Sequence[str] | None = None) -> tuple[list[Cell], list[Cell]]:
    """(the selected cells, all cells) of a run, after ``study.check``; a one-line
    ``ValueError`` for a recipe the registry does not know, a ``--recipe`` the study cannot
    select by, a selection that matches no cell, two cells that would write one file, or a
    ``REPRO_GIT_COMMIT`` that is no commit. Writes nothing."""
    if recipes and study.narrow is not None:
        params = study.narrow(params, list(recipes))
    if study.check is not None:
        study.check(params)
    checkout.git_commit()  # the commit records will name: a wrong REPRO_GIT_COMMIT is refused
    every = study.cells(params)
    check_distinct(study.experiment, every)
    if recipes and study.narrow is None:
        if not any(c.recipes for c in every):
            raise ValueError(f"{study.experiment}: --recipe does not apply (each cell times "
                             "all the recipes of params.yaml together)")
        from repro.precision import resolve

        for r in recipes:
            resolve(r)  # a one-line error naming the valid recipes
    chosen = select(every, only, None if study.narrow else recipes)
    if (only or recipes) and not chosen:
        names = ", ".join(c.name for c in every[:12]) + (", ..." if len(every) > 12 else "")
        what = " and ".join(x for x, v in (("--only " + " ".join(only or []), only),
                                           ("--recipe " + ",".join(recipes or []), recipes)) if v)
        raise ValueError(f"{study.experiment}: {what} selects no cell; cells: {names or 'none'}")
    if recipes and not study.narrow:
        check_recipe_selection(study.experiment, chosen, every, recipes)
    return chosen, every


def check_distinct(experiment: str, cells: Sequence[Cell]) -> None:
    """A one-line ``ValueError`` where two cells would write one file (one name, or names
    that differ only in characters a file name cannot hold): a value given twice in
    params.yaml (a seed, a recipe, a size) would run one cell twice, or skip it as recorded."""
    seen: dict[str, str] = {}
    for c in cells:
        file = results.cell_path(experiment, c.name, "HW", Path("results")).name
        if file in seen:
            what = f"cell {c.name} is listed twice" if seen[file] == c.name else \
                f"cells {seen[file]} and {c.name} would write one file, {file}"
            raise ValueError(f"{experiment}: {what}: a value given twice in params.yaml? "
                             f"(each cell is one file: results/HW/{experiment}/CELL.json)")
        seen[file] = c.name


def check_recipe_selection(experiment: str, chosen: Sequence[Cell], every: Sequence[Cell],
                           recipes: Sequence[str]) -> None:
    """A one-line ``ValueError`` where ``--recipe`` keeps only cells that run no recipe (a
    study's recipe-independent cells): it selected nothing it names. The message lists the
    recipes the (``--only``-selected) cells run."""
    if any(set(c.recipes) & set(recipes) for c in chosen):
        return
    ran = sorted({r for c in every for r in c.recipes})
    rest = ", ".join(c.name for c in chosen[:4])
    raise ValueError(f"{experiment}: --recipe {','.join(recipes)} selects no cell that runs it"
                     + (f" (only cells that run no recipe: {rest})" if rest else "")
                     + f"; recipes of its cells: {', '.join(ran) or 'none'}")


class WriteFailed(RuntimeError):
    """A cell's records could not be written (a full disk, a folder without permission): the
    run stops at that cell; the cells written before it are kept (a rerun resumes)."""


class CheckoutChanged(RuntimeError):
    """A file the cell's program ran changed on disk after the run began: the program this
    process ran (loaded before) is not the one the file now holds, so its records would name
    code that did not run. The run stops; the cells written before it are kept."""


def source_snapshot() -> dict[str, str]:
    """{checkout-relative path: hash} of the package's source files now (the code a run
    loads), to tell at each cell whether the checkout changed under the run."""
    from repro import fingerprint

    pkg = checkout.CHECKOUT / fingerprint.PACKAGE
    return {checkout.rel(f): fingerprint.file_hash(f) for f in sorted(pkg.rglob("*.py"))}


def _unchanged_since(snapshot: dict[str, str] | None, recs: Records, cell: Any) -> None:
    """:class:`CheckoutChanged` where a source file the records' programs list hashes
    otherwise than when the run began."""
    if snapshot is None:
        return
    files = {f: h for r in recs for f, h in ((r.get("program") or {}).get("files") or {}).items()
             if f in snapshot}
    if changed := sorted(f for f, h in files.items() if snapshot[f] != h):
        raise CheckoutChanged(f"{cell.name}: {', '.join(changed[:3])} changed on disk after the "
                              "run began, so its records would name code that did not run; "
                              "nothing of this cell was written: rerun once the checkout is "
                              "settled")


def write_cell(recs: Records, study: Study, cell: Any, root: Path, out: "Outcome",
               snapshot: dict[str, str] | None = None) -> Path:
    """Stamp the programs ``cell`` measured on its records (:func:`stamp_programs`), check
    that the files they ran are those the run began with (``snapshot``:
    :func:`source_snapshot`; :class:`CheckoutChanged` otherwise) and write them
    (:func:`repro.results.write_records`), or :class:`WriteFailed` in one line naming the
    cell, the file and what was kept: the next cells would fail alike, so the run stops."""
    try:
        if cell.programs is not None:
            recs = stamp_programs(recs, cell, root, study)
            _unchanged_since(snapshot, recs, cell)
        return results.write_records(recs, study.experiment, cell.name, root=root)
    except OSError as e:
        failed = f"; {len(out.failed)} cell(s) failed before it" if out.failed else ""
        raise WriteFailed(f"{e}; the run stopped there: the {len(out.written)} cell(s) "
                          f"written before it are kept{failed} (rerun to resume)") from None


def _one_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:300]}"


@dataclass
class Outcome:
    """What a run did: files written, cells skipped (already recorded) or with nothing to
    record, cells recorded again because their records were stale, cells failed, and why it
    ended early (time budget), if it did."""

    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    restale: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stopped: str | None = None


def cross_call_note(experiment: str, todo: Sequence[Cell], every: Sequence[Cell],
                    done: Callable[[str], bool]) -> str | None:
    """A note when the cells ``todo`` share a ``group`` with cells an earlier call recorded
    (``done(name)``): a ratio of the two compares different calls. None if not."""
    new = {c.name for c in todo}
    groups = {c.group for c in todo if c.group is not None}
    kept = sorted(c.name for c in every
                  if c.group in groups and c.name not in new and done(c.name))
    if not kept:
        return None
    return (f"{experiment}: note: {', '.join(sorted(new))} will be compared with "
            f"{', '.join(kept)}, recorded by an earlier call: those ratios are cross-call; "
            "to time them together, select both and add --force")


def cell_programs(study: Study, cell: Cell, profile: str) -> dict[str, Any]:
    """``{key: Program}`` of what ``cell``'s records measure (its ``programs``), each with the
    hash of what a run of ``profile`` reads of the study's params.yaml section among its
    settings (:func:`repro.program.with_settings`): what :func:`stamp_programs` traces at
    write, and the staleness checker again at check (:func:`repro.studies.cell_programs`)."""
    from repro import program as P

    return {k: P.with_settings(prog, study.params_section, profile)
            for k, prog in cell.programs().items()}


def stamp_programs(recs: Records, cell: Cell, root: Path, study: Study) -> Records:
    """``recs`` with each record's ``program`` (:mod:`repro.program`): the program of its
    recipe (or the cell's one keyed ``""``, :func:`cell_programs`), traced for this device;
    the programs' texts are kept under ``root/programs``. A record whose program the cell does
    not name gets none."""
    from repro import hardware as hw
    from repro import program as P

    progs: dict[str, dict[str, Any]] = {}
    stamped = {}
    out = []
    for rec in recs:
        profile = str(rec.get("profile") or "full")
        if profile not in progs:
            progs[profile] = cell_programs(study, cell, profile)
        key = rec.get("recipe") if rec.get("recipe") in progs[profile] else ""
        if key not in progs[profile]:
            out.append(rec)
            continue
        if (profile, key) not in stamped:
            traced = P.trace(progs[profile][key], hw.platform(), hw.device_kind())
            P.save_text(root, traced, f"{study.experiment}/{cell.name}: the text of program "
                        f"{traced.hash[:12]}")
            stamped[profile, key] = {**traced.stamp(), "cell": cell.name, "key": key}
        out.append({**rec, "program": stamped[profile, key]})
    return out


def run(study: Study, params: Any, root: str | Path, *, force: bool = False,
        only: Sequence[str] | None = None, recipes: Sequence[str] | None = None,
        time_budget_s: float | None = None, hardware: str | None = None,
        note: str | None = None, progress: bool = True, checker=None) -> Outcome:
    """Run the selected cells of ``study`` not yet recorded under ``root``; see the module
    docstring. ``hardware``: record under this name instead of the detected one; ``note``:
    a ``run_note`` for every record; ``checker``: the freshness test of recorded cells
    (:func:`repro.studies.checker`, which :func:`repro.studies.record` hands it; without
    one, a recorded program whose files changed counts as stale: nothing retraces it). Raises
    :class:`CellsFailed` at the end if any cell failed."""
    from tqdm import tqdm  # not tqdm.auto: that wants ipywidgets inside notebooks

    from repro import conditions, fingerprint, provenance
    from repro import hardware as hw

    cells, every = plan(study, params, only, recipes)
    root = Path(root)
    slug = results.slug(hardware) if hardware else hw.detect().slug
    stamp = fingerprint.study_stamp(study.source_module, study.data)
    snapshot = source_snapshot()  # the code this run loads: a cell's records must name it
    checker = checker or provenance.Checker()
    stale: set[str] = set()

    def done(name: str) -> bool:
        recs = results.read_cell(study.experiment, name, slug, root)
        if recs is None:
            return False
        if any(checker(r).stale for r in recs):
            stale.add(name)
            return False
        return results.recorded(recs, root)

    todo = [c for c in cells if force or not done(c.name)]
    out = Outcome(skipped=[c.name for c in cells if c.name not in {t.name for t in todo}])
    out.restale = [c.name for c in todo if c.name in stale]
    if out.restale:
        tqdm.write(f"{study.experiment}: {len(out.restale)} recorded cell(s) are stale (another "
                   f"program or jax/jaxlib than now): recording them again: "
                   f"{', '.join(out.restale[:6])}{', ...' if len(out.restale) > 6 else ''}",
                   file=sys.stderr)
    if msg := cross_call_note(study.experiment, todo, every, done):
        tqdm.write(msg, file=sys.stderr)
    start = time.monotonic()
    profile = getattr(params, "profile", None) or (params or {}).get("profile", "?")
    bar = tqdm(todo, desc=f"{study.experiment} [{profile}]", unit="cell", file=sys.stderr,
               disable=not progress)
    for cell in bar:
        left = None if time_budget_s is None else time_budget_s - (time.monotonic() - start)
        if left is not None and left <= 0:
            out.stopped = f"time budget spent before {cell.name}"
            break
        bar.set_postfix_str(cell.name)
        if force and cell.restart is not None:
            cell.restart()
        before, began = conditions.run_conditions(), time.monotonic()
        try:
            recs = cell.run(left)
        except Exception as e:  # noqa: BLE001 - reported, the study goes on, raised at the end
            out.failed.append(f"{cell.name} ({_one_line(e)})")
            tqdm.write(f"{study.experiment}: cell {cell.name} failed, going on: "
                       f"{out.failed[-1]}", file=sys.stderr)
            continue
        if recs is None:
            out.stopped = f"{cell.name} stopped early (resumable: run again to go on)"
            break
        if not recs:
            out.empty.append(cell.name)
            continue
        # the cell's wall time, compiles included: what recording it again costs
        # (repro.refresh); beside the record's numbers, never one of them
        took = round(time.monotonic() - began, 1)
        recs = [{**r, "extra": {**(r.get("extra") or {}), "cell_s": took}} for r in recs]
        recs = results.restamp(recs, hardware=hardware, note=note, stamp=stamp,
                               conditions=conditions.merge_conditions(
                                   before, conditions.run_conditions()))
        out.written.append(write_cell(recs, study, cell, root, out, snapshot))
    bar.close()
    if out.failed:
        raise CellsFailed(study.experiment, out.failed)
    return out
