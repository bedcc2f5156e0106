"""Each claim's ledger set (repro.claims.ledger_set): the cells its verdict reads, named in
repro/data/claims.yaml, selected from the records, and planned per hardware within one device
call."""

import json

import pandas as pd
import pytest

from repro import cli, evidence, refresh, results
from repro.claims import ledger_set
from repro.verdict import definitions


def test_braces_expand_and_globs_stay():
    assert ledger_set.expand("mlp_w{4096,2048}_e{2048,256}_paired") == [
        "mlp_w4096_e2048_paired", "mlp_w4096_e256_paired", "mlp_w2048_e2048_paired",
        "mlp_w2048_e256_paired"]
    assert ledger_set.expand("a_{x,y{1,2}}*") == ["a_x*", "a_y1*", "a_y2*"]
    assert ledger_set.expand("plain") == ["plain"]


def test_every_named_ledger_cell_is_a_cell_of_its_study_or_on_disk():
    """A renamed cell or a typo would leave a verdict reading nothing: every pattern of every
    claim matches a cell the study makes (full profile, on the hardware named) or a cell file
    under results/, and every claim but those without records names its cells."""
    unmatched = []
    for hw in {e.where for e in ledger_set.entries()}:
        rows = refresh.ledger_plan("h200" if hw in ledger_set.ANYWHERE else hw,
                                   [e.claim for e in ledger_set.entries() if e.where == hw],
                                   quality=True, stale=[])  # names only: no staleness
        unmatched += [f"{hw}: {c['experiment']}/{c['cell']}" for c in rows
                      if c["status"] == "missing" and not c["recordable"]
                      and not c.get("variant_of")]
    assert not unmatched, unmatched
    named = {e.claim for e in ledger_set.entries()}
    without = {cid for cid, c in definitions().items() if not c.get("ledger")}
    assert named, "no claim names its ledger cells"
    assert named | without == set(definitions())
    assert without <= {"B1", "B5"}, without  # nothing recorded can decide them yet


def test_a_malformed_ledger_is_one_line_naming_the_claim():
    with pytest.raises(ValueError, match="X9: ledger.h200.gemm must be a list"):
        ledger_set.entries({"X9": {"ledger": {"h200": {"gemm": {"a": 1}}}}})
    with pytest.raises(ValueError, match="X9: ledger must map"):
        ledger_set.entries({"X9": {"ledger": ["gemm"]}})


def _rows(*specs):
    return pd.DataFrame([{"source": f"/r/results/{hw}/{exp}/{cell}.json", "hardware": hw,
                          "experiment": exp, "stale": stale, "timestamp": ts, "value": i}
                         for i, (hw, exp, cell, stale, ts) in enumerate(specs)])


def _use(monkeypatch, claims):
    """The ledger entries of ``claims`` (claims.yaml's shape) in place of the real ones."""
    monkeypatch.setattr(ledger_set, "entries",
                        lambda c=None, _e=ledger_set.entries: _e(claims))


def test_select_keeps_the_claims_cells_and_one_hardware_per_anywhere_cell(monkeypatch):
    claims = {"Q1": {"ledger": {"h200": {"rl_throughput": ["mlp_*_paired"]},
                                "any": {"rl_quality": ["CartPole-v1_{fp32,fp8-delayed}"]}}},
              "Q2": {"ledger": {"h200": {"rl_throughput": ["cnn_w0_bf16"]}}}}
    _use(monkeypatch, claims)
    df = _rows(("h200", "rl_throughput", "mlp_w4096_e2048_paired", False, "2026-01-01"),
               ("tpu-v5e", "rl_throughput", "mlp_w4096_e2048_paired", False, "2026-01-02"),
               ("h200", "rl_throughput", "mlp_w4096_bf16_e2048", False, "2026-01-01"),
               ("h200", "rl_throughput", "cnn_w0_bf16", False, "2026-01-01"),
               ("h200", "rl_quality", "CartPole-v1_fp32", True, "2026-01-05"),
               ("cpu", "rl_quality", "CartPole-v1_fp32", False, "2026-01-01"),
               ("cpu", "rl_quality", "CartPole-v1_fp32", False, "2026-01-01"),
               ("h200", "rl_quality", "CartPole-v1_fp8-delayed", False, "2026-01-01"),
               ("tpu-v5e", "rl_quality", "CartPole-v1_fp8-delayed", False, "2026-02-01"),
               ("cpu", "rl_quality", "CartPole-v1_fp16", False, "2026-01-01"))
    got = ledger_set.select(df, "Q1")
    assert list(got["value"]) == [0, 5, 6, 8]  # h200's paired cell; cpu's fresh fp32 (both
    # records) over h200's stale one; the newest fp8-delayed; no figure cell, no Q2 cell
    assert list(ledger_set.select(df, "Q1", "Q2")["value"]) == [0, 3, 5, 6, 8]
    assert not len(ledger_set.select(df, "Q3"))


def test_a_cells_claims_and_the_anywhere_hardware():
    ents = [ledger_set.Entry("A", "h200", "gemm", "65536x*"),
            ledger_set.Entry("B", "any", "gemm", "*"), ledger_set.Entry("C", "cpu", "lm", "*")]
    assert ledger_set.claims_of("h200", "gemm", "65536x256x256", ents) == ["A", "B"]
    assert ledger_set.claims_of("tpu-v5e", "gemm", "65536x256x256", ents) == ["B"]
    assert ledger_set.claims_of("h200", "lm", "x", ents) == ["C"]
    assert ledger_set.claims_of("h200", "mlp_step", "x", ents) == []


def test_the_h200_speed_set_fits_one_device_call():
    """Every speed claim judged on the H200 names its cells there, and recording all of them
    again (compiles included, estimated from the records' own times) fits one device call of
    25 minutes: the lease refreshes the speed ledger whatever changed."""
    rows = refresh.ledger_plan("h200")
    claims = {cl for c in rows for cl in c["claims"]}
    assert {"A2", "A4", "A9", "A11", "A12", "B6"} <= claims, claims
    assert not claims & ledger_set.projections(), "projections are refreshed with --claim"
    total = sum(c["estimate_s"] for c in rows)
    assert 0 < total <= 25 * 60, f"the H200 speed ledger takes ~{total / 60:.1f} min"
    assert all(c["estimate_s"] > 0 for c in rows)


def test_the_plan_command_lists_the_set_and_its_total(capsys):
    assert cli.main(["record", "--ledger", "--plan", "--hardware", "h200"]) == 0
    err = capsys.readouterr().err
    assert "rl_throughput/mlp_w4096_e2048_paired  [A2, A4, A9]" in err
    assert "ledger set on h200:" in err and "to record all of it" in err
    assert cli.main(["record", "--ledger", "--plan", "--claim", "A2", "--hardware", "h200"]) == 0
    err = capsys.readouterr().err
    assert "cnn_w0" not in err and "mlp_w2048_e2048_paired" in err


def test_a_pattern_of_recipe_cells_not_yet_recorded_is_planned_as_missing(capsys):
    """C1's cell is recorded with --recipe (named after its recipes): before its first record
    no cell matches its pattern, and the plan still lists it, with the command that makes
    it; a pattern whose stem is no cell of the study stays unmatched (a typo)."""
    assert cli.main(["record", "--ledger", "--plan", "--hardware", "tpu-v5e"]) == 0
    err = capsys.readouterr().err
    assert "rl_throughput/mlp_w4096_e2048_paired_*int8*  [C1]" in err
    assert "--only mlp_w4096_e2048_paired --recipe" in err
    rows = refresh.ledger_plan("tpu-v5e", ["C1"], stale=[])
    assert [(c["status"], c.get("variant_of")) for c in rows] == [
        ("missing", "mlp_w4096_e2048_paired")]


def test_ledger_refuses_cell_selection_and_unknown_claims(capsys):
    assert cli.main(["record", "--ledger", "--only", "x*"]) == 2
    assert "--ledger chooses the cells itself" in capsys.readouterr().err
    assert cli.main(["record", "--ledger", "--plan", "--claim", "Z9"]) == 2
    assert "unknown claim 'Z9'" in capsys.readouterr().err
    assert cli.main(["record", "--ledger", "--stale"]) == 2


def test_the_committed_stale_set_is_current():
    """results/programs/stale.json is the stale set of this checkout: a commit that stales a
    cell (or refreshes one) shows it in that file's diff, never silently."""
    from repro import refresh

    path = results.repo_root().joinpath(*refresh.STALE_SET)
    assert path.is_file(), "no committed stale set: run `repro status --write-index`"
    committed = json.loads(path.read_text())
    now = refresh.stale_set(evidence.stale_cells())
    new = sorted(set(now) - set(committed))
    gone = sorted(set(committed) - set(now))
    other = sorted(k for k in set(now) & set(committed) if now[k] != committed[k])
    assert not (new or gone or other), (
        f"the stale set changed: newly stale {new[:5]}, no longer stale {gone[:5]}, otherwise "
        f"changed {other[:5]}: run `repro status --write-index` and commit what it writes "
        "(and, for a ledger cell, its records, a variant or an acknowledgement)")


def test_no_ledger_cell_is_stale_without_an_acknowledgement():
    """A stale cell a verdict reads lands with its re-records, as a new recipe variant, or
    acknowledged in repro/data/acknowledged.yaml, which the ledger names beside the verdict."""
    from repro import refresh

    stale = refresh.stale_set(evidence.stale_cells())
    acks = ledger_set.acknowledgements()
    silent = [f"{k} ({', '.join(v['ledger'])}: {v['why'][:80]})" for k, v in stale.items()
              if v["ledger"] and ledger_set.acknowledged(*k.split("/"), acks) is None]
    assert not silent, "stale ledger cells without an acknowledgement: " + "; ".join(silent)
    import fnmatch

    unused = [pat for pat, _ in acks if not any(fnmatch.fnmatchcase(k, pat) for k, v in
                                                 stale.items() if v["ledger"])]
    assert not unused, f"acknowledgements of no stale ledger cell (remove them): {unused}"


def test_acknowledgements_are_checked_for_their_form(tmp_path):
    bad = tmp_path / "a.yaml"
    bad.write_text("- cells: [x]\n")
    with pytest.raises(ValueError, match="entry 1 needs `cells`"):
        ledger_set.acknowledgements(bad)
    good = tmp_path / "b.yaml"
    good.write_text('- cells: ["h200/gemm/{a,b}*"]\n  why: "it\n    changed"\n')
    acks = ledger_set.acknowledgements(good)
    assert ledger_set.acknowledged("h200", "gemm", "b7", acks) == "it changed"
    assert ledger_set.acknowledged("h200", "gemm", "c7", acks) is None


def test_an_environments_cells_come_from_one_hardware(monkeypatch):
    """Variants compared within an environment never mix machines: where a CPU holds fresh
    records of an environment's cells, the verdict reads that environment on the CPU alone
    (even a cell the CPU lacks is not filled in from another machine)."""
    claims = {"Q1": {"ledger": {"any": {"rl_quality": ["{CartPole-v1,Acrobot-v1}_*"]}}}}
    _use(monkeypatch, claims)
    rows = _rows(("cpu", "rl_quality", "CartPole-v1_fp32", False, "2026-01-05"),
                 ("h200", "rl_quality", "CartPole-v1_fp32", True, "2026-01-01"),
                 ("h200", "rl_quality", "CartPole-v1_fp8-delayed", True, "2026-01-01"),
                 ("h200", "rl_quality", "Acrobot-v1_fp32", True, "2026-01-01"),
                 ("h200", "rl_quality", "Acrobot-v1_fp8-delayed", True, "2026-01-01"))
    rows["sizes"] = [{"env": c.split("_")[0]} for c in rows["source"].map(
        lambda s: ledger_set.cell_of(s)[2])]
    got = ledger_set.select(rows, "Q1")
    assert list(got["value"]) == [0, 3, 4]  # CartPole on the CPU; Acrobot on the H200


def test_a_cell_any_machine_may_hold_is_not_planned_where_another_holds_it_fresh(
        monkeypatch, tmp_path):
    _use(monkeypatch, {"Q1": {"ledger": {"any": {"rl_quality": [
        "CartPole-v1_{fp32,fp8-delayed}"]}}}})
    (tmp_path / "cpu" / "rl_quality").mkdir(parents=True)
    (tmp_path / "cpu" / "rl_quality" / "CartPole-v1_fp32.json").write_text("[]")
    monkeypatch.setattr(results, "results_dir", lambda: tmp_path)
    rows = {c["cell"]: c["status"] for c in refresh.ledger_plan("h200", quality=True,
                                                                  stale=[])}
    assert rows == {"CartPole-v1_fp32": "fresh on cpu", "CartPole-v1_fp8-delayed": "missing"}
    stale = [{"hardware": "cpu", "folder": "rl_quality", "cell": "CartPole-v1_fp32"}]
    rows = {c["cell"]: c["status"] for c in refresh.ledger_plan("h200", quality=True,
                                                                  stale=stale)}
    assert rows["CartPole-v1_fp32"] == "missing"  # stale there: recorded here
