"""The documentation site: the executed notebooks as HTML pages, the claims ledger as index.

``build_site(root, out)`` converts every executed notebook ``build/notebooks/NAME.out.ipynb``
(written by ``repro notebook NAME``, i.e. by ``dvc repro``) to ``out/NAME.html`` with nbconvert
(figures are embedded as data URIs, so each page is one self-contained file), copies the
figures of ``figures/`` next to them, and writes ``out/index.html``: the claims ledger
(``repro.claims.ledger()``: verdict, key number, hardware, record, a link to the notebook page)
and one entry per notebook with its figures. Open ``build/site/index.html`` in a browser; the
DVC stage ``site`` (``repro site``) rebuilds it after the notebook stages.

A build replaces ``out`` whole, so it replaces only a folder it built: one holding its marker
file ``.repro-site`` (written by every build), an empty folder, or (the default
``build/site``) a site built before markers existed; anything else is refused in one line
(:class:`SiteError`), and nothing is deleted.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

SUFFIX = ".out.ipynb"
MARKER = ".repro-site"


class SiteError(ValueError):
    """An output folder the site build may not replace (one line)."""

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 75rem;
       margin: 2rem auto; padding: 0 1rem; color: #1f2328; line-height: 1.45; }
h1 { margin-bottom: .2rem; } .sub { color: #59636e; margin-top: 0; }
table { border-collapse: collapse; width: 100%; font-size: .92rem; }
th, td { border: 1px solid #d1d9e0; padding: .35rem .5rem; vertical-align: top; text-align: left; }
th { background: #f6f8fa; }
.verdict { font-weight: 600; white-space: nowrap; padding: .1rem .4rem; border-radius: .3rem; }
.v-reproduced { background: #dafbe1; } .v-partly { background: #fff8c5; }
.v-contradicted { background: #ffebe9; } .v-projected { background: #ddf4ff; }
.v-inconclusive { background: #fbefff; }
.v-not-yet-measured { background: #eff2f5; color: #59636e; }
.emulated { color: #9a6700; font-size: .85em; }
.stale { color: #9a3412; font-size: .85em; }
.nb { margin: 1.2rem 0; } .nb img { height: 9rem; margin: .3rem .5rem .3rem 0;
      border: 1px solid #d1d9e0; }
code { background: #eff2f5; padding: 0 .2rem; border-radius: .2rem; }
"""

NAV = ('<nav style="font-family: system-ui, sans-serif; padding: .5rem 1rem; '
       'border-bottom: 1px solid #d1d9e0; background: #f6f8fa">'
       '<a href="index.html">&larr; claims ledger and all notebooks</a>{extra}</nav>')


def notebook_pages(nb_dir: Path) -> list[Path]:
    """The executed notebooks (``NAME.out.ipynb``) in ``nb_dir``, sorted by name."""
    return sorted(Path(nb_dir).glob(f"*{SUFFIX}"))


def page_name(path: Path) -> str:
    """``build/notebooks/01_formats.out.ipynb`` -> ``01_formats``."""
    return Path(path).name[: -len(SUFFIX)]


def notebook_title(nb, fallback: str) -> str:
    """The first markdown heading of the notebook, without the ``#``."""
    for c in nb.cells:
        if c.cell_type == "markdown":
            for line in c.source.splitlines():
                if m := re.match(r"#+\s+(.*\S)", line):
                    return m.group(1)
    return fallback


def _profile(nb) -> str | None:
    return (nb.metadata.get("papermill", {}).get("parameters") or {}).get("profile")


def render_notebook(path: Path, nav_extra: str = "") -> tuple[str, dict[str, Any]]:
    """One executed notebook as a self-contained HTML page, and facts about it for the index."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(path), as_version=4)
    name = page_name(path)
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": name}})
    nav = NAV.format(extra=nav_extra)
    body, n = re.subn(r"(<body[^>]*>)", lambda m: m.group(1) + nav, body, count=1)
    if not n:
        body = nav + body
    errors = sum(1 for c in nb.cells if c.cell_type == "code"
                 for o in c.get("outputs", []) if o.get("output_type") == "error")
    return body, {"name": name, "title": notebook_title(nb, name), "profile": _profile(nb),
                  "errors": errors}


def _figures_of(name: str, figures: list[Path]) -> list[Path]:
    """Figures belong to a notebook by its number: ``05_lm_gap.png`` -> ``05_lm_nvfp4``."""
    prefix = name.split("_", 1)[0] + "_"
    return [f for f in figures if f.name.startswith(prefix)]


def _verdict_cell(verdict: str) -> str:
    cls = "v-" + re.sub(r"[^a-z]+", "-", verdict.lower()).strip("-")
    return f'<span class="verdict {cls}">{html.escape(verdict)}</span>'


def ledger_table(rows: list[dict[str, Any]], pages: set[str]) -> str:
    """The claims ledger as an HTML table; a claim's notebook links to its page when built."""
    e = html.escape
    out = ["<table>", "<thead><tr><th>claim</th><th>statement</th><th>verdict</th>"
           "<th>key number</th><th>hardware</th><th>record</th><th>notebook</th></tr></thead>",
           "<tbody>"]
    for r in rows:
        nb = r["notebook"]
        if nb and nb in pages:
            link = f'<a href="{e(nb)}.html">{e(nb)}</a>'
        elif nb:
            link = f"{e(nb)} <small>(not built)</small>"
        else:
            link = "&mdash;"
        emu = ' <span class="emulated">(emulated)</span>' if r.get("emulated") else ""
        if r.get("stale_note"):
            emu += f' <span class="stale">({e(r["stale_note"])})</span>'
        stale = ' <span class="stale">stale</span>' if r.get("stale") else ""
        out.append(f'<tr id="{e(r["claim"])}"><td><b>{e(r["claim"])}</b></td>'
                   f'<td>{e(r["statement"])}</td><td>{_verdict_cell(r["verdict"])}{stale}</td>'
                   f'<td>{e(r["key_number"])}{emu}</td><td>{e(r["hardware"])}</td>'
                   f'<td>{e(r["source"])}</td><td>{link}</td></tr>')
    out.append("</tbody></table>")
    return "\n".join(out)


def index_html(rows: list[dict[str, Any]], notebooks: list[dict[str, Any]]) -> str:
    """The index page: the same bytes for the same verdicts and notebooks (no date, no
    commit), so DVC sees an unchanged site where nothing changed."""
    e = html.escape
    pages = {nb["name"] for nb in notebooks}
    items = []
    for nb in notebooks:
        claims = [r["claim"] for r in rows if r["notebook"] == nb["name"]]
        facts = [f"claims {', '.join(claims)}" if claims else "",
                 f"profile {nb['profile']}" if nb["profile"] else "",
                 f"<b>{nb['errors']} cell error(s)</b>" if nb["errors"] else ""]
        figs = "".join(f'<a href="{e(nb["name"])}.html"><img src="figures/{e(f)}" '
                       f'alt="{e(f)}" title="{e(f)}"></a>' for f in nb["figures"])
        items.append(f'<div class="nb"><h3><a href="{e(nb["name"])}.html">{e(nb["title"])}'
                     f'</a></h3><p class="sub"><code>notebooks/{e(nb["name"])}.py</code> '
                     f'&middot; {" &middot; ".join(x for x in facts if x)}</p>'
                     f'<div>{figs}</div></div>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>repro: NVIDIA's FP8 RL and NVFP4 training claims, tested</title>
<style>{CSS}</style></head>
<body>
<h1>repro: NVIDIA's FP8 RL and NVFP4 training claims, tested</h1>
<p class="sub">Built by <code>dvc repro</code> (stage <code>site</code>) from the executed
notebooks. Every verdict is computed by its
notebook from recorded measurements; numbers marked <span class="emulated">(emulated)</span>
were not run on the hardware's native FP8/FP4 units.</p>
<h2 id="claims">Claims ledger</h2>
{ledger_table(rows, pages)}
<h2 id="notebooks">Notebooks</h2>
{"".join(items) or "<p>No executed notebooks yet: run <code>dvc repro</code>.</p>"}
</body></html>
"""


def _looks_built(out: Path) -> bool:
    """Only what a build writes: ``*.html`` pages and ``figures/*.png``."""
    for p in out.rglob("*"):
        rel = p.relative_to(out)
        if not (p.is_dir() and rel == Path("figures")
                or p.is_file() and (rel.suffix == ".html" and len(rel.parts) == 1
                                    or rel.parent == Path("figures") and rel.suffix == ".png")):
            return False
    return True


def check_out(out: Path, default: Path) -> None:
    """A one-line :class:`SiteError` unless the build may replace ``out`` (module docstring)."""
    if out.parent.exists() and not out.parent.is_dir():
        raise SiteError(f"--out {out}: {out.parent} is not a folder")
    if not out.exists():
        return
    if not out.is_dir():
        raise SiteError(f"--out {out}: a file is there, not a folder; choose a new folder")
    if (out / MARKER).is_file() or not any(out.iterdir()):
        return
    if out.resolve() == default.resolve() and _looks_built(out):
        return
    first = sorted(p.name for p in out.iterdir())[0]
    raise SiteError(f"--out {out}: not a site this command built (no {MARKER} in it; it holds "
                    f"{first!r} and {sum(1 for _ in out.iterdir()) - 1} more); the build "
                    "replaces its folder whole, so choose a new or empty folder")


def build_site(root: Path, out: Path | None = None, nb_dir: Path | None = None) -> Path:
    """Build the site from ``root``'s executed notebooks into ``out`` (default
    ``root/build/site``), replacing it whole (only a folder it built: :func:`check_out`);
    returns the path of ``index.html``."""
    from repro.claims import ledger as claims

    root = Path(root)
    default = root / "build" / "site"
    out = Path(out) if out is not None else default
    check_out(out, default)
    nb_dir = Path(nb_dir) if nb_dir is not None else root / "build" / "notebooks"
    figures = sorted((root / "figures").glob("*.png"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        (tmp / "figures").mkdir()
        notebooks = []
        for path in notebook_pages(nb_dir):
            name = page_name(path)
            src = f'notebooks/{name}.py'
            page, facts = render_notebook(
                path, nav_extra=f' &middot; source <code>{html.escape(src)}</code>')
            (tmp / f"{name}.html").write_text(page, encoding="utf-8")
            facts["figures"] = [f.name for f in _figures_of(name, figures)]
            for f in _figures_of(name, figures):
                shutil.copy2(f, tmp / "figures" / f.name)
            notebooks.append(facts)
        (tmp / "index.html").write_text(index_html(claims.ledger(), notebooks),
                                        encoding="utf-8")
        (tmp / MARKER).write_text("built by `repro site`; the next build replaces this folder\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "index.html"
