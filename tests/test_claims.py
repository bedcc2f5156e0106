import json

import pytest

from repro.claims import ledger as claims


@pytest.fixture
def vdir(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path))
    return tmp_path


def test_claim_list_covers_every_id_in_claims_md():
    ids = set(claims.claims())
    assert ids == ({f"A{i}" for i in range(1, 13)} | {f"B{i}" for i in range(1, 7)}
                   | {"C1", "C2"})


def test_unmeasured_claims_say_so(vdir):
    rows = {r["claim"]: r for r in claims.ledger()}
    assert rows["A2"]["verdict"] == "not yet measured"


def test_written_verdict_reaches_ledger_and_markdown(vdir):
    claims.write_verdict("B1", "reproduced", "E2M1 values bit-exact", "cpu", "formats")
    data = json.loads((vdir / "B1.json").read_text())
    assert data["verdict"] == "reproduced"
    table = claims.markdown_table()
    line = next(x for x in table.splitlines() if x.startswith("| B1 "))
    assert "**reproduced**" in line and "E2M1 values bit-exact" in line


@pytest.mark.parametrize("claim,verdict", [("Z9", "reproduced"), ("A1", "great")])
def test_bad_claim_or_verdict_rejected(vdir, claim, verdict):
    with pytest.raises(ValueError):
        claims.write_verdict(claim, verdict, "", "", "")
    assert not list(vdir.iterdir())


def test_the_ledger_page_is_its_own_file_with_links_from_docs(vdir, tmp_path):
    """`repro claims --write` writes docs/ledger.md whole (the README only links it, so no
    pipeline step rewrites the README); its notebook links work from docs/."""
    path, changed = claims.write_page(tmp_path)
    assert changed and path == tmp_path / "docs" / "ledger.md"
    text = path.read_text()
    assert text.startswith("# Claims ledger\n") and "| A11 |" in text
    assert "(../docs/notebooks/10_legged.md)" in text and "(notebooks/" not in text
    assert claims.write_page(tmp_path) == (path, False)  # idempotent
    claims.write_verdict("A2", "contradicted", "1.1x", "h100-sxm", "results/h100-sxm/x")
    assert claims.write_page(tmp_path)[1] and "**contradicted**" in path.read_text()


def test_the_committed_ledger_page_is_what_the_verdicts_give():
    from repro.results import repo_root

    assert (repo_root() / claims.PAGE).read_text() == claims.page(), \
        "docs/ledger.md is out of date: run `repro claims --write` (or `dvc repro`)"
    readme = (repo_root() / "README.md").read_text()
    assert "](docs/ledger.md)" in readme and "| claim |" not in readme


def test_every_ledger_row_of_the_committed_verdicts_is_one_short_line():
    """The ledger's rows, generated from the committed verdicts/*.json, each tell the story
    in under 300 characters; what is stale goes to one footnote per notebook."""
    from repro.results import repo_root

    rows = claims.ledger()  # REPRO_VERDICTS unset: the committed verdicts
    assert (repo_root() / "verdicts").is_dir()
    table = claims.markdown_table(rows).splitlines()
    lines = [x for x in table if x.startswith("| ") and not x.startswith("| claim ")]
    assert len(lines) == len(rows) == len(claims.claims())
    for line in lines:
        assert len(line) < claims.ROW_LIMIT, line
    notes = [x for x in table if x.startswith("[^")]
    marks = {r["notebook"].split("_")[0] for r in rows if r["stale_note"]}
    assert {x[2:x.index("]")] for x in notes} == marks  # one footnote per notebook
    for r, line in zip(rows, lines):
        assert (f"[^{r['notebook'].split('_')[0]}]" in line) == bool(r["stale_note"])
        assert ("— stale" in line) == r["stale"]


def test_a_long_row_keeps_its_verdict_headline_and_caveat_under_the_limit(vdir):
    """A key number of many clauses shows its first; a long caveat and a long stale note
    still leave the row under the limit, the stale note in its notebook's footnote, marked
    alike on the ledger's page and the terminal."""
    from repro import tables

    claims.write_verdict(claims.Verdict(
        "A11", "partly", "1.22x at width 4096 (update 1.23x); " + "detail; " * 200, "h200",
        "results/h200/legged", stale=True, stale_note="left out as stale: " + "x " * 400,
        caveat="rule changed after its data: contradicted under the rule first registered; "
               + "and more " * 40))
    rows = claims.ledger()
    table = claims.markdown_table(rows)
    line = next(x for x in table.splitlines() if x.startswith("| A11 |"))
    assert len(line) < claims.ROW_LIMIT
    assert "**partly** — stale [^10]" in line and "1.22x at width 4096 (update 1.23x)" in line
    assert "detail" not in line and "rule changed after its data" in line and "…" in line
    assert "x x x" not in line and "[^10]: 10_legged: A11: left out as stale: x x" in table
    term = tables.ledger(rows, width=100)
    assert "partly" in term and "— stale [10]" in term and "[10] 10_legged: A11:" in term
    assert "caveat: rule changed after its data" in term


def test_the_caveat_falls_back_on_the_registration_numbers():
    row = {"caveat": "", "numbers": {"registration": {"preregistered": 0,
                                                      "first_rule_verdict": "contradicted"}}}
    assert claims.caveat(row) == ("rule changed after its data; contradicted under the first "
                                  "rule")
    assert claims.caveat({"numbers": {"registration": {"preregistered": 1}}}) == ""
