"""Records check themselves: a record's ``value`` is the statistic its experiment computes from
the samples it holds, its ``git_commit`` is a commit of the history (where the history is
here), its ``timestamp`` is not before that commit nor in the future. A record that fails is
defective: named by every reader and by `repro status`, and left out of every analysis.
The committed records pass; a planted edit of one is caught."""

import copy
import datetime as dt
import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from repro import catalogue, checkout, cli, evidence, record_checks, results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


@functools.cache
def _committed() -> tuple[tuple[Path, int, dict], ...]:
    return tuple((path, i, rec) for path in evidence.record_files(RESULTS)
                 for i, rec in enumerate(results.read_cell_file(path, RESULTS)))


def committed() -> tuple[tuple[Path, int, dict], ...]:
    """Every committed record, read once (a test that edits one copies it first)."""
    return _committed()


def numeric_lists(rec: dict) -> list[str]:
    return sorted(k for k, v in (rec.get("extra") or {}).items() if isinstance(v, list) and v
                  and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v))


def a_record_with(metric: str) -> tuple[Path, dict]:
    path = next(p for p in sorted((RESULTS / "h200" / "mlp_step").glob("*.json"))
                if any(r["metric"] == metric for r in json.loads(p.read_text())))
    return path, next(r for r in json.loads(path.read_text()) if r["metric"] == metric)


# ------------------------------------------------------------------ the committed records


def test_every_committed_record_checks_itself():
    """The check CI runs on every committed record: its value against its samples, its commit
    against the history, its timestamp against both ends. Fails when it checks nothing."""
    history = checkout.history(RESULTS)
    assert history is not None, ("this test needs the git history of the checkout (a clone "
                                 "without --depth): commits are checked against it")
    outcomes, failed = {"checked": 0}, []
    recs = committed()
    assert len(recs) > 3000
    for path, i, rec in recs:
        if results.defect_of(rec):
            continue
        status, _ = record_checks.check_value(rec)
        outcomes[status] = outcomes.get(status, 0) + 1
        if problem := record_checks.verify(rec, history):
            failed.append(f"{path.relative_to(ROOT)}: record {i}: {problem}")
    assert not failed, "\n".join(failed[:20])
    # values recomputed from samples: every timed experiment's records (379 when written)
    assert outcomes["checked"] >= 350 and "mismatch" not in outcomes, outcomes
    found = sum(all(history.time_of(c.strip().removesuffix("-dirty")) is not None
                    for c in str(rec["git_commit"]).split(",")) for _, _, rec in recs)
    assert found == len(recs), "every committed record names a commit of the history"


def test_every_record_holding_lists_of_numbers_says_how_its_value_follows_from_them():
    """A metric whose records hold samples (or any list of numbers) has a rule in its
    experiment's spec: a Statistic, or a sentence saying why its value is not one of them. A
    new metric cannot silently go unchecked."""
    missing = set()
    for path, _, rec in committed():
        if numeric_lists(rec) and rec["metric"] not in catalogue.get(
                rec["experiment"]).statistics:
            missing.add((rec["experiment"], rec["metric"], tuple(numeric_lists(rec))))
    assert not missing, sorted(missing)


@pytest.mark.parametrize("metric, outcome", [("step_time_ms", "checked"),
                                             ("tflops", "checked"),
                                             ("step_memory_bytes", "not derived")])
def test_each_outcome_says_what_it_is(metric, outcome):
    _, rec = a_record_with(metric)
    status, detail = record_checks.check_value(rec)
    assert status == outcome, detail
    if outcome == "not derived":
        assert "memory analysis" in detail


# ------------------------------------------------------------------- a planted edit


@pytest.mark.parametrize("metric, factor", [("step_time_ms", 2.0), ("tflops", 2.0),
                                            ("step_time_ms", 1.001), ("tflops", 0.999)])
def test_an_edited_value_is_caught(metric, factor):
    _, rec = a_record_with(metric)
    rec = copy.deepcopy(rec)
    rec["value"] *= factor
    status, detail = record_checks.check_value(rec)
    assert status == "mismatch", detail
    problem = record_checks.verify(rec, None)
    assert problem.startswith(f"value {rec['value']!r} is not ") and "extra.samples_ms" in problem


@pytest.mark.parametrize("experiment, metric", [
    ("inference", "decode_tokens_per_s"), ("legged", "loop_ms_per_update"),
    ("rl_throughput", "env_steps_per_s"), ("multigpu", "tokens_per_s"),
    ("rl_purejaxrl", "env_steps_per_s"), ("lm_step", "tokens_per_s")])
def test_a_doubled_value_is_caught_in_every_timed_experiment(experiment, metric):
    rec = copy.deepcopy(next(r for _, _, r in committed()
                             if r["experiment"] == experiment and r["metric"] == metric))
    assert record_checks.check_value(rec)[0] == "checked"
    assert record_checks.check_value(dict(rec, value=2 * rec["value"]))[0] == "mismatch"


@pytest.fixture
def tampered(tmp_path, monkeypatch):
    """A checkout holding two committed mlp_step cells, one record of one of them doubled."""
    (tmp_path / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    monkeypatch.delenv("REPRO_VERDICTS", raising=False)
    cells = sorted((RESULTS / "h200" / "mlp_step").glob("*.json"))[:2]
    folder = tmp_path / "results" / "h200" / "mlp_step"
    folder.mkdir(parents=True)
    for cell in cells:
        shutil.copy(cell, folder / cell.name)
    path = folder / cells[0].name
    recs = json.loads(path.read_text())
    i = next(i for i, r in enumerate(recs) if r["metric"] == "step_time_ms")
    recs[i]["value"] *= 2
    path.write_text(json.dumps(recs, indent=1))
    return path, i, len(recs) + len(json.loads(cells[1].read_text()))


def test_a_doubled_value_is_named_by_every_reader_and_left_out(tampered, capsys):
    path, i, total = tampered
    with pytest.warns(record_checks.DefectiveRecordWarning) as caught:
        df = evidence.load_records("mlp_step", roots=path.parent.parent.parent,
                                  keep_defective=True)
    assert len(df) == total - 1  # left out, even of the records kept with known defects
    (w,) = caught
    assert str(w.message).startswith(f"{path}: record {i} (step_time_ms, ")
    assert "is not the median of extra.samples_ms" in str(w.message)
    assert not results.have_cell("mlp_step", path.stem, "h200", path.parent.parent.parent)

    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 defective record(s) under results, left out of every verdict")
    assert f"results/h200/mlp_step/{path.name}: record {i} (step_time_ms, " in out
    assert cli.main(["status", "--json"]) == 0
    (group,) = [g for g in json.loads(capsys.readouterr().out) if g["defective"]]
    assert (group["experiment"], group["hardware"]) == ("mlp_step", "h200")
    assert [(d["cell"], d["record"]) for d in group["defective"]] == [(path.stem, i)]


def test_a_doubled_value_is_refused_at_write(tmp_path):
    _, rec = a_record_with("step_time_ms")
    with pytest.raises(record_checks.RecordError, match="is not the median of extra.samples_ms"):
        results.write_records([dict(rec, value=2 * rec["value"])], "mlp_step", "x",
                              root=tmp_path)
    assert not any(tmp_path.rglob("*.json"))


# --------------------------------------------------------------------- commits and times


def git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A repository of two commits, made on 2026-01-01 and 2026-02-01."""
    root = tmp_path_factory.mktemp("history")
    git(root, "init", "-q")
    (root / "results").mkdir()
    for n, date in ((1, "2026-01-01T12:00:00+00:00"), (2, "2026-02-01T12:00:00+00:00")):
        (root / "f").write_text(str(n))
        git(root, "add", "f")
        git(root, "commit", "-q", "-m", str(n), date=date)
    return root


def stamped(commit: str, when: str) -> dict:
    _, rec = a_record_with("step_time_ms")
    return dict(rec, git_commit=commit, timestamp=when)


def test_commits_and_times_are_checked_against_the_history(repo):
    first, head = git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")
    history = checkout.history(repo / "results")
    assert history is not None
    ok = [stamped(first, "2026-01-05T00:00:00+00:00"), stamped(head[:7], "2026-03-01T00:00:00Z"),
          stamped(head[:12] + "-dirty", "2026-02-01T12:05:00+00:00")]
    for rec in ok:
        assert record_checks.verify(rec, history) is None, rec["git_commit"]
    bad = {
        "zzz": (stamped("zzz", "2026-03-01T00:00:00+00:00"),
                "git_commit 'zzz' is not a commit of the history"),
        "unknown": (stamped("0" * 40, "2026-03-01T00:00:00+00:00"),
                    f"git_commit '{'0' * 40}' is not a commit of the history"),
        "before": (stamped(head, "2023-03-01T00:00:00+00:00"),
                   f"timestamp 2023-03-01T00:00:00+00:00 is before its commit {head[:12]} "
                   "(2026-02-01T12:00:00+00:00)"),
        "future": (stamped(head, "2099-01-01T00:00:00+00:00"),
                   "timestamp 2099-01-01T00:00:00+00:00 is in the future"),
        "garbage": (stamped(head, "yesterday"), "timestamp 'yesterday' is not a date"),
    }
    for name, (rec, says) in bad.items():
        assert record_checks.verify(rec, history) == says, name


def test_without_history_only_what_needs_none_is_checked(repo, tmp_path):
    """A shallow clone, or a copy without .git (the GPU machine's), cannot tell a commit is
    missing: commits go unchecked there; the future and the value still are."""
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)],
                   check=True, capture_output=True)
    for root in (shallow, tmp_path / "no-git"):
        (root / "results").mkdir(parents=True, exist_ok=True)
        history = checkout.history(root / "results")
        assert history is None
        assert record_checks.verify(stamped("abc1234", "2020-01-01T00:00:00+00:00"), history) is None
        assert "in the future" in record_checks.verify(stamped("abc1234", "2099-01-01T00:00:00Z"),
                                                 history)


@pytest.mark.parametrize("value, says", [
    ("zzz", "REPRO_GIT_COMMIT=zzz: not a commit (7 to 40 hex digits, optionally -dirty)"),
    ("0" * 40, f"REPRO_GIT_COMMIT={'0' * 40}: not a commit of the history of {ROOT}"),
])
def test_a_wrong_repro_git_commit_is_refused_before_recording(monkeypatch, capsys, value,
                                                              says):
    monkeypatch.setenv("REPRO_GIT_COMMIT", value)
    checkout.git_commit.cache_clear()
    try:
        with pytest.raises(ValueError) as e:
            checkout.git_commit()
        assert str(e.value) == says
        assert cli.main(["record", "gemm", "--profile", "smoke", "--hardware", "x"]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"repro: error: {says}"]
        monkeypatch.setenv("REPRO_GIT_COMMIT", git(ROOT, "rev-parse", "HEAD~1"))
        checkout.git_commit.cache_clear()
        assert checkout.git_commit() == git(ROOT, "rev-parse", "HEAD~1")
    finally:
        monkeypatch.undo()
        checkout.git_commit.cache_clear()


def test_a_record_from_another_day_is_not_in_the_future():
    now = dt.datetime.now(dt.timezone.utc)
    assert record_checks.verify(stamped("abc1234", now.isoformat(timespec="seconds")), None) is None
