"""Run conditions: what nvidia-smi saw beside a cell, stamped on its records and reported.

A fake ``nvidia-smi`` (a shell script first on PATH) prints the tables a test gives it, and
only for the queries :mod:`repro.provenance` is meant to ask.
"""

import json
import os

import pandas as pd
import pytest

from repro import conditions, evidence, hardware, record_checks, results
from repro.claims import staleness
from repro.studies import runner
from repro.studies.runner import Cell, Study

HW = "test-box"
GPU_ARGS = ("--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,name "
            "--format=csv,noheader,nounits")
APPS_ARGS = "--query-compute-apps=gpu_uuid,pid,used_memory,process_name " \
    "--format=csv,noheader,nounits"
# Two GPUs; GPU 1's utilization is not reported, as on some boards.
GPUS = "0, GPU-aaaa-0000, 1200, 143771, 5, NVIDIA H200\n" \
    "1, GPU-bbbb-1111, 3, 143771, [N/A], NVIDIA H200\n"


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """``smi(apps, gpus=GPUS, body=None)``: a fake nvidia-smi first on PATH printing ``gpus``
    and ``apps`` (CSV) for the two queries, failing on any other; ``body``: a script of its
    own instead. Returns the file ``apps`` is read from (a cell may rewrite it)."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def make(apps="", gpus=GPUS, body=None):
        (tmp_path / "gpus.csv").write_text(gpus)
        (tmp_path / "apps.csv").write_text(apps)
        script = folder / "nvidia-smi"
        script.write_text("#!/bin/sh\n" + (body or (
            f'case "$*" in\n'
            f'  "{GPU_ARGS}") cat "{tmp_path}/gpus.csv" ;;\n'
            f'  "{APPS_ARGS}") cat "{tmp_path}/apps.csv" ;;\n'
            f'  *) echo "unexpected arguments: $*" >&2; exit 2 ;;\n'
            f'esac\n')))
        script.chmod(0o755)
        return tmp_path / "apps.csv"

    return make


def test_alone_when_no_other_process(smi):
    smi("")
    c = conditions.run_conditions()
    assert c == {"checked": "nvidia-smi", "others": [], "alone": True, "gpus": [
        {"index": 0, "uuid": "GPU-aaaa-0000", "name": "NVIDIA H200", "memory_used_mib": 1200,
         "memory_total_mib": 143771, "utilization_pct": 5},
        {"index": 1, "uuid": "GPU-bbbb-1111", "name": "NVIDIA H200", "memory_used_mib": 3,
         "memory_total_mib": 143771, "utilization_pct": None}]}
    json.dumps(c)


def test_another_process_on_our_gpu_is_listed(smi):
    smi("GPU-aaaa-0000, 4242, 900, /usr/bin/python3, train.py\n"
        "GPU-bbbb-1111, 777, [N/A], other\n")
    c = conditions.run_conditions()
    assert c["checked"] == "nvidia-smi" and c["alone"] is False
    assert c["others"] == [{"pid": 4242, "name": "/usr/bin/python3, train.py", "used_mib": 900,
                            "gpu": 0}, {"pid": 777, "name": "other", "used_mib": None, "gpu": 1}]


@pytest.mark.parametrize("visible", ["1", "GPU-bbbb-1111", "GPU-bbbb"])
def test_a_process_on_a_gpu_not_ours_is_ignored(smi, monkeypatch, visible):
    smi("GPU-aaaa-0000, 4242, 900, python\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    c = conditions.run_conditions()
    assert c["alone"] is True and c["others"] == []
    assert [g["index"] for g in c["gpus"]] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert conditions.run_conditions()["alone"] is False


def test_this_process_is_not_another(smi):
    smi(f"GPU-aaaa-0000, {os.getpid()}, 70000, python\n")
    assert conditions.run_conditions()["alone"] is True


HANG = "exec sleep 30\n"


@pytest.mark.parametrize("case,body,apps,visible,why", [
    ("missing", None, "", None, "no nvidia-smi on PATH"),
    ("exit", 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA '
             'driver"\nexit 9\n', "", None, "exited with 9: NVIDIA-SMI has failed"),
    ("hang", HANG, "", None, "took longer than 0.3 s"),
    ("garbage", "echo 'Welcome'\necho 'to the GPU'\n", "", None, "not 6 fields"),
    ("bad pid", None, "GPU-aaaa-0000, lots, 1, python\n", None, "'lots' for a pid"),
    ("no gpu of ours", None, "", "7", "none of the GPUs nvidia-smi lists is this process's "
                                      "(CUDA_VISIBLE_DEVICES=7)"),
])
def test_unchecked_is_none_never_alone(smi, tmp_path, monkeypatch, case, body, apps,
                                       visible, why):
    smi(apps, body=body)
    if case == "missing":
        monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    c = conditions.run_conditions(timeout_s=0.3)
    assert c["checked"] is None and c["alone"] is None and set(c) == {"checked", "why", "alone"}
    assert why in c["why"] and "\n" not in c["why"]


@pytest.mark.parametrize("before,after,alone", [
    (True, True, True), (True, False, False), (False, None, False), (None, True, None),
    (None, None, None)])
def test_merged_conditions_are_alone_only_when_both_looks_were(before, after, alone):
    a, b = {"alone": before, "others": []}, {"alone": after, "others": []}
    assert conditions.merge_conditions(a, b) == {"alone": alone, "before": a, "after": b}


# ------------------------------------------------------------------------------ the runner


def toy(names, on_run=None):
    """A study whose cells record one throughput; ``on_run(name)`` runs inside each cell."""
    def make(name):
        def run(budget):
            if on_run:
                on_run(name)
            return [results.make_record("toy", "steps_per_s", 10.0, "steps/s",
                                        sizes={"cell": name}, hardware=hardware.lookup("cpu"))]
        return run

    return Study("toy", ("A1",), lambda params: [Cell(n, make(n)) for n in names])


def written(root, cell):
    return json.loads((root / HW / "toy" / f"{cell}.json").read_text())


def test_the_runner_stamps_conditions_and_a_process_after_the_run_counts(smi, tmp_path):
    apps = smi("")

    def start_another(name):  # cell b starts a process that is still there after it
        if name == "b":
            apps.write_text("GPU-bbbb-1111, 5151, 2048, pytorch-job\n")

    root = tmp_path / "results"
    runner.run(toy(["a", "b"], start_another), {}, root, hardware=HW, progress=False)
    a, b = written(root, "a")[0]["conditions"], written(root, "b")[0]["conditions"]
    assert a["alone"] is True and a["before"]["checked"] == a["after"]["checked"] == "nvidia-smi"
    assert b["alone"] is False and b["before"]["alone"] is True
    assert b["after"]["others"] == [{"pid": 5151, "name": "pytorch-job", "used_mib": 2048,
                                     "gpu": 1}]
    assert record_checks.check_record(written(root, "b")[0]) is None


def test_without_nvidia_smi_the_runner_stamps_unchecked(smi, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    root = tmp_path / "results"
    runner.run(toy(["a"]), {}, root, hardware=HW, progress=False)
    c = written(root, "a")[0]["conditions"]
    assert c["alone"] is None and c["before"]["why"] == "no nvidia-smi on PATH"


@pytest.mark.parametrize("conditions,problem", [
    ([], "conditions must be an object, got list"),
    ({"before": {}}, "conditions.alone must be true, false or null, got 'nothing'"),
    ({"alone": "yes"}, "conditions.alone must be true, false or null, got 'yes'"),
    ({"alone": 1}, "conditions.alone must be true, false or null, got 1"),
])
def test_malformed_conditions_are_refused_naming_the_file(tmp_path, conditions, problem):
    rec = {**results.make_record("toy", "steps_per_s", 10.0, "steps/s",
                                 hardware=hardware.lookup("cpu")), "hardware": HW}
    assert record_checks.check_record({**rec, "conditions": {"alone": None}}) is None
    assert record_checks.check_record(rec) is None  # records made before conditions: as they were
    bad = {**rec, "conditions": conditions}
    with pytest.raises(record_checks.RecordError, match=f"toy/c: record 0 .*: {problem}; nothing"):
        results.write_records([bad], "toy", "c", root=tmp_path)
    path = tmp_path / HW / "toy" / "c.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([bad]))
    with pytest.raises(record_checks.RecordError) as e:
        evidence.load_records("toy", roots=tmp_path)
    assert str(e.value).startswith(f"{path}: record 0") and problem in str(e.value)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------- reporting


def rows(conditions=(), metric="steps_per_s", experiment="rl_throughput"):
    """Loaded records of ``experiment``, one cell each, with the given ``conditions`` (none:
    records made before conditions existed)."""
    out = []
    for i, c in enumerate(conditions or [None]):
        r = {"experiment": experiment, "claims": ["A2"], "hardware": "h200",
             "hardware_name": "NVIDIA H200", "profile": "full", "metric": metric,
             "value": 10.0, "unit": "steps/s", "source": f"c{i}.json", "git_commit": "abc1234",
             "stale": False, "stale_reason": None, "stale_since": None, "stale_summary": None}
        if c is not None:
            r["conditions"] = c
        out.append(r)
    return pd.DataFrame(out)


SHARED = {"alone": False, "before": {"checked": "nvidia-smi", "others": [], "alone": True},
          "after": {"checked": "nvidia-smi", "alone": False,
                    "others": [{"pid": 5151, "name": "pytorch-job", "used_mib": 2048,
                                "gpu": 0}]}}
ALONE = {"alone": True, "before": {"alone": True}, "after": {"alone": True}}
UNCHECKED = {"alone": None, "before": {"checked": None, "why": "no nvidia-smi on PATH",
                                       "alone": None}, "after": {"alone": None}}
def line(of: int) -> str:
    return f"1 of {of} rl_throughput speed record(s) ran beside another job (pytorch-job)"


def test_a_verdict_names_speed_records_made_beside_another_process():
    from repro.claims.verdicts import Verdict

    v = Verdict("A2", "partly", "1.5x", "h200", "results/*/rl_throughput")
    assert staleness.mark(v, beside_rows=rows()) is v  # no conditions: nothing said
    assert staleness.mark(v, beside_rows=rows([ALONE, UNCHECKED])) is v
    assert staleness.mark(v, beside_rows=rows([SHARED], metric="final_return")) is v  # quality
    marked = staleness.mark(v, beside_rows=rows([SHARED, ALONE, UNCHECKED]))
    assert marked.stale_note == line(3) and marked.stale is False


def test_the_ledger_says_it_and_says_nothing_for_records_without_conditions(
        tmp_path, monkeypatch):
    from repro import notebook
    from repro.claims import ledger
    from repro.claims.verdicts import Verdict

    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path / "verdicts"))
    monkeypatch.setenv("REPRO_STAGING", str(tmp_path / "staged"))
    verdict = Verdict("A2", "partly", "1.5x", "h200", "results/*/rl_throughput")
    files = {}
    for name, seen in (("old", ()), ("shared", [SHARED, ALONE])):
        monkeypatch.setattr(evidence, "load_records", lambda *a, **k: rows(seen))
        nb = notebook.Notebook("03_x", "full", {}, None, tmp_path)
        assert len(nb.records("rl_throughput")) == len(seen or [None])
        md = nb.conclusion(verdict).data
        files[name] = (tmp_path / "verdicts" / "A2.json").read_text()
        if name == "old":
            assert files["old"] == json.dumps(verdict.to_dict(), indent=1) + "\n"
            assert "beside" not in md and "beside" not in ledger.markdown_table()
    assert json.loads(files["shared"])["stale_note"] == line(2)
    assert f"*Note: {line(2)}.*" in md
    table = ledger.markdown_table()
    assert f"A2: {line(2)}" in table and "**partly** [^03]" in table


# ------------------------------------------------------------- run notes read as conditions

@pytest.mark.parametrize("note,conditions", [
    ("alone on the GPU", {"alone": True, "from": "run_note"}),
    ("alone on the chip", {"alone": True, "from": "run_note"}),
    ("alone on the TPU (one program holds the chip)", {"alone": True, "from": "run_note"}),
    ("GPU 1 of 2; beside it on GPU 0: repro.lm.experiments full --sizes 20m --seeds 2 "
     "repro.lm.experiments full --sizes 120m --seeds 0",
     {"alone": False, "from": "run_note", "gpu": 1, "gpus": 2,
      "beside": [{"gpu": 0, "job": "repro.lm.experiments full --sizes 20m --seeds 2"},
                 {"gpu": 0, "job": "repro.lm.experiments full --sizes 120m --seeds 0"}]}),
    ("GPU 0 of 2; beside it on GPU 1: repro.rl.experiments quality --only Asterix-MinAtar_*",
     {"alone": False, "from": "run_note", "gpu": 0, "gpus": 2,
      "beside": [{"gpu": 1, "job": "repro.rl.experiments quality --only Asterix-MinAtar_*"}]}),
    ("GPU 2 of 2; beside it on GPU 0: x", None),  # no GPU 2 of 2
    ("GPU 1 of 2; beside it on GPU 1: x", None),  # not beside itself
    ("alone on the GPU, mostly", None), ("beside a job", None), ("", None), (None, None),
    (3, None)])
def test_a_run_note_reads_as_conditions(note, conditions):
    assert staleness.conditions_of_note(note) == conditions


def test_the_committed_records_carry_their_notes_as_conditions(capsys):
    """Every committed record whose note reads carries it as conditions (the note kept), at
    least 3000 of them; measured conditions are never overwritten; nothing else changed
    (scripts/parse_run_notes.py --check: nothing left to add)."""
    import importlib.util

    from repro.results import repo_root

    parsed = measured = 0
    for path in sorted((repo_root() / "results").glob("*/*/*.json")):
        data = json.loads(path.read_text())
        for rec in data if isinstance(data, list) else [data]:
            c = rec.get("conditions")
            if c is not None and c.get("from") == "run_note":
                assert c == staleness.conditions_of_note(rec["run_note"]), path
                parsed += 1
            elif c is not None:
                measured += 1
            else:
                assert staleness.conditions_of_note(rec.get("run_note")) is None, path
    assert parsed >= 3000 and measured >= 1
    spec = importlib.util.spec_from_file_location(
        "parse_run_notes", repo_root() / "scripts" / "parse_run_notes.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 0
    assert "would give 0 record(s)" in capsys.readouterr().out


def test_a_rule_that_requires_alone_leaves_the_others_out():
    both = rows([SHARED, ALONE, UNCHECKED])
    kept, left = staleness.split(both)
    assert len(kept) == 3 and not len(left)
    kept, left = staleness.split(both, alone=True)
    assert len(kept) == 2 and list(left["source"]) == ["c0.json"]
    assert "ran beside another job" in left["stale_summary"].iloc[0]
    quality = rows([SHARED], metric="final_return")  # a quality record stays
    assert len(staleness.split(quality, alone=True)[0]) == 1
