"""The study runner: resume, skip, force, selection, failures, time budget, Ctrl-C."""

import json
from pathlib import Path

import pytest

from repro import hardware, results
from repro.studies import runner
from repro.studies.runner import Cell, CellsFailed, Study

HW = "test-box"


def toy(names, calls, *, fail=(), interrupt=None, stop=None, recipes=None, groups=None,
        slow=None, clock=None, empty=()):
    """A study whose cells record their name; ``calls`` lists the cells run, in order."""
    def make(name):
        def run(budget):
            calls.append((name, budget))
            if name == interrupt:
                raise KeyboardInterrupt
            if name in fail:
                raise RuntimeError(f"{name} broke\nsecond line")
            if clock is not None and slow:
                clock[0] += slow.get(name, 0.0)
            if name == stop:
                return None
            if name in empty:
                return []
            return [results.make_record("toy", "value", 1.0, "1", recipe=(recipes or {}).get(
                name, (None,))[0], sizes={"cell": name}, hardware=hardware.lookup("cpu"))]
        return run

    def cells(params):
        return [Cell(n, make(n), tuple((recipes or {}).get(n, ())), (groups or {}).get(n))
                for n in names]

    return Study("toy", ("A1",), cells)


def stems(root: Path) -> list[str]:
    return sorted(p.stem for p in root.glob(f"{HW}/toy/*.json"))


def test_runs_writes_then_resumes_and_force_redoes(tmp_path):
    calls = []
    study = toy(["a", "b", "c"], calls)
    out = runner.run(study, {"profile": "smoke"}, tmp_path, hardware=HW, progress=False)
    assert [n for n, _ in calls] == ["a", "b", "c"] and stems(tmp_path) == ["a", "b", "c"]
    assert out.written == [tmp_path / HW / "toy" / f"{n}.json" for n in "abc"]
    rec = json.loads((tmp_path / HW / "toy" / "a.json").read_text())[0]
    assert rec["hardware"] == HW and "run_note" not in rec  # stamped with --hardware

    (tmp_path / HW / "toy" / "b.json").unlink()
    out = runner.run(study, {}, tmp_path, hardware=HW, progress=False)
    assert [n for n, _ in calls[3:]] == ["b"] and out.skipped == ["a", "c"]
    out = runner.run(study, {}, tmp_path, hardware=HW, force=True, note="beside: x",
                     progress=False)
    assert [n for n, _ in calls[4:]] == ["a", "b", "c"] and len(out.written) == 3
    assert json.loads((tmp_path / HW / "toy" / "c.json").read_text())[0]["run_note"] == \
        "beside: x"


def test_only_and_recipes_select_cells(tmp_path):
    calls = []
    recipes = {"w64_bf16": ("bf16",), "w64_fp8": ("fp8-delayed",), "w128_bf16": ("bf16",)}
    study = toy(["stores", *recipes], calls, recipes=recipes)
    runner.run(study, {}, tmp_path, hardware=HW, only=["w64_*"], progress=False)
    assert [n for n, _ in calls] == ["w64_bf16", "w64_fp8"]
    calls.clear()
    runner.run(study, {}, tmp_path, hardware=HW, recipes=["bf16"], force=True, progress=False)
    assert [n for n, _ in calls] == ["stores", "w64_bf16", "w128_bf16"]  # no recipe: kept
    with pytest.raises(ValueError, match=r"--only x\* selects no cell; cells: stores, w64_bf16"):
        runner.plan(study, {}, only=["x*"])
    with pytest.raises(ValueError, match="unknown recipe 'fp9'"):
        runner.plan(study, {}, recipes=["fp9"])


def test_recipe_does_not_apply_where_cells_time_every_recipe_together():
    with pytest.raises(ValueError, match="toy: --recipe does not apply"):
        runner.plan(toy(["a"], []), {}, recipes=["bf16"])


def test_narrow_replaces_cell_filtering():
    seen = []

    def cells(p):
        seen.append(p)
        return [Cell(f"a_{'-'.join(p['recipes'])}", lambda b: [])]

    study = Study("toy", (), cells, narrow=lambda p, rs: {**p, "recipes": rs})
    chosen, _ = runner.plan(study, {"recipes": ["x", "y"]}, recipes=["y"])
    assert [c.name for c in chosen] == ["a_y"] and seen == [{"recipes": ["y"]}]


def test_a_failing_cell_is_one_line_and_the_others_still_run(tmp_path, capsys):
    calls = []
    with pytest.raises(CellsFailed) as e:
        runner.run(toy(["a", "b", "c"], calls, fail={"b"}), {}, tmp_path, hardware=HW,
                   progress=False)
    assert stems(tmp_path) == ["a", "c"]
    assert e.value.failures == ["b (RuntimeError: b broke)"]
    assert "second line" not in str(e.value) and "\n" not in str(e.value)
    assert "cell b failed, going on" in capsys.readouterr().err


def test_ctrl_c_keeps_finished_cells_and_propagates(tmp_path):
    calls = []
    with pytest.raises(KeyboardInterrupt):
        runner.run(toy(["a", "b", "c"], calls, interrupt="b"), {}, tmp_path, hardware=HW,
                   progress=False)
    assert stems(tmp_path) == ["a"]
    calls.clear()
    runner.run(toy(["a", "b", "c"], calls), {}, tmp_path, hardware=HW, progress=False)
    assert [n for n, _ in calls] == ["b", "c"]  # the resumed run does not redo a


def test_time_budget_stops_before_the_next_cell_and_hands_cells_what_is_left(tmp_path,
                                                                             monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    calls = []
    study = toy(["a", "b", "c"], calls, slow={"a": 30.0, "b": 25.0}, clock=clock)
    out = runner.run(study, {}, tmp_path, hardware=HW, time_budget_s=50.0, progress=False)
    assert calls == [("a", 50.0), ("b", 20.0)]  # b started with 20 s left, c never started
    assert stems(tmp_path) == ["a", "b"] and out.stopped == "time budget spent before c"


def test_a_cell_that_stops_at_a_checkpoint_ends_the_run_and_writes_nothing(tmp_path):
    calls = []
    out = runner.run(toy(["a", "b", "c"], calls, stop="b"), {}, tmp_path, hardware=HW,
                     progress=False)
    assert [n for n, _ in calls] == ["a", "b"] and stems(tmp_path) == ["a"]
    assert "b stopped early" in out.stopped


def test_empty_cells_are_not_written(tmp_path):
    out = runner.run(toy(["a", "b"], [], empty={"a"}), {}, tmp_path, hardware=HW,
                     progress=False)
    assert out.empty == ["a"] and stems(tmp_path) == ["b"]


def test_restart_runs_before_a_forced_cell_only():
    restarted = []
    study = Study("toy", (), lambda p: [Cell("a", lambda b: [],
                                             restart=lambda: restarted.append(1))])
    runner.run(study, {}, Path("/nonexistent"), hardware=HW, progress=False)
    assert restarted == []
    runner.run(study, {}, Path("/nonexistent"), hardware=HW, force=True, progress=False)
    assert restarted == [1]


def test_cross_call_note_names_cells_of_the_group_recorded_earlier(tmp_path, capsys):
    groups = {"cnn_bf16": "cnn", "cnn_fp16": "cnn", "cnn_fp8": "cnn", "mlp_bf16": "mlp",
              "mlp_fp8": "mlp"}
    study = toy(list(groups), [], groups=groups)
    runner.run(study, {}, tmp_path, hardware=HW, only=["cnn_bf16", "cnn_fp16", "mlp_fp8"],
               progress=False)
    capsys.readouterr()
    runner.run(study, {}, tmp_path, hardware=HW, only=["cnn_fp8"], progress=False)
    err = capsys.readouterr().err
    assert "cnn_fp8 will be compared with cnn_bf16, cnn_fp16" in err and "mlp" not in err
    # both sides timed in this call (--force): no note; a group with nothing recorded: none
    runner.run(study, {}, tmp_path, hardware=HW, only=["cnn_*"], force=True, progress=False)
    runner.run(study, {}, tmp_path / "fresh", hardware=HW, only=["mlp_*"], progress=False)
    assert "compared with" not in capsys.readouterr().err


@pytest.mark.parametrize("names, says", [
    (["a", "b", "a"], "cell a is listed twice"),
    (["x/y", "x_y"], "cells x/y and x_y would write one file, x_y.json"),
])
def test_two_cells_that_would_write_one_file_are_refused_before_running(tmp_path, names,
                                                                        says):
    """A value given twice in params.yaml (a seed, a recipe, a size) makes two cells of one
    name: the second would overwrite the first, or be skipped as already recorded."""
    calls = []
    with pytest.raises(ValueError) as e:
        runner.run(toy(names, calls), None, tmp_path, hardware=HW, progress=False)
    assert str(e.value).startswith(f"toy: {says}"), str(e.value)
    assert calls == [] and not tmp_path.joinpath(HW).exists()


def test_a_shape_given_twice_in_params_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from repro import cli

    (tmp_path / "params.yaml").write_text(
        "profile: smoke\ngemm:\n  common: {dtypes: [bf16], repeats: 1, input_sets: 1}\n"
        "  smoke: {shapes: [[32, 16, 16], [32, 16, 16]], error_shape: [16, 16, 16]}\n"
        "  full: {shapes: [[64, 64, 64]]}\n")
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    assert cli.main(["record", "gemm", "--hardware", "test-box"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["repro: error: gemm: cell 32x16x16 is listed twice: a value given twice in "
                   "params.yaml? (each cell is one file: results/HW/gemm/CELL.json)"]
    assert not (tmp_path / "build").exists()


def test_a_cell_whose_program_files_changed_during_the_run_is_not_written():
    """A run loads its code once; a file its programs ran that changes on disk before a cell is
    stamped would make the records name code that did not run: the run stops there."""
    from repro.studies import runner as R

    snap = R.source_snapshot()
    assert "repro/studies/runner.py" in snap and all(len(h) == 16 for h in snap.values())
    cell = R.Cell("c1", lambda _b: [])
    same = [{"program": {"files": {"repro/studies/runner.py": snap["repro/studies/runner.py"],
                                   "params.yaml#toy@full": "x"}}}]
    R._unchanged_since(snap, same, cell)  # the code the run began with: written
    R._unchanged_since(None, same, cell)
    edited = [{"program": {"files": {"repro/studies/runner.py": "0" * 16}}}]
    with pytest.raises(R.CheckoutChanged, match="c1: repro/studies/runner.py changed on disk"):
        R._unchanged_since(snap, edited, cell)
