import json

import pytest

from repro.claims import ledger as claims


@pytest.fixture
def vdir(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path))
    return tmp_path


def test_claim_list_covers_every_id_in_claims_md():
    ids = set(claims.claims())
    assert ids == {f"A{i}" for i in range(1, 12)} | {f"B{i}" for i in range(1, 7)}


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


def test_update_readme_replaces_only_the_marked_table(vdir, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- claims:begin -->\nold\n<!-- claims:end -->\noutro\n")
    assert claims.update_readme(readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    assert "| A11 |" in text
    assert not claims.update_readme(readme)  # idempotent
