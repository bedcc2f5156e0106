"""The documentation site: notebook pages and the claims ledger index, from a fake notebook."""

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from repro import cli, site
from repro.claims import ledger as claims

# A 1x1 PNG: enough to check that figures are embedded in the page.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/"
                       "q842iQAAAABJRU5ErkJggg==")


def fake_executed_notebook(path: Path, title: str, profile: str = "smoke") -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["papermill"] = {"parameters": {"profile": profile}}
    code = nbformat.v4.new_code_cell("plot()", execution_count=1)
    code.outputs = [nbformat.v4.new_output(
        "display_data", data={"image/png": base64.b64encode(PNG).decode(),
                              "text/plain": "<Figure>"}),
        nbformat.v4.new_output("stream", name="stdout", text="verdict: reproduced\n")]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {title}\n\nSome text."), code]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.srcs, self.rows, self._row = [], [], [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a":
            self.hrefs.append(a["href"])
        if tag == "img":
            self.srcs.append(a["src"])
        if tag == "tr" and "id" in a:
            self._row = [a["id"], []]
            self.rows.append(self._row)

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._row is not None and data.strip():
            self._row[1].append(data.strip())


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path / "verdicts"))
    (tmp_path / "params.yaml").write_text("profile: smoke\n")  # a checkout's root
    (tmp_path / "results").mkdir(exist_ok=True)
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    fake_executed_notebook(tmp_path / "build/notebooks/01_formats.out.ipynb", "01 · Formats")
    # the converted (not executed) notebook and a failed run are not pages
    fake_executed_notebook(tmp_path / "build/notebooks/01_formats.ipynb", "unexecuted")
    fake_executed_notebook(tmp_path / "build/notebooks/02_x.failed.ipynb", "failed")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures/01_formats_values.png").write_bytes(PNG)
    (tmp_path / "figures/06_other.png").write_bytes(PNG)
    claims.write_verdict("B1", "reproduced", "0 bit mismatches <in> 19456 elements", "cpu",
                         "notebooks/01_formats.py (checks)")
    claims.write_verdict("B2", "projected", "1.53x", "h200 -> gb200", "perfmodel records")
    return tmp_path


def test_site_index_links_pages_and_shows_the_ledger(root):
    out = root / "site"
    index = site.build_site(root, out)
    assert index == out / "index.html"
    assert sorted(p.name for p in out.glob("*.html")) == ["01_formats.html", "index.html"]

    p = Links()
    p.feed(index.read_text())
    for href in p.hrefs + p.srcs:  # every link of the index resolves inside the site
        assert (out / href).exists(), href
    assert "01_formats.html" in p.hrefs and p.srcs == ["figures/01_formats_values.png"]

    rows = {rid: cells for rid, cells in p.rows}
    assert list(rows) == list(claims.claims())  # every claim, in ledger order
    assert rows["B1"] == ["B1", claims.claims()["B1"]["claim"], "reproduced",
                          "0 bit mismatches <in> 19456 elements", "cpu",
                          "notebooks/01_formats.py (checks)", "01_formats"]
    assert rows["B2"][2:5] == ["projected", "1.53x", "h200 -> gb200"]
    assert rows["B2"][-2:] == ["06_perfmodel", "(not built)"]  # no page, no dead link
    assert rows["A2"][2] == "not yet measured"
    assert "&lt;in&gt;" in index.read_text()  # text is escaped
    text = index.read_text()
    assert "01 · Formats" in text and "profile smoke" in text and "claims B1" in text

    page = (out / "01_formats.html").read_text()
    assert "data:image/png;base64," in page  # figures embedded: one self-contained file
    assert '<a href="index.html">' in page and "verdict: reproduced" in page
    assert (out / "figures/01_formats_values.png").read_bytes() == PNG


def test_site_rebuild_replaces_the_old_site(root):
    out = root / "site"
    site.build_site(root, out)
    (root / "build/notebooks/01_formats.out.ipynb").unlink()
    (out / "stray.txt").write_text("x")
    index = site.build_site(root, out)
    assert sorted(p.name for p in out.iterdir()) == [".repro-site", "figures", "index.html"]
    assert "No executed notebooks yet" in index.read_text()
    assert not list(root.glob(".site-*"))  # no temp dirs left


def test_repro_site_command(root, capsys):
    assert cli.main(["site"]) == 0
    assert "wrote build/site/index.html (1 notebook page(s))" in capsys.readouterr().err
    assert (root / "build/site/01_formats.html").exists()
    assert re.search(r'href="01_formats.html"', (root / "build/site/index.html").read_text())


def test_notebook_figures_of_smoke_records_stay_out_of_figures(tmp_path, monkeypatch):
    """Committed full-profile records draw into figures/, smoke records into build/figures/;
    the caption names the hardware and the profile."""
    import matplotlib

    matplotlib.use("Agg")  # the test draws off-screen; notebooks keep their inline backend
    import matplotlib.pyplot as plt
    import pandas as pd

    from repro import notebook

    (tmp_path / "params.yaml").write_text("profile: smoke\n")  # a checkout's root
    (tmp_path / "results").mkdir(exist_ok=True)
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    nb = notebook.Notebook("03_x", "smoke", {}, None, tmp_path)
    full = pd.DataFrame({"hardware": ["h200"], "hardware_name": ["NVIDIA H200"],
                         "profile": ["full"]})
    smoke = pd.DataFrame({"hardware": ["cpu"], "hardware_name": ["cpu"], "profile": ["smoke"]})
    assert nb.save(plt.figure(), "03_a", full) == tmp_path / "figures/03_a.png"
    assert nb.save(plt.figure(), "03_a", smoke) == tmp_path / "build/figures/03_a.png"
    assert (tmp_path / "figures/03_a.png").read_bytes()[:4] == b"\x89PNG"
    text, is_smoke = notebook.caption(full)
    assert "NVIDIA H200 (h200)" in text and "full profile" in text and not is_smoke
    text, is_smoke = notebook.caption(smoke)
    assert "cpu; smoke profile" in text and "not evidence" in text and is_smoke


def test_a_figure_caption_counts_the_stale_records_and_the_text_names_them(tmp_path):
    import pandas as pd

    from repro import notebook

    nb = notebook.Notebook("04_x", "full", {}, None, tmp_path)
    row = {"hardware": "h200", "hardware_name": "NVIDIA H200", "profile": "full",
           "experiment": "rl_quality", "source": "a.json", "git_commit": "abc1234",
           "stale": False, "stale_reason": None}
    fresh = pd.DataFrame([row])
    assert "other code" not in nb.caption(fresh)[0] and "stale" not in nb.caption(fresh)[0]
    assert nb.stale_notes(fresh) == []
    drawn = pd.DataFrame([row, {**row, "source": "b.json", "stale": True,
                                "stale_reason": "its code changed"}])
    text = nb.caption(drawn)[0]
    assert "1 cell drawn from records of other code" in text and "left out" not in text
    assert nb.stale_notes(drawn) == ["drawn from records of other code than this checkout's: "
                                     "1 rl_quality cell(s) (its code changed; recorded at "
                                     "abc1234)"]
    nb.left_out.extend([pd.DataFrame([{**row, "source": f"{c}.json", "stale": True,
                                       "stale_reason": "older jax " + "x" * 300}])
                        for c in "cdefg"])
    text = nb.caption(fresh)[0]
    assert "5 cells left out as stale" in text and "drawn" not in text
    assert len(text.splitlines()) <= 2 and all(len(t) <= 140 for t in text.splitlines())
    assert nb.stale_notes(fresh)[0].startswith("left out as stale: 5 rl_quality cell(s) "
                                               "(older jax xxx")
    smoke = pd.DataFrame([{**row, "profile": "smoke", "stale": True}])
    assert "stale" not in nb.caption(smoke)[0]


def test_a_figure_without_data_says_why_in_words(tmp_path, monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from repro import notebook

    (tmp_path / "params.yaml").write_text("profile: smoke\n")  # a checkout's root
    (tmp_path / "results").mkdir(exist_ok=True)
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    fig, ax = plt.subplots()
    ax.axhline(1.0)
    ax.set_title("speedup")
    assert not notebook.draws_data(fig)
    for draw in (lambda a: a.plot([1, 2], [3, 4]), lambda a: a.scatter([1], [2]),
                 lambda a: a.bar(["a"], [1]), lambda a: a.fill_between([1, 2], [0, 0], [1, 1])):
        f, a = plt.subplots()
        draw(a)
        assert notebook.draws_data(f)
    nb = notebook.Notebook("03_x", "full", {}, None, tmp_path)
    row = {"hardware": "h200", "profile": "full", "experiment": "rl_throughput",
           "source": "a.json", "stale": True, "stale_since": "4ae7449aaa",
           "stale_reason": "older code"}
    nb.left_out.append(pd.DataFrame([row, {**row, "source": "b.json"}]))
    assert nb.why_empty(pd.DataFrame()).startswith(
        "No fresh records: 2 cells of rl_throughput are stale, their code changed since 4ae7449")
    assert nb.caption(pd.DataFrame())[0].startswith("No fresh records.\n2 cells left out")
    seen = []
    monkeypatch.setattr(notebook, "empty_figure",
                        lambda title, why: seen.append((title, why)) or plt.figure())
    nb.save(fig, "03_empty", pd.DataFrame())
    assert seen == [("speedup", nb.why_empty(pd.DataFrame()))]
    nb.save(plt.figure(), "03_again", pd.DataFrame())  # the same stale list, printed once
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and "(as above)" in printed[1] and "older" not in printed[1]


def test_notebook_conclusion_writes_the_ledger_and_quotes_the_verdict(tmp_path, monkeypatch):
    from repro import notebook
    from repro.claims.verdicts import Verdict

    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path / "verdicts"))
    monkeypatch.setenv("REPRO_STAGING", str(tmp_path / "staged"))  # its metrics file
    nb = notebook.Notebook("05_x", "full", {}, None, tmp_path)
    md = nb.conclusion(Verdict("B3", "partly", "0.252 of BF16's bytes", "h200",
                               "results/*/lm", "scales cost extra."))
    assert md.data.startswith(f"**B3 ({claims.claims()['B3']['claim']}): partly.** 0.252 of")
    assert "scales cost extra. Evidence: h200, `results/*/lm`." in md.data
    assert claims.ledger()[list(claims.claims()).index("B3")]["verdict"] == "partly"
    assert (tmp_path / "staged" / "metrics" / "05_x.json").is_file()
