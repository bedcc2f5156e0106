"""``repro notebook NAME``: convert a Jupytext notebook and execute it with papermill.

``notebooks/NAME.py`` (py:percent) becomes ``build/notebooks/NAME.ipynb`` and runs into
``build/notebooks/NAME.out.ipynb``, with the repository root as working directory and the
kernel's output in ``build/logs/NAME.log``. Parameters go to the notebook's parameters cell:
``profile``, ``scratch`` (where a notebook that declares it keeps its smoke records: a folder
of its own, emptied first, so a figure never mixes in records older code wrote; one given
with ``-p scratch=DIR``, relative to the repository, must lie under ``build/``) and any
``-p KEY=VALUE``, each of which must be a parameter that cell declares. A failed run leaves the
previous output alone and its partial output in ``NAME.failed.ipynb``; its error names the
notebook's own file and line (``notebooks/NAME.py:LINE``). A syntax error is found before any
cell runs.

**Committed outputs change only when the whole notebook succeeded.** While it runs, the
notebook writes its figures, verdicts and metrics into ``build/notebooks/NAME.staged/``
(``REPRO_STAGING``: :func:`repro.claims.ledger.outputs_root`); a complete run adds the executed
notebook as Markdown (``docs/notebooks/NAME.md``, :mod:`repro.markdown`: the same bytes on
every run with the same committed records) and moves them all into ``figures/``,
``verdicts/``, ``metrics/`` and ``docs/notebooks/``; a failed or interrupted one leaves the
last good ones where they are (DVC keeps them too: they are ``persist`` outputs of the stage).

A complete run also writes ``build/notebooks/NAME.outputs.json``: the committed outputs the run
wrote (figures, verdicts, metrics, its page) with their hashes. It is the notebook's DVC output in
``build/``: absent from a fresh clone (so ``dvc repro`` runs the notebook there), and the same
bytes on every run that regenerates the same figures, verdicts and metrics (so ``dvc.lock``
does not change when nothing did).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from repro.schema import suggest

KERNEL = "python3"
# committed, regenerated: figures, their headline series as data, verdicts, metrics, pages
OUTPUTS = ("figures/*.png", "figures/data/*.csv", "verdicts/*.json", "verdicts/inputs/*.json",
           "metrics/*.json", "docs/notebooks/*.md")


class NotebookError(ValueError):
    """A notebook, kernel or parameter that does not exist (one line)."""


def names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "notebooks").glob("[0-9]*.py"))


def source_of(root: Path, name: str) -> Path:
    given, name = name, Path(name).name.removesuffix(".py")
    source = root / "notebooks" / f"{name}.py"
    if not source.is_file():
        raise NotebookError(f"no notebook {given!r} (looked for {source.relative_to(root)}); "
                            f"available: {', '.join(names(root)) or 'none'}")
    return source


def declared_parameters(nb) -> dict[str, Any]:
    """The names the notebook's cell tagged ``parameters`` assigns, with their default values
    (None where a default is not a literal)."""
    out: dict[str, Any] = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            for node in ast.parse(cell.source).body:
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, ast.AnnAssign) else []
                try:
                    default = ast.literal_eval(node.value) if node.value is not None else None
                except (ValueError, TypeError, SyntaxError, AttributeError):
                    default = None
                out.update({t.id: default for t in targets if isinstance(t, ast.Name)})
    return out


def _kind(v: Any) -> str:
    return {bool: "bool", int: "number", float: "number", str: "text"}.get(type(v),
                                                                          type(v).__name__)


def check_parameters(name: str, declared: dict[str, Any], given: dict[str, Any]) -> None:
    """Every ``-p`` key a declared parameter, its value of the default's kind (a number for a
    number, text for text...; any value where the default is None) and finite."""
    for key, value in given.items():
        if key not in declared:
            raise NotebookError(f"-p {key}: notebook {name} has no parameter {key!r}"
                                f"{suggest(key, declared)}; "
                                f"its parameters: {', '.join(declared) or 'none'}")
        default = declared[key]
        if default is not None and _kind(value) != _kind(default):
            raise NotebookError(f"-p {key}={value!r}: notebook {name}'s {key} is "
                                f"{_kind(default)} (default {default!r})")
        if isinstance(value, float) and not math.isfinite(value):
            raise NotebookError(f"-p {key}={value!r}: expected a finite number")


def _empty_scratch(scratch: Path) -> None:
    """Empty a notebook's scratch folder, which holds only the records its last run wrote
    (``HARDWARE/EXPERIMENT/CELL.json``) and their programs' texts (``programs/HASH.txt.gz``);
    a folder holding anything else is left alone and refused in one line: a command deletes
    only what it created."""
    if not scratch.exists():
        return

    def ours(p: Path) -> bool:
        parts = p.relative_to(scratch).parts
        return (p.suffix == ".json" and len(parts) == 3) or (
            len(parts) == 2 and parts[0] == "programs" and p.name.endswith(".txt.gz"))

    foreign = [p for p in scratch.rglob("*") if p.is_file() and not ours(p)]
    if foreign or not scratch.is_dir():
        what = foreign[0].relative_to(scratch) if foreign else "a file"
        raise NotebookError(f"{scratch}: holds {what}, which is not a record; the notebook's "
                            "scratch folder is emptied before each run: move it away")
    shutil.rmtree(scratch)


def _require_kernel() -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        raise NotebookError(f"no Jupyter kernel {KERNEL!r}: run `python -m ipykernel install "
                            f"--sys-prefix --name {KERNEL}` (bash .ci/install does)") from None


def _write_ipynb(nb, source: Path, root: Path, ipynb: Path) -> None:
    import jupytext

    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata.setdefault("jupytext", {})["source"] = str(source.relative_to(root))
    tmp = ipynb.with_name(f".{ipynb.stem}.tmp.ipynb")
    jupytext.write(nb, tmp, fmt="ipynb")
    os.replace(tmp, ipynb)


def cell_lines(text: str, sources: list[str]) -> list[int | None]:
    """The line of ``text`` (a py:percent notebook) where each code cell source of
    ``sources`` starts (None where it is not found verbatim), cells searched in order."""
    out, cursor = [], 0
    for src in sources:
        at = text.find(src, cursor) if src.strip() else -1
        out.append(None if at < 0 else text.count("\n", 0, at) + 1)
        cursor = at + len(src) if at >= 0 else cursor
    return out


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def check_syntax(nb, source: Path, root: Path) -> None:
    """Refuse a notebook any of whose code cells does not parse, naming its own file and
    line, before a kernel starts (an IPython magic or shell line counts as blank)."""
    text, sources = source.read_text(), _code(nb)
    for src, start in zip(sources, cell_lines(text, sources)):
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                         for line in src.splitlines())
        try:
            ast.parse(code)
        except SyntaxError as e:
            line = (start or 1) + (e.lineno or 1) - 1
            raise NotebookFailed(f"notebook {source.stem} does not parse: "
                                 f"{source.relative_to(root)}:{line}: SyntaxError: {e.msg}; "
                                 "nothing was run") from None


class NotebookFailed(RuntimeError):
    """A notebook whose run failed (exit status 1)."""


_CELL_LINE = re.compile(r"Cell In\[(\d+)\], line (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def where_failed(executed: Path | None, error, source: Path, root: Path) -> str:
    """``notebooks/NAME.py:LINE`` of the innermost notebook line in a failed cell's
    traceback (IPython's ``Cell In[N], line L``), the cell's first line where the traceback
    names none; '' where the cell is not found in the source."""
    import nbformat

    text = source.read_text()
    rel = source.relative_to(root)
    cells = nbformat.read(executed, as_version=4).cells if executed and executed.exists() \
        else []
    code = [c for c in cells if c.cell_type == "code"]
    starts = dict(zip(map(id, code), cell_lines(text, [c.source for c in code])))
    by_count = {c.get("execution_count"): c for c in code}
    hits = _CELL_LINE.findall(_ANSI.sub("", "\n".join(error.traceback or [])))
    for count, line in reversed(hits):
        cell = by_count.get(int(count))
        if cell is not None and starts.get(id(cell)) is not None:
            return f"{rel}:{starts[id(cell)] + int(line) - 1}"
    if 0 <= (error.cell_index or 0) < len(cells) and cells[error.cell_index].cell_type == "code":
        start = starts.get(id(cells[error.cell_index]))
        if start is not None:
            return f"{rel}:{start}"
    return ""


def _execute(name: str, ipynb: Path, params: dict[str, Any], root: Path, log_path: Path,
             source: Path) -> int:
    """Run ``ipynb`` into ``NAME.out.ipynb``; 1 and a one-line error if a cell fails."""
    import papermill

    out, failed = ipynb.with_name(f"{name}.out.ipynb"), ipynb.with_name(f"{name}.failed.ipynb")
    tmp_out = ipynb.with_name(f".{name}.running.ipynb")
    handler = logging.FileHandler(log_path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    pm_log = logging.getLogger("papermill")
    pm_log.addHandler(handler)
    pm_log.setLevel(logging.INFO)
    try:
        with open(log_path, "a") as log:
            papermill.execute_notebook(
                str(ipynb), str(tmp_out), parameters=params, kernel_name=KERNEL,
                cwd=str(root), log_output=False, stdout_file=log, stderr_file=log,
                progress_bar=sys.stderr.isatty())
        os.replace(tmp_out, out)  # only a complete run replaces the previous output
    except papermill.PapermillExecutionError as e:
        if tmp_out.exists():
            os.replace(tmp_out, failed)
        at = where_failed(failed, e, source, root)
        print(f"repro: error: notebook {name} failed in cell {e.exec_count}"
              f"{f' ({at})' if at else ''}: {e.ename}: "
              f"{' '.join(str(e.evalue).split())[:300]} (see {failed.relative_to(root)} and "
              f"{log_path.relative_to(root)}; the committed figures, verdicts and metrics "
              "are unchanged)", file=sys.stderr)
        return 1
    finally:
        pm_log.removeHandler(handler)
        handler.close()
        tmp_out.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    print(f"wrote {out.relative_to(root)}", file=sys.stderr)
    return 0


def staged(staging: Path) -> list[str]:
    """The committed outputs a run wrote into ``staging`` (paths relative to it, sorted)."""
    return sorted(p.relative_to(staging).as_posix() for pattern in OUTPUTS
                  for p in staging.glob(pattern) if p.is_file())


def write_receipt(root: Path, name: str, profile: str, staging: Path) -> Path:
    """``build/notebooks/NAME.outputs.json``: the outputs the run wrote (in ``staging``),
    each with the first 16 hex digits of its sha256."""
    data = {"notebook": name, "profile": profile,
            "outputs": {p: hashlib.sha256((staging / p).read_bytes()).hexdigest()[:16]
                        for p in staged(staging)}}
    path = root / "build" / "notebooks" / f"{name}.outputs.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def commit_outputs(root: Path, staging: Path) -> list[str]:
    """Move the staged outputs into place (each file atomically); the paths moved."""
    moved = staged(staging)
    for rel in moved:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, target)
    shutil.rmtree(staging, ignore_errors=True)
    return moved


def run(name: str, profile: str, extra: dict[str, Any] | None = None) -> int:
    """Convert and execute ``notebooks/NAME.py`` for ``profile``; see the module docstring."""
    import jupytext

    from repro.checkout import repo_root

    root = repo_root().resolve()
    source = source_of(root, name)
    name, nb = source.stem, jupytext.read(source)
    try:
        check_syntax(nb, source, root)
    except NotebookFailed as e:
        print(f"repro: error: {e}", file=sys.stderr)
        return 1
    declared = declared_parameters(nb)
    check_parameters(name, declared, extra or {})
    params = {**(extra or {}), "profile": profile}
    if "scratch" in params:  # smoke records: scratch, in the git-ignored build/
        from repro.checkout import inside_repository

        given = str(params["scratch"])
        params["scratch"] = str(inside_repository(
            f"-p scratch={given}", given.strip() or ".", root, under="build",
            error=NotebookError, relative_to=root))
    if "scratch" in declared and "scratch" not in params:
        scratch = root / "build" / "results" / name
        _empty_scratch(scratch)
        params["scratch"] = str(scratch)
    _require_kernel()
    nb_dir, log_dir = root / "build" / "notebooks", root / "build" / "logs"
    nb_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    _write_ipynb(nb, source, root, nb_dir / f"{name}.ipynb")
    # The kernel must import this very `repro`, whichever directory it runs in.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent)]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    log_path = log_dir / f"{name}.log"
    print(f"repro notebook {name}: {source.relative_to(root)} -> build/notebooks/{name}.out"
          f".ipynb (profile={profile}, log {log_path.relative_to(root)})", file=sys.stderr)
    staging = nb_dir / f"{name}.staged"
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted run left
    staging.mkdir()
    saved = os.environ.get("REPRO_STAGING")
    os.environ["REPRO_STAGING"] = str(staging)
    status = 1
    try:
        status = _execute(name, nb_dir / f"{name}.ipynb", params, root, log_path, source)
    finally:
        if status != 0:  # failed or interrupted: the committed outputs stay as they were
            shutil.rmtree(staging, ignore_errors=True)
        if saved is None:
            os.environ.pop("REPRO_STAGING", None)
        else:
            os.environ["REPRO_STAGING"] = saved
    if status != 0:
        return status
    from repro import markdown

    markdown.write(nb_dir / f"{name}.out.ipynb", name, staged(staging),
                   staging / markdown.page(name))
    write_receipt(root, name, profile, staging)
    commit_outputs(root, staging)
    return 0
