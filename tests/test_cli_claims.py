"""`repro claims` (the ledger), `repro record all` (new-hardware flow) and resuming a record."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from repro import cli, config, evidence, results
from repro.claims import ledger as claims

ROOT = Path(__file__).resolve().parent.parent
IDS = [f"A{i}" for i in range(1, 13)] + [f"B{i}" for i in range(1, 7)] + ["C1", "C2"]


@pytest.fixture
def vdir(tmp_path, monkeypatch):
    d = tmp_path / "verdicts"
    monkeypatch.setenv("REPRO_VERDICTS", str(d))
    claims.write_verdict("B1", "reproduced", "0 bit mismatches in 123 elements", "cpu",
                         "notebooks/01_formats.py (checks)")
    claims.write_verdict("B4", "partly", "loss gap +0.7% | 3 seeds", "fake-gpu-x",
                         "build/results/fake-gpu-x/lm/*.json", emulated=True)
    return d


def one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repro: error: "), err
    return err[0]


# ------------------------------------------------------------------------------ claims


def test_claims_prints_every_claim_with_verdict_number_hardware_record(vdir, capsys):
    assert cli.main(["claims"]) == 0
    out = capsys.readouterr().out
    starts = [line.split()[0] for line in out.splitlines() if line and not line[0].isspace()]
    assert starts[1:] == IDS  # first line is the summary
    assert "20 claims (1 reproduced, 1 partly, 18 not yet measured)" in out
    b1 = out[out.index("\nB1 "):out.index("\nB2 ")]
    assert "reproduced" in b1 and "on cpu" in b1
    assert "key number: 0 bit mismatches in 123 elements" in b1
    assert "record: notebooks/01_formats.py (checks)" in b1
    b4 = out[out.index("\nB4 "):out.index("\nB5 ")]
    assert "partly" in b4 and "fake-gpu-x" in b4 and "(emulated)" in b4
    a2 = out[out.index("\nA2 "):out.index("\nA3 ")]
    assert "not yet measured" in a2 and "notebooks/03_rl_throughput.py" in a2


def test_claims_json_is_the_ledger(vdir, capsys):
    assert cli.main(["claims", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["claim"] for r in rows] == IDS
    assert all(r["verdict"] in claims.VERDICTS for r in rows)
    for r in rows:
        assert {"claim", "statement", "verdict", "key_number", "hardware", "source",
                "notebook", "emulated"} <= set(r)
    by_id = {r["claim"]: r for r in rows}
    assert by_id["B1"]["verdict"] == "reproduced" and by_id["B1"]["hardware"] == "cpu"
    assert by_id["B4"]["source"] == "build/results/fake-gpu-x/lm/*.json"
    assert by_id["B4"]["emulated"] is True and by_id["B1"]["emulated"] is False
    assert by_id["A5"] | {} == {**by_id["A5"], "verdict": "not yet measured", "key_number": ""}


def test_claims_markdown_is_the_readme_table(vdir, capsys):
    assert cli.main(["claims", "--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    assert table == claims.markdown_table()
    lines = table.splitlines()
    assert len(lines) == 2 + len(IDS)
    ncols = lines[0].count("|")
    b4 = next(x for x in lines if x.startswith("| B4 "))
    # a '|' inside a key number is escaped, so every row keeps the header's columns
    assert b4.replace("\\|", "").count("|") == ncols and "(emulated)" in b4
    # the record it comes from: in the terminal ledger and the JSON (the ledger's row is
    # one short line, its notebook linked)
    assert "[05](docs/notebooks/05_lm_nvfp4.md)" in b4
    assert cli.main(["claims"]) == 0
    assert "build/results/fake-gpu-x/lm/*.json" in capsys.readouterr().out


def test_claims_write(vdir, tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text("profile: smoke\n")  # a checkout's root
    (tmp_path / "results").mkdir(exist_ok=True)
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    assert cli.main(["claims", "--write"]) == 0
    assert "docs/ledger.md: ledger written (20 claims)" in capsys.readouterr().err
    page = tmp_path / "docs" / "ledger.md"
    assert page.read_text() == claims.page()
    assert cli.main(["claims", "--write"]) == 0
    assert "already up to date" in capsys.readouterr().err
    # a new verdict changes the generated table
    claims.write_verdict("A2", "contradicted", "1.1x", "h100-sxm", "results/h100-sxm/x")
    assert cli.main(["claims", "--write", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[1]["verdict"] == "contradicted"
    assert "| A2 |" in page.read_text() and "**contradicted**" in page.read_text()


def test_claims_errors_are_one_line(vdir, tmp_path, monkeypatch, capsys):
    assert cli.main(["claims", "--json", "--markdown"]) == 2
    assert "not allowed with" in one_error_line(capsys)
    (tmp_path / "params.yaml").write_text("profile: smoke\n")  # a checkout's root
    (tmp_path / "results").mkdir(exist_ok=True)
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    (tmp_path / "docs").write_text("a file where the folder goes\n")
    assert cli.main(["claims", "--write"]) == 1
    assert "the claims ledger's page: cannot write" in one_error_line(capsys)
    assert (tmp_path / "docs").read_text() == "a file where the folder goes\n"


@pytest.mark.slow
def test_claims_console_script_json(vdir):
    exe = Path(sys.executable).parent / "repro"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "repro.cli"]
    r = subprocess.run(cmd + ["claims", "--json"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert [x["claim"] for x in json.loads(r.stdout)] == IDS


def test_dvc_claims_stage_follows_every_verdict_writer():
    """The `claims` stage depends on the verdicts/ directory (so on every notebook stage that
    writes a verdict) and writes the ledger's page (persist, not cached), never the README;
    `site` comes after all (it depends on every notebook stage's receipt)."""
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    c = stages["claims"]
    assert c["cmd"] == "repro claims --write" and "verdicts" in c["deps"]
    assert c["outs"] == [{"docs/ledger.md": {"cache": False, "persist": True}}]
    assert not any("README.md" in str(s) for s in stages.values())
    writers = [n for n, s in stages.items() for o in s.get("outs", [])
               if next(iter(o) if isinstance(o, dict) else [o]).startswith("verdicts/")]
    assert writers, "no notebook stage declares a verdict output"
    assert list(stages)[-2:] == ["claims", "site"]
    receipts = {f"build/notebooks/{n['cmd'].split()[2]}.outputs.json"
                for n in stages.values() if n["cmd"].startswith("repro notebook ")}
    assert receipts <= set(stages["site"]["deps"])  # after every notebook stage
    for name, s in stages.items():  # nothing is both a dep and an out of one stage
        outs = {next(iter(o)) if isinstance(o, dict) else o for o in s.get("outs", [])}
        for dep in s.get("deps", []):
            assert not any(o == dep or o.startswith(dep.rstrip("/") + "/") for o in outs), name


# ------------------------------------------------------------------- record all, resume

TOY_CELLS = ("a", "b", "c")


def _toy_module(calls, interrupt_at=None, fail=False):
    """A registered experiment with three resumable cells (params.yaml section ``toy``, no
    schema); optionally interrupted at a cell, or failing in every cell."""
    from repro.studies.runner import Cell, Study

    mod = types.ModuleType("repro_toy_experiment")

    def cell(name):
        def run(_budget):
            if fail:
                raise RuntimeError("boom\nsecond line")
            if name == interrupt_at:
                raise KeyboardInterrupt
            calls.append(name)
            return [results.make_record("toy", "answer", len(calls), "1", sizes={"cell": name})]
        return run

    mod.STUDY = Study("broken" if fail else "toy", (), lambda p: [Cell(n, cell(n))
                                                                   for n in TOY_CELLS])
    return mod


PARAMS = """profile: smoke
gemm:
  common: {dtypes: [fp32, bf16], repeats: 1, input_sets: 1, error_shape: [32, 32, 32]}
  smoke: {shapes: [[64, 32, 32], [32, 64, 32]]}
  full: {shapes: [[64, 64, 64]]}
toy: {smoke: {}, full: {}}
broken: {smoke: {}, full: {}}
"""


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A throwaway repository root: its own params.yaml, results/, build/ and a toy experiment."""
    from repro import studies

    # a section of an experiment no study registers is refused: `broken` only where it is
    (tmp_path / "params.yaml").write_text(PARAMS.replace("broken: {smoke: {}, full: {}}\n", ""))
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    calls = []
    monkeypatch.setitem(sys.modules, "repro_toy_experiment", _toy_module(calls))
    monkeypatch.setitem(sys.modules, "repro_broken_experiment", _toy_module(calls, fail=True))
    monkeypatch.setattr(studies, "EXPERIMENTS", {"gemm": "repro.experiments.gemm.measure",
                                                 "toy": "repro_toy_experiment"})
    monkeypatch.setattr(config, "TOP_LEVEL", (*config.TOP_LEVEL, "toy"))
    yield types.SimpleNamespace(root=tmp_path, calls=calls)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.json"))}


@pytest.mark.slow
def test_record_all_on_a_new_hardware_then_side_by_side(repo, capsys):
    rc = cli.main(["record", "all", "--profile", "full", "--yes", "--hardware", "fake-gpu-x"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = repo.root / "results"
    assert sorted(p.name for p in (res / "fake-gpu-x" / "gemm").glob("*.json")) == [
        "64x64x64.json", "rel_error_32x32x32.json"]
    assert sorted(p.stem for p in (res / "fake-gpu-x" / "toy").glob("*.json")) == list(TOY_CELLS)
    assert not (repo.root / "build" / "results").exists()  # full profile -> results/
    assert "record all [full] on fake-gpu-x" in cap.err
    assert "gemm [full]: wrote 2 cell(s)" in cap.out and "toy [full]: wrote 3 cell(s)" in cap.out
    log = (repo.root / "build" / "logs" / "record.log").read_text()
    assert "hardware=fake-gpu-x" in log and "gemm [full]: wrote 2 cell(s)" in log

    # A second machine records the same study under its own name ...
    assert cli.main(["record", "gemm", "--profile", "full", "--yes",
                     "--hardware", "fake-gpu-y"]) == 0
    df = evidence.load_records("gemm", roots=res)
    assert set(df["hardware"]) == {"fake-gpu-x", "fake-gpu-y"}
    # ... and the records line up side by side: same cells, one row per hardware.
    tf = df[df["metric"] == "tflops"].pivot_table(index=["recipe", "size_M"],
                                                  columns="hardware", values="value")
    assert list(tf.columns) == ["fake-gpu-x", "fake-gpu-y"] and not tf.isna().any().any()
    assert set(evidence.load_records("toy", roots=res)["hardware"]) == {"fake-gpu-x"}

    # Rerunning the whole flow redoes nothing.
    before = _snapshot(res)
    capsys.readouterr()
    assert cli.main(["record", "all", "--profile", "full", "--yes", "--hardware", "fake-gpu-x"]) == 0
    out = capsys.readouterr().out
    assert "gemm [full]: wrote 0 cell(s)" in out and "toy [full]: wrote 0 cell(s)" in out
    assert _snapshot(res) == before and repo.calls == list(TOY_CELLS)


def test_interrupted_record_resumes_without_redoing_cells(repo, monkeypatch, capsys):
    from repro.experiments.gemm import measure as bench

    real_sweep, sweeps = bench.gemm_sweep, []

    def interrupted_sweep(*args, **kwargs):  # Ctrl-C during the second shape
        sweeps.append(tuple(args[0][0]))
        if len(sweeps) == 2:
            raise KeyboardInterrupt
        return real_sweep(*args, **kwargs)

    monkeypatch.setattr(bench, "gemm_sweep", interrupted_sweep)
    argv = ["record", "gemm", "--profile", "smoke", "--hardware", "fake-gpu-x"]
    assert cli.main(argv) == 130
    assert "interrupted" in capsys.readouterr().err
    cells = repo.root / "build" / "results" / "fake-gpu-x" / "gemm"
    assert [p.name for p in cells.glob("*.json")] == ["64x32x32.json"]
    first = (cells / "64x32x32.json").read_bytes()

    assert cli.main(argv) == 0  # resume: the finished cell is not redone
    assert "wrote 2 cell(s)" in capsys.readouterr().out
    assert sweeps == [(64, 32, 32), (32, 64, 32), (32, 64, 32)]
    assert (cells / "64x32x32.json").read_bytes() == first
    assert sorted(p.name for p in cells.glob("*.json")) == [
        "32x64x32.json", "64x32x32.json", "rel_error_32x32x32.json"]

    assert cli.main(argv) == 0  # finished: nothing new
    assert "wrote 0 cell(s)" in capsys.readouterr().out and len(sweeps) == 3


def test_record_all_resumes_an_interrupted_experiment(repo, monkeypatch, capsys):
    from repro import studies

    monkeypatch.setitem(sys.modules, "repro_toy_experiment",
                        _toy_module(repo.calls, interrupt_at="b"))
    monkeypatch.setattr(studies, "EXPERIMENTS", {"toy": "repro_toy_experiment"})
    assert cli.main(["record", "all", "--hardware", "fake-gpu-x"]) == 130
    assert repo.calls == ["a"]
    assert "toy: interrupted" in (repo.root / "build/logs/record.log").read_text()
    monkeypatch.setitem(sys.modules, "repro_toy_experiment", _toy_module(repo.calls))
    assert cli.main(["record", "all", "--hardware", "fake-gpu-x"]) == 0
    assert repo.calls == ["a", "b", "c"]  # a was not redone
    assert "toy [smoke]: wrote 2 cell(s)" in capsys.readouterr().out


def test_record_all_keeps_going_past_a_failure(repo, monkeypatch, capsys):
    from repro import studies

    monkeypatch.setattr(studies, "EXPERIMENTS", {"broken": "repro_broken_experiment",
                                                 "toy": "repro_toy_experiment"})
    monkeypatch.setattr(config, "TOP_LEVEL", (*config.TOP_LEVEL, "broken"))
    (repo.root / "params.yaml").write_text(PARAMS)
    assert cli.main(["record", "all", "--hardware", "fake-gpu-x"]) == 1
    cap = capsys.readouterr()
    assert "repro: broken failed: broken: 3 cell(s) failed" in cap.err
    assert "RuntimeError: boom" in cap.err and "second line" not in cap.err
    assert "toy [smoke]: wrote 3 cell(s)" in cap.out and "FAILED: broken" in cap.out
    log = (repo.root / "build/logs/record.log").read_text()
    assert "Traceback" in log and "CellsFailed" in log
    # one experiment alone: the failure is one line and exit status 1
    assert cli.main(["record", "broken", "--hardware", "fake-gpu-x"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("repro: error: broken: 3 cell(s) failed, the others were written")


@pytest.mark.parametrize("argv,expected", [
    (["record", "all", "--recipe", "bf16"], "do not apply to `repro record all`"),
    (["record", "all", "--only", "a*"], "do not apply to `repro record all`"),
    (["record", "all", "--profile", "huge"], "unknown profile 'huge'"),
])
def test_record_all_bad_input_is_one_line(repo, argv, expected, capsys):
    assert cli.main(argv) == 2
    assert expected in one_error_line(capsys)
    assert not any((repo.root / "results").iterdir()) and not (repo.root / "build").exists()


def test_record_all_validates_every_section_before_writing(repo, capsys):
    (repo.root / "params.yaml").write_text(PARAMS.replace("toy: {smoke: {}, full: {}}\n", "")
                                           .replace("broken: {smoke: {}, full: {}}\n", ""))
    assert cli.main(["record", "all"]) == 2
    assert "no section 'toy'" in one_error_line(capsys)
    assert not (repo.root / "build").exists()  # gemm, first in order, did not run
    (repo.root / "params.yaml").write_text(PARAMS.replace("repeats: 1", "repeats: 0")
                                           .replace("broken: {smoke: {}, full: {}}\n", ""))
    assert cli.main(["record", "all"]) == 2
    assert "params.yaml: gemm.common.repeats: must be > 0, got 0" in one_error_line(capsys)
    assert not (repo.root / "build").exists()
