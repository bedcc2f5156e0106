"""Refreshing stale cells within a budget (repro.refresh, `repro record --stale`): the plan's
order and costs from the records' own times, and a run that records exactly the stale cells."""

import json
import sys
import types

import pytest

from repro import cli, config, refresh, results


def _rec(cell, ts, **extra):
    r = results.make_record("toy", "answer", 1.0, "1", sizes={"cell": cell})
    r.update(timestamp=ts, git_commit="abc1234", hardware="fake-gpu-x", extra=extra)
    return r


def test_estimates_come_from_the_gaps_between_cells_of_one_run_or_their_own_fields(tmp_path):
    folder = tmp_path / "results" / "h" / "toy"
    folder.mkdir(parents=True)
    paths = []
    for name, ts, extra in [("a", "2026-01-01T00:00:00+00:00", {"compile_s": 7.0}),
                            ("b", "2026-01-01T00:01:30+00:00", {}),
                            ("c", "2026-01-01T05:00:00+00:00", {"cell_s": 42.0,
                                                                 "compile_s": 900.0}),
                            ("d", "2026-01-01T05:00:10+00:00", {}),
                            ("e", "2026-01-02T00:00:00+00:00",
                             {"compile_e2e_s": 20.0, "compile_update_s": 5.0,
                              "samples_s": [1.0, 2.0], "samples_ms": [500.0, 500.0],
                              "time_s": 999.0})]:
        (folder / f"{name}.json").write_text(json.dumps([_rec(name, ts, **extra)]))
        paths.append(folder / f"{name}.json")
    est = refresh.estimates(paths)
    assert est[str(paths[0])] == 7.0  # the first cell of a run: its own compile time
    assert est[str(paths[1])] == 90.0  # 90 s after the cell before it
    assert est[str(paths[2])] == 42.0  # five hours later: another run; the runner's cell_s
    assert est[str(paths[3])] == 10.0
    # a run's first cell without cell_s: at least its compiles and its timed samples (a
    # timed loop's time_s is not the cell's wall time)
    assert est[str(paths[4])] == 20.0 + 5.0 + 3.0 + 1.0


def test_the_plan_puts_cells_behind_a_verdict_first_and_filters_by_claim():
    cells = [{"folder": "gemm", "hardware": "h", "cell": "x", "path": "/nonexistent/x.json",
              "claims": []},
             {"folder": "legged", "hardware": "h", "cell": "y", "path": "/nonexistent/y.json",
              "claims": ["A11"]},
             {"folder": "inference", "hardware": "h", "cell": "z", "path": "/n/z.json",
              "claims": ["B6"]},
             {"folder": "inference", "hardware": "other", "cell": "w", "path": "/n/w.json",
              "claims": ["B6"]}]
    steps = refresh.plan(cells, hardware="h")
    assert [c["cell"] for c in steps] == ["z", "y", "x"]  # verdict cells, study order, figures
    assert all(c["estimate_s"] == refresh.UNKNOWN_S for c in steps)
    assert sorted(c["cell"] for c in refresh.plan(cells, claims=["B6"])) == ["w", "z"]
    assert "total: 3 cell(s)" in refresh.describe(steps)[-1]


PARAMS = "profile: smoke\ntoy: {smoke: {}, full: {}}\n"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    from repro import studies
    from repro.studies.runner import Cell, Study

    (tmp_path / "params.yaml").write_text(PARAMS)
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    calls = []
    mod = types.ModuleType("repro_refresh_toy")

    def cell(name):
        def run(_budget):
            calls.append(name)
            return [results.make_record("toy", "answer", 1.0, "1", sizes={"cell": name},
                                        claims=["A2"])]
        return run

    mod.STUDY = Study("toy", ("A2",), lambda p: [Cell(n, cell(n)) for n in "abc"])
    monkeypatch.setitem(sys.modules, "repro_refresh_toy", mod)
    monkeypatch.setattr(studies, "EXPERIMENTS", {"toy": "repro_refresh_toy"})
    monkeypatch.setattr(config, "TOP_LEVEL", (*config.TOP_LEVEL, "toy"))
    return types.SimpleNamespace(root=tmp_path, calls=calls)


@pytest.mark.slow  # an end-to-end record of stale cells
def test_record_stale_records_exactly_the_stale_cells(repo, capsys):
    args = ["record", "toy", "--profile", "full", "--yes", "--hardware", "fake-gpu-x"]
    assert cli.main(args) == 0
    assert repo.calls == ["a", "b", "c"]
    # cell b's record was made before fingerprints: stale
    path = repo.root / "results" / "fake-gpu-x" / "toy" / "b.json"
    recs = json.loads(path.read_text())
    recs[0]["code"] = None
    path.write_text(json.dumps(recs))
    capsys.readouterr()
    assert cli.main(["record", "--stale", "--plan", "--profile", "full", "--yes",
                     "--hardware", "fake-gpu-x"]) == 0
    err = capsys.readouterr().err
    assert "toy on fake-gpu-x: 1 cell(s)" in err and "(A2)" in err
    assert repo.calls == ["a", "b", "c"]  # --plan runs nothing
    assert cli.main(["record", "--stale", "--profile", "full", "--yes",
                     "--hardware", "fake-gpu-x"]) == 0
    assert repo.calls == ["a", "b", "c", "b"]
    assert cli.main(["record", "--stale", "--profile", "full", "--yes",
                     "--hardware", "fake-gpu-x"]) == 0
    assert "no stale cells" in capsys.readouterr().out and repo.calls[-1] == "b"


def test_record_stale_refuses_cell_selections(repo, capsys):
    assert cli.main(["record", "--stale", "--only", "a", "--profile", "full"]) == 2
    assert "--stale chooses the cells itself" in capsys.readouterr().err
