import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


#: what a footnote must not quote: a program's text (a jaxpr line: ``fj:key<fry>[4] =
#: random_split[shape=(4,)]``, ``dvm:f32[1408,512] = dot_general[``) or where two differ
PROGRAM = re.compile(r"first difference at line|\b\w+:\w+\[[\d,]*\]|<fry>|= \w+\[|\w+=_\w+")


def check_page(table: str, rows: list[dict]) -> None:
    """Every row at most ROW_LIMIT characters with its deciding clause whole; every footnote
    at most NOTE_LIMIT, in words (no program text)."""
    lines = [x for x in table.splitlines() if x.startswith("| ") and not x.startswith("| claim ")]
    assert len(lines) == len(rows) and rows
    for r, line in zip(rows, lines):
        assert len(line) <= claims.ROW_LIMIT, line
        assert claims._cell(claims.deciding(r)) in line, (r["claim"], line)
        assert (f" {claims.CHANGED}" in line.split(" | ")[2]) == claims.changed(r)
        if claims.first_rule(r):  # the rule before the data gives another verdict: both shown
            assert f"**{r['verdict']}** {claims.CHANGED} first rule: {claims.first_rule(r)}" \
                in line
    notes = [x for x in table.splitlines() if x.startswith("[^")]
    assert len(notes) == len(claims.stale_notes(rows))
    for note in notes:
        assert len(note.split("]: ", 1)[1]) <= claims.NOTE_LIMIT, note
        assert not PROGRAM.search(note), note
    assert (claims.LEGEND in table) == any(claims.changed(r) for r in rows)


def test_every_ledger_row_of_the_committed_verdicts_is_one_short_line():
    """The ledger's rows, generated from the committed verdicts/*.json, each tell the story
    in at most 300 characters with the clause that decides the verdict whole; what is stale
    goes to one footnote per notebook, in words and counts."""
    from repro.results import repo_root

    rows = claims.ledger()  # REPRO_VERDICTS unset: the committed verdicts
    assert (repo_root() / "verdicts").is_dir()
    table = claims.markdown_table(rows)
    check_page(table, rows)
    assert len(rows) == len(claims.claims())
    marks = {r["notebook"].split("_")[0] for r in rows if r["stale_note"]}
    notes = [x for x in table.splitlines() if x.startswith("[^")]
    assert {x[2:x.index("]")] for x in notes} == marks  # one footnote per notebook
    lines = [x for x in table.splitlines() if x.startswith("| ") and not x.startswith("| claim ")]
    for r, line in zip(rows, lines):
        assert (f"[^{r['notebook'].split('_')[0]}]" in line) == bool(r["stale_note"])
        assert ("— stale" in line) == r["stale"]


def test_the_committed_ledger_page_keeps_each_deciding_clause_and_words_only():
    """The same checks on the committed docs/ledger.md (as `repro claims --write` wrote it)."""
    from repro.results import repo_root

    text = (repo_root() / claims.PAGE).read_text()
    check_page(text[text.index("| claim |"):], claims.ledger())


def test_a_long_row_keeps_its_deciding_clause_whole_under_the_limit(vdir):
    """A key number of many clauses shows the one that decides, whole; a long statement,
    caveat and stale note are cut around it; the stale note goes to its notebook's footnote,
    marked alike on the ledger's page and the terminal."""
    from repro import tables

    claims.write_verdict(claims.Verdict(
        "A11", "partly", "1.22x at width 4096 (update 1.23x); " + "detail; " * 200
        + "FP8 pays from width 4096 on (policy sizes 256-4096)", "h200",
        "results/h200/legged", stale=True, stale_note="left out as stale: " + "x " * 400,
        caveat="contradicted under its rule before the data (2289868, 2026-11-29); "
               + "and more " * 40, decides="FP8 pays from width 4096 on (policy sizes 256-4096)",
        numbers={"registration": {"preregistered": 0, "changed": "17a3b9b"}}))
    rows = claims.ledger()
    table = claims.markdown_table(rows)
    check_page(table, rows)
    line = next(x for x in table.splitlines() if x.startswith("| A11 |"))
    assert f"**partly** {claims.CHANGED} — stale [^10]" in line
    assert "FP8 pays from width 4096 on (policy sizes 256-4096)" in line
    assert "detail" not in line and "and more" in line and "…" in line
    assert "x x x" not in line and "[^10]: 10_legged: A11: left out as stale: x x" in table
    term = tables.ledger(rows, width=100)
    assert f"partly {claims.CHANGED}" in term and "— stale [10]" in term
    assert "[10] 10_legged: A11:" in term and "caveat: contradicted under" in term


def test_a_rule_whose_first_verdict_differs_shows_both_in_its_row(vdir):
    said = "contradicted under its rule before the data (2289868, 2026-11-29); changed by " \
           "17a3b9b (2026-11-30)"
    claims.write_verdict(claims.Verdict(
        "A8", "inconclusive", "P=0.44 [0.35,0.53], but no seed diverged; " + said, "h200", "x",
        caveat=said + "; another caveat", numbers={"registration": {
            "preregistered": 0, "changed": "17a3b9b", "first_rule_verdict": "contradicted"}}))
    rows = claims.ledger()
    table = claims.markdown_table(rows)
    check_page(table, rows)
    line = next(x for x in table.splitlines() if x.startswith("| A8 |"))
    assert f"**inconclusive** {claims.CHANGED} first rule: contradicted" in line
    assert "another caveat" in line and "under its rule before" not in line


@settings(max_examples=60, deadline=None)
@given(statement=st.text(alphabet="abc |x(", min_size=0, max_size=400),
       clauses=st.lists(st.text(alphabet="abcd 0.(x)", min_size=1, max_size=150), min_size=1,
                        max_size=6),
       pick=st.integers(0, 5), cav=st.text(alphabet="abc ;(", max_size=500),
       hw=st.text(alphabet="h200 ,;", max_size=120), changed=st.booleans(),
       stale=st.booleans(), holds=st.text(alphabet="H200: FP8 1.5x;", max_size=200))
def test_any_row_is_at_most_the_limit_with_its_deciding_clause(statement, clauses, pick, cav,
                                                               hw, changed, stale, holds):
    """Rows of synthetic verdicts: at most ROW_LIMIT characters, the deciding clause whole
    wherever it fits the row at all."""
    decides = " ".join(clauses[pick % len(clauses)].split())
    row = {"claim": "A11", "statement": statement, "verdict": "partly",
           "key_number": "; ".join(clauses), "hardware": hw, "source": "", "note": "",
           "emulated": False, "stale": stale, "stale_note": "x" if stale else "",
           "caveat": cav, "decides": decides, "notebook": "10_legged", "holds_on": holds,
           "numbers": {"registration": {"preregistered": 0 if changed else 1}}}
    line = claims.markdown_row(row)
    assert len(line) <= claims.ROW_LIMIT
    empty = claims.markdown_row({**row, "statement": "", "caveat": "", "hardware": "",
                                 "decides": "", "key_number": "", "holds_on": ""})
    if len(empty) + len(claims._cell(decides)) <= claims.ROW_LIMIT:
        assert claims._cell(decides) in line


def test_a_rule_changed_after_its_data_has_one_mark_and_the_legend(vdir):
    claims.write_verdict(claims.Verdict("A8", "inconclusive", "P=0.44", "h200", "x",
                                        numbers={"registration": {"preregistered": 0}}))
    claims.write_verdict(claims.Verdict("A2", "partly", "1.5x", "h200", "x",
                                        numbers={"registration": {"preregistered": 1}}))
    table = claims.markdown_table()
    assert f"**inconclusive** {claims.CHANGED} |" in table and "**partly** |" in table
    assert table.count(claims.CHANGED) == 2 and claims.LEGEND in table  # the mark, its legend


@pytest.mark.parametrize("clause,number", [
    ("h200: FP8/FP16 whole loop up to 1.54x (width 4096, 2048 envs)", "1.54x"),
    ("P(fp8-delayed>fp32)=0.49 [0.41,0.57] (20% of its weight tied at 0.5) vs margin",
     "P=0.49 [0.41,0.57]"),
    ("projected 2.5-4.9x at width 4096 (h200 FP8/FP16 1.54x)", "2.5-4.9x"),
    ("FP8 held-out loss +0.07% vs BF16 (95% CI +0.04% .. +0.10%, 3 seeds)", "+0.07%"),
    ("h200: update memory FP8/FP16 = 1.02 at width 4096", "1.02"),
    ("at most 3 of 4 A1 stores in FP8 (variant fp8-e2e)", "3 of 4"),
    ("NVFP4 tensors take 0.252 (weights, 16x16 blocks)", "0.252"),
    ("65536x4096x4096 GEMM in FP8", ""),
    ("0 bit mismatches in 19456 E2M1 elements", "")])
def test_a_deciding_number_is_read_as_its_verdict_wrote_it(clause, number):
    assert claims.quantity(clause) == number


def test_holds_on_names_each_machine_its_format_and_number_and_the_int8_answer(vdir):
    """The "holds on" column, from verdicts alone: the machines a claim was decided on (not
    those it could not judge) with its format and deciding number, one joint number for
    machines decided together, and for an FP8 claim the INT8 claim that asks its question on
    a TPU v5e, with that claim's verdict; a claim not yet measured holds nowhere."""
    claims.write_verdict(claims.Verdict(
        "A2", "partly", "h200: FP8/FP16 whole loop up to 1.54x (width 4096, 2048 envs), "
        "update alone up to 1.57x; default fp8-delayed up to 1.54x", "h200; tpu-v5e: not "
        "judged (emulated there)", "x", numbers={"h200": {"fp8_fp16_e2e_max": 1.541}}))
    claims.write_verdict(claims.Verdict(
        "C1", "partly", "tpu-v5e: INT8/BF16 PPO update 1.41x (range 1.38-1.43 over 5 rounds), "
        "whole loop 1.22x (range 1.2-1.25) at width 4096, 2048 envs; target 1.3x", "tpu-v5e",
        "x", numbers={"tpu-v5e": {"update_ratio": 1.41}}))
    claims.write_verdict(claims.Verdict(
        "A5", "reproduced", "P(fp8-delayed>fp32)=0.49 [0.41,0.57] vs margin [0.40,0.60]: "
        "kept", "cpu (CartPole-v1, Acrobot-v1); h200 (Breakout-MinAtar)", "x"))
    claims.write_verdict(claims.Verdict(
        "A4", "contradicted", "h200: update memory FP8/FP16 = 1.02 at width 4096", "h200", "x"))
    rows = {r["claim"]: r for r in claims.ledger()}
    assert rows["A2"]["holds_on"] == "H200: FP8 1.54x; TPU v5e: INT8 1.41x (C1, partly)"
    assert rows["A9"]["holds_on"] == "TPU v5e: INT8 1.41x (C1, partly)"  # A9 itself unmeasured
    assert rows["C1"]["holds_on"] == "TPU v5e: INT8 1.41x"
    assert rows["A5"]["holds_on"] == "CPU + H200: FP8 P=0.49 [0.41,0.57]"
    assert rows["A4"]["holds_on"] == "H200: FP8 1.02, contradicted"
    assert rows["C2"]["holds_on"] == rows["B5"]["holds_on"] == ""
    table = claims.markdown_table(list(rows.values()))
    check_page(table, list(rows.values()))
    line = next(x for x in table.splitlines() if x.startswith("| A2 |"))
    assert "| H200: FP8 1.54x; TPU v5e: INT8 1.41x (C1, partly) |" in line
    assert table.splitlines()[0].split(" | ")[4] == "holds on"
