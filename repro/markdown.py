"""The executed notebook as Markdown: ``docs/notebooks/NN_name.md``, read without running.

``repro notebook NAME`` writes it after a complete run (beside the figures, verdicts and
metrics, and like them only when the whole notebook succeeded), so the repository's web page
shows every notebook with its tables, figures and verdicts. It is committed, so it must be the
same bytes on every run and every machine that has the same committed records and code (CI
checks that ``dvc repro`` leaves a fresh clone clean). The rule: **a page keeps what the
notebook's code and the committed records determine, and leaves out what the run's machine,
clock or scratch records do**:

- Markdown cells as written; code cells as Python blocks. Papermill's injected parameters cell
  (it names this run's scratch folder) is left out: the notebook's own parameters cell shows
  the defaults.
- A **pipeline-check cell**, one that reads the smoke records (``nb.smoke_records(...)``) or
  is tagged ``pipeline-check``, shows its code and a line saying that its output (drawn from
  this machine's scratch records under ``build/``) is not kept.
- Outputs kept: Markdown (the verdicts) as is, HTML (tables) as is less its ``<style>``
  blocks, any other result as a text block. Left out: stderr (warnings, progress bars, the
  studies' timings), each stdout line and each result that names an absolute path (where this
  run wrote: scratch records, staged figures), images and widgets.
- Figures are never embedded: where a cell saved a committed figure (``nb.save(fig, "STEM",
  ...)`` with a literal stem, a figure this run wrote to ``figures/``), the page links it,
  ``![STEM](../../figures/STEM.png)``; a smoke figure (``build/figures/``) is never linked.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection
from pathlib import Path

PIPELINE_CHECK = "pipeline-check"  # a cell tag: its output is not kept
FIGURES = "../../figures"  # committed figures, from docs/notebooks/
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ABSOLUTE = re.compile(r"(?:^|[\s'\"(=:])/[\w.-]+/[\w.-]+")
_STYLE = re.compile(r"<style[^>]*>.*?</style>\s*", re.DOTALL)


def page(notebook: str) -> str:
    """Where the notebook's page is, relative to the repository (committed)."""
    return f"docs/notebooks/{notebook}.md"


def saved_stems(source: str) -> list[str]:
    """The literal stems of the figures a cell's code saves (``X.save(fig, "STEM", ...)``), in
    order; [] where the code does not parse."""
    try:
        tree = ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                   for line in source.splitlines()))
    except SyntaxError:
        return []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "save"
             and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
             and isinstance(n.args[1].value, str)]
    return list(dict.fromkeys(c.args[1].value for c in sorted(
        calls, key=lambda c: (c.lineno, c.col_offset))))


def is_pipeline_check(cell) -> bool:
    return (PIPELINE_CHECK in cell.get("metadata", {}).get("tags", [])
            or "smoke_records(" in cell.source)


def _clean(text: str) -> str:
    """Text as a terminal would leave it: no colour codes; a line rewritten with ``\\r`` (a
    progress bar) keeps its last state."""
    lines = _ANSI.sub("", text).replace("\r\n", "\n").split("\n")
    return "\n".join(line.rsplit("\r", 1)[-1] for line in lines)


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _output(out) -> str | None:
    """One output as Markdown; None where it is left out."""
    kind = out.get("output_type")
    if kind == "stream":
        if out.get("name") != "stdout":
            return None
        lines = [line for line in _clean(out.get("text", "")).splitlines()
                 if not _ABSOLUTE.search(line)]
        return _fence("\n".join(lines), "text") if "".join(lines).strip() else None
    if kind not in ("execute_result", "display_data"):
        return None  # errors: a notebook that failed writes no page
    data = out.get("data", {})
    if any(k.startswith("image/") for k in data):
        return None  # the committed figure is linked instead
    text = next((data[k] for k in ("text/markdown", "text/html", "text/plain") if k in data),
                None)
    if text is None:
        return None
    text = _clean(text if isinstance(text, str) else "".join(text))
    if _ABSOLUTE.search(text) or not text.strip():
        return None
    if "text/markdown" in data:
        return text.strip()
    if "text/html" in data:
        html = _STYLE.sub("", text)
        return "\n".join(line for line in html.splitlines() if line.strip())
    return _fence(text, "text")


def _merge_streams(outputs) -> list:
    """Consecutive stdout outputs as one (the kernel splits them where it flushes, and where
    stderr, left out, came between)."""
    merged: list = []
    for out in outputs:
        if out.get("output_type") == "stream" and out.get("name") != "stdout":
            continue
        if (out.get("output_type") == "stream" and merged
                and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == out.get("name")):
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + out.get("text", "")}
        else:
            merged.append(dict(out))
    return merged


def code_cell(cell, figures: Collection[str]) -> list[str]:
    """A code cell's blocks: its source, its kept outputs, the committed figures it saved."""
    blocks = [_fence(cell.source, "python")] if cell.source.strip() else []
    if is_pipeline_check(cell):
        blocks.append("*Output not kept: a pipeline check drawn from this machine's smoke "
                      "records (`build/`), not evidence.*")
        return blocks
    blocks += [b for b in map(_output, _merge_streams(cell.get("outputs", []))) if b]
    blocks += [f"![{stem}]({FIGURES}/{stem}.png)" for stem in saved_stems(cell.source)
               if f"figures/{stem}.png" in figures]
    return blocks


def to_markdown(nb, name: str, figures: Collection[str] = ()) -> str:
    """The executed notebook ``nb`` (``notebooks/NAME.py`` run) as Markdown; ``figures``: the
    committed outputs the run wrote (``figures/STEM.png``, relative to the repository)."""
    blocks = [(f"<!-- Generated by `repro notebook {name}` (`dvc repro`) from "
               f"notebooks/{name}.py: edit that, not this file. -->"),
              (f"*The notebook [`notebooks/{name}.py`](../../notebooks/{name}.py) as run by "
               "`dvc repro`: its tables, figures and verdicts come from the committed "
               "records; the smoke pipeline check's outputs are left out.*")]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            blocks.append(cell.source.strip())
        elif cell.cell_type == "code" and \
                "injected-parameters" not in cell.get("metadata", {}).get("tags", []):
            blocks += code_cell(cell, figures)
    return "\n\n".join(b for b in blocks if b) + "\n"


def write(executed: Path, name: str, figures: Collection[str], path: Path) -> None:
    """Read the executed notebook ``executed`` and write its page to ``path``."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_markdown(nb, name, figures))
