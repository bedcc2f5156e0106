"""Tidy records: fields, atomic writes, resumable cells, loading across hardware."""

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from repro import evidence, hardware, results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """A repository root of its own (results/) and a scratch folder for smoke records."""
    (tmp_path / "params.yaml").write_text("profile: smoke\n")
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    results.use_scratch(tmp_path / "scratch")
    yield tmp_path
    results.use_scratch(None)


def rec(slug="h200", value=1.0, recipe="bf16", **kw):
    return results.make_record("gemm", "tflops", value, "TFLOP/s", claims=["A2", "B2"],
                               recipe=recipe, sizes={"M": 8, "K": 4, "N": 2}, repeats=3,
                               spread=0.25, hardware=hardware.lookup(slug), **kw)


def test_record_fields():
    r = rec(value=3, emulated=True, profile="smoke", extra={"hlo_fp8_gemm": False})
    assert list(r) == results.RECORD_FIELDS
    assert r["experiment"] == "gemm" and r["claims"] == ["A2", "B2"]
    assert r["hardware"] == "h200" and r["hardware_name"] == "NVIDIA H200"
    assert r["compute_capability"] == "9.0" and r["backend"] == "gpu"
    assert isinstance(r["value"], float) and r["value"] == 3.0
    assert r["unit"] == "TFLOP/s" and r["repeats"] == 3 and r["spread"] == 0.25
    assert r["emulated"] is True and r["profile"] == "smoke"
    assert r["sizes"] == {"M": 8, "K": 4, "N": 2} and r["extra"] == {"hlo_fp8_gemm": False}
    for key in ("jax", "jaxlib", "flax", "git_commit"):
        assert isinstance(r[key], str) and r[key]
    assert dt.datetime.fromisoformat(r["timestamp"]).tzinfo is not None
    json.dumps(r)  # serialisable as is


def test_restamp_sets_hardware_and_run_note_only_when_given():
    r = rec()
    assert results.restamp([r]) == [r] and "run_note" not in r
    (out,) = results.restamp([r], hardware="My Test Box", note="GPU 1 of 2; beside it: lm")
    assert out["hardware"] == "my-test-box" and out["run_note"] == "GPU 1 of 2; beside it: lm"
    assert list(out) == results.RECORD_FIELDS + ["run_note"] and r["hardware"] == "h200"


def test_record_roots_follow_the_repository_root_and_the_scratch_folder(roots):
    assert results.record_root("full") == roots / "results"
    assert results.record_root("smoke") == roots / "scratch"
    results.use_scratch(None)
    assert results.record_root("smoke") == roots / "build" / "results"


def test_write_then_read_back(roots):
    path = results.write_records([rec(value=1.5)], "gemm", "8x4x2", root=roots / "results")
    assert path == roots / "results" / "h200" / "gemm" / "8x4x2.json"
    assert json.loads(path.read_text())[0]["value"] == 1.5


def test_write_is_atomic(roots, monkeypatch):
    root = roots / "results"
    path = results.write_records([rec(value=1.0)], "gemm", "cell", root=root)
    before = path.read_text()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(results.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        results.write_records([rec(value=2.0)], "gemm", "cell", root=root)
    assert path.read_text() == before  # the old cell is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["cell.json"]  # no temp file left


def test_write_refuses_nothing(roots):
    with pytest.raises(ValueError, match="no records"):
        results.write_records([], "gemm", "cell", root=roots)


def test_resumable_cells(roots):
    root = roots / "results"
    assert not results.have_cell("gemm", "8x4x2", hardware="h200", root=root)
    results.write_records([rec()], "gemm", "8x4x2", root=root)
    assert results.have_cell("gemm", "8x4x2", hardware="h200", root=root)
    assert not results.have_cell("gemm", "8x4x2", hardware="b200", root=root)
    assert not results.have_cell("gemm", "16x4x2", hardware="h200", root=root)
    assert not results.have_cell("mlp_step", "8x4x2", hardware="h200", root=root)


def test_load_across_hardware_and_roots(roots):
    results.write_records([rec("h200", 1.0), rec("h200", 2.0, recipe="fp8")], "gemm", "a",
                          root=roots / "results")
    results.write_records([rec("b200", 3.0)], "gemm", "a", root=roots / "results")
    results.write_records([rec("cpu", 0.1)], "gemm", "a", root=roots / "scratch")
    other = results.make_record("mlp_step", "ms", 1.0, "ms", hardware=hardware.lookup("h200"))
    results.write_records([other], "mlp_step", "a", root=roots / "results")

    df = evidence.load_records("gemm")  # default roots: results/ and the scratch folder
    assert sorted(df.hardware) == ["b200", "cpu", "h200", "h200"]
    assert set(df.experiment) == {"gemm"}
    assert {"source", "size_M", "size_K", "size_N"} <= set(df.columns)
    assert df.set_index("hardware").loc["b200", "value"] == 3.0
    assert all(str(roots) in s for s in df.source)
    assert len(evidence.load_records()) == 5  # every experiment
    assert len(evidence.load_records("gemm", roots=roots / "scratch")) == 1


def test_load_nothing_has_columns(roots):
    df = evidence.load_records("gemm")
    assert df.empty and {"experiment", "value", "source"} <= set(df.columns)


def test_known_defects_are_left_out_and_re_recorded(roots, monkeypatch):
    bad = [dict(rec(recipe="fp8"), git_commit="abc1234def"),
           dict(rec(recipe="fp8", extra={"variant": "x"}), git_commit="abc1234def")]
    ok = [dict(rec(recipe="fp8", extra={"variant": "y"}), git_commit="abc1234def"),
          dict(rec(recipe="fp8", extra={"variant": "x"}), git_commit="fff0000")]
    monkeypatch.setattr(results, "defects", lambda: (
        {"experiment": "gemm", "hardware": "h200", "commits": ["abc1234"],
         "where": {"extra.variant": ["x"], "recipe": ["fp8"]}, "reason": "a bug"},))
    root = roots / "results"
    results.write_records(bad[1:], "gemm", "bad", root=root)
    results.write_records(ok, "gemm", "ok", root=root)
    results.write_records(bad[:1] + bad[1:], "gemm", "mixed", root=root)
    df = evidence.load_records("gemm", roots=[root])
    assert len(df) == 3 and df["defect"].isna().all()  # "bad" and one of "mixed" left out
    full = evidence.load_records("gemm", roots=[root], keep_defective=True)
    assert len(full) == 5 and (full["defect"] == "a bug").sum() == 2
    assert not results.have_cell("gemm", "bad", "h200", root)   # all defective: record again
    assert results.have_cell("gemm", "ok", "h200", root)
    assert results.have_cell("gemm", "mixed", "h200", root)     # partly valid: keep


def test_shipped_defects_registry_is_well_formed():
    for d in results.defects():
        assert {"experiment", "hardware", "commits", "reason"} <= set(d)
        assert all(isinstance(c, str) and len(c) >= 7 for c in d["commits"])
        assert all(isinstance(v, list) for v in (d.get("where") or {}).values())


def test_same_commit_needs_one_known_commit_on_both_sides():
    assert results.same_commit("37e388c", "37e388c")
    assert not results.same_commit("37e388c", "42fbb3f")
    assert not results.same_commit("unknown", "unknown")  # no git, no REPRO_GIT_COMMIT
    assert not results.same_commit("", "")
    assert not results.same_commit("a,b", "a,b")  # a cell recorded over several commits
    assert not results.same_commit(None, None)


# ------------------------------------------------- files being written, and stray files


def test_a_cell_being_written_is_a_file_no_loader_reads(roots, monkeypatch):
    """While a cell is written, its temporary file sits beside the records: hidden and not
    ``*.json``, so no reader takes half a cell for records (and ``git add results/`` leaves
    it out: .gitignore)."""
    root = roots / "results"
    results.write_records([rec(value=1.0)], "gemm", "a", root=root)
    real_dump, seen = results.json.dump, {}

    def half_then_look(obj, f, **kw):
        f.write('[{"experiment": "gemm", ')  # half a cell, as a kill mid-write leaves it
        f.flush()
        seen["tmp"] = [p.name for p in (root / "h200" / "gemm").iterdir()]
        seen["loaded"] = len(evidence.load_records("gemm", roots=root))
        seen["stale"] = [c["cell"] for c in evidence.stale_cells(root)]
        seen["cell"] = results.read_cell("gemm", "b", "h200", root)
        raise KeyboardInterrupt  # the interrupt lands during the write

    monkeypatch.setattr(results.json, "dump", half_then_look)
    with pytest.raises(KeyboardInterrupt):
        results.write_records([rec(value=2.0)], "gemm", "b", root=root)
    monkeypatch.setattr(results.json, "dump", real_dump)
    (tmp,) = [n for n in seen["tmp"] if n != "a.json"]
    assert tmp.startswith(".") and not tmp.endswith(".json"), tmp
    assert seen["loaded"] == 1 and seen["stale"] == ["a"] and seen["cell"] is None
    assert sorted(p.name for p in (root / "h200" / "gemm").iterdir()) == ["a.json"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q",
                              f"results/h200/gemm/{tmp}"], cwd=ROOT)
    assert ignored.returncode == 0, f"git add results/ would commit {tmp}"


@pytest.mark.parametrize("stray", [".tmp-abc123.json", ".a.json.x1y2.tmp", "a.json~",
                                   "a.json.orig", ".DS_Store", "notes.txt"])
def test_loaders_skip_hidden_and_stray_files_and_name_them(roots, stray):
    """A complete copy of a cell under another name (what an old temporary file holds) would
    count every record twice: every loader reads only ``HW/EXPERIMENT/NAME.json`` and names
    any other file it finds in a records folder, with what to do."""
    root = roots / "results"
    path = results.write_records([rec(value=1.0), rec(value=2.0, recipe="fp8")], "gemm", "a",
                                 root=root)
    (path.parent / stray).write_bytes(path.read_bytes())
    (root / "h200" / "README.md").write_text("what these records are\n")  # documentation
    with pytest.warns(evidence.StrayFileWarning) as caught:
        df = evidence.load_records("gemm", roots=root)
    assert len(df) == 2 and set(df.source) == {str(path)}
    (w,) = caught
    assert str(w.message).startswith(f"{path.parent / stray}: not a record file")
    with pytest.warns(evidence.StrayFileWarning):  # (records without code fingerprints)
        assert [(c["cell"], c["records"]) for c in evidence.stale_cells(root)] == [("a", 2)]


def test_a_record_file_outside_an_experiment_folder_is_named(roots):
    root = roots / "results"
    path = results.write_records([rec(value=1.0)], "gemm", "a", root=root)
    (root / "h200" / "lost.json").write_bytes(path.read_bytes())
    (path.parent / "deeper").mkdir()
    (path.parent / "deeper" / "b.json").write_bytes(path.read_bytes())
    with pytest.warns(evidence.StrayFileWarning) as caught:
        assert len(evidence.load_records(roots=root)) == 1
    assert sorted(str(w.message).split(":")[0] for w in caught) == sorted(
        [str(root / "h200" / "lost.json"), str(path.parent / "deeper" / "b.json")])
