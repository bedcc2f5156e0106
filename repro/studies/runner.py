"""The one loop that runs a study: select cells, skip finished ones, run, write, report.

A study module describes its experiment as a :class:`Study`: its name, the claims it serves,
and a function from its (typed) parameters to a list of :class:`Cell`. A cell is one resumable
unit of work (a recipe at a size, an environment and a variant...): ``run()`` returns its
records, and the runner writes them atomically to
``<root>/<hardware>/<experiment>/<cell>.json``. Everything else lives here, once:

* resume: a cell already recorded on this hardware is skipped (``force`` redoes it);
* selection: ``only`` (glob patterns on cell names) and ``recipes`` (the recipes a cell uses);
* failures: a cell that raises is reported in one line and the study goes on; the run ends
  with :class:`CellsFailed` naming every failed cell (a cell the device cannot compile must
  not cost the rest of an unattended GPU call);
* a time budget: no new cell starts once it is spent (cells that checkpoint get what is left);
* Ctrl-C: finished cells are kept; the interrupt propagates to the caller;
* progress: one tqdm bar per study.

    STUDY = Study("mlp_step", claims=("A2",), cells=cells)   # in a study module
    runner.run(STUDY, params, root, force=False, only=["w4096*"])
"""

from __future__ import annotations

import fnmatch
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from repro import results

Records = list[dict[str, Any]]


@dataclass(frozen=True)
class Cell:
    """One resumable unit of a study.

    ``run(budget_s)`` returns the cell's records (``budget_s``: seconds left of the run's time
    budget, or None; most cells ignore it). ``recipes``: the recipe names the cell runs, for
    ``--recipe`` selection. A cell whose ``run`` returns None stopped early on purpose (e.g.
    at its time budget, with a checkpoint): nothing is written and the study stops there.
    """

    name: str
    run: Callable[[float | None], Records | None]
    recipes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Study:
    """An experiment: ``cells(params) -> [Cell, ...]`` in the order they should run.

    ``check(params)`` (optional) validates everything a run needs before the first cell
    starts (names of recipes, environments, sizes), raising a one-line ``ValueError``.
    """

    experiment: str
    claims: tuple[str, ...]
    cells: Callable[[dict[str, Any]], list[Cell]]
    check: Callable[[dict[str, Any]], None] | None = None
    about: str = ""


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


def _one_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:300]}"


@dataclass
class Outcome:
    """What a run did: files written, cells skipped (already recorded), cells failed."""

    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the run ended early (time budget), if it did


def run(study: Study, params: dict[str, Any], root: str | Path, *, force: bool = False,
        only: Sequence[str] | None = None, recipes: Sequence[str] | None = None,
        time_budget_s: float | None = None, progress: bool = True) -> Outcome:
    """Run the selected cells of ``study`` not yet recorded under ``root``; see the module
    docstring. Raises :class:`CellsFailed` at the end if any cell failed."""
    from tqdm import tqdm  # not tqdm.auto: that wants ipywidgets inside notebooks

    if study.check is not None:
        study.check(params)
    cells = select(study.cells(params), only, recipes)
    root = Path(root)
    out = Outcome()
    start = time.monotonic()
    bar = tqdm(cells, desc=f"{study.experiment} [{params.get('profile', '?')}]", unit="cell",
               file=sys.stderr, disable=not progress)
    for cell in bar:
        if not force and results.have_cell(study.experiment, cell.name, root=root):
            out.skipped.append(cell.name)
            continue
        left = None if time_budget_s is None else time_budget_s - (time.monotonic() - start)
        if left is not None and left <= 0:
            out.stopped = f"time budget spent before {cell.name}"
            break
        bar.set_postfix_str(cell.name)
        try:
            recs = cell.run(left)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - reported, the study goes on, raised at the end
            out.failed.append(f"{cell.name} ({_one_line(e)})")
            tqdm.write(f"{study.experiment}: cell {cell.name} failed, going on: "
                       f"{out.failed[-1]}", file=sys.stderr)
            continue
        if recs is None:
            out.stopped = f"{cell.name} stopped early (resumable)"
            break
        out.written.append(results.write_records(recs, study.experiment, cell.name, root=root))
    bar.close()
    if out.failed:
        raise CellsFailed(study.experiment, out.failed)
    return out
