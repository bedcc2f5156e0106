"""Code fingerprints and staleness: what counts as a change, the import closure, re-recording."""

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from repro import checkout, evidence, fingerprint, hardware, provenance, results
from repro.studies import runner

REAL = checkout.CHECKOUT


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A checkout of its own: a copy of the package's sources (no data files)."""
    shutil.copytree(REAL / "repro", tmp_path / "repro",
                    ignore=shutil.ignore_patterns("__pycache__", "*.gz", "*.txt"))
    monkeypatch.setattr(checkout, "CHECKOUT", tmp_path)
    return tmp_path


def test_comments_docstrings_and_layout_do_not_change_a_hash_code_does(tmp_path):
    a = write(tmp_path / "a.py", '''
        """Module doc."""
        def f(x):
            """Doc."""
            return x + 1  # a comment
        ''')
    b = write(tmp_path / "b.py", '''
        """Another module doc, longer."""


        def f(x):
            """Another doc.

            More prose."""
            # a new comment
            return (x
                    + 1)
        ''')
    c = write(tmp_path / "c.py", '''
        def f(x):
            return x + 2
        ''')
    d = write(tmp_path / "d.py", '''
        def f(x):
            """Only a docstring left in the body would leave it empty."""
        ''')
    e = write(tmp_path / "e.py", '''
        def f(x):
            pass
        ''')
    assert fingerprint.source_hash(a) == fingerprint.source_hash(b)
    assert fingerprint.source_hash(a) != fingerprint.source_hash(c)
    assert fingerprint.source_hash(d) == fingerprint.source_hash(e)
    # an error message is code: it changes the hash
    f = write(tmp_path / "f.py", 'def f(x):\n    raise ValueError("bad x")\n')
    g = write(tmp_path / "g.py", 'def f(x):\n    raise ValueError("bad x!")\n')
    assert fingerprint.source_hash(f) != fingerprint.source_hash(g)


def test_closure_follows_lazy_relative_and_attribute_imports_only(tmp_path, monkeypatch):
    monkeypatch.setattr(checkout, "CHECKOUT", tmp_path)
    r = tmp_path / "repro"
    write(r / "__init__.py", "")
    write(r / "pkg" / "__init__.py", "from repro.pkg.core import helper\n")
    write(r / "pkg" / "core.py", "import numpy as np\nfrom . import util\ndef helper(): pass\n")
    write(r / "pkg" / "util.py", "import os\n")
    write(r / "pkg" / "unused.py", "import pandas\n")
    write(r / "other" / "__init__.py", "raise RuntimeError('never imported here')\n")
    write(r / "other" / "lazy.py", "import yaml\n")
    write(r / "study.py", '''
        from repro.other import lazy   # a module: other/__init__.py not taken from
        def run():
            from repro.pkg import helper   # a name of pkg/__init__.py: it counts
            import jax.numpy
        ''')
    files, others = fingerprint.closure("repro.study")
    assert [checkout.rel(f) for f in files] == [
        "repro/other/lazy.py", "repro/pkg/__init__.py", "repro/pkg/core.py",
        "repro/pkg/util.py", "repro/study.py"]
    assert others == {"numpy", "yaml", "jax"}  # os is the standard library


def test_the_gemm_study_path_has_the_fp8_cast_and_not_the_rl_code():
    files = {checkout.rel(f)
             for f in fingerprint.closure("repro.experiments.gemm.measure")[0]}
    assert {"repro/experiments/gemm/measure.py", "repro/precision/formats.py",
            "repro/studies/timing.py"} <= files
    assert "repro/models/ppo.py" not in files and "repro/analysis/rl.py" not in files
    rl = {checkout.rel(f)
          for f in fingerprint.closure("repro.experiments.rl_quality.measure")[0]}
    assert {"repro/models/ppo.py", "repro/precision/formats.py",
            "repro/precision/optim.py"} <= rl


def _record(code=None, **kw):
    rec = results.make_record("gemm", "tflops", 1.0, "TFLOP/s", recipe="fp8",
                              hardware=hardware.lookup("h200"))
    rec.update(git_commit="abc1234", code=code, **kw)
    return rec


def test_editing_code_on_the_path_makes_a_record_stale_prose_does_not(tree):
    rec = _record(code=fingerprint.code("repro.experiments.gemm.measure"))
    assert provenance.staleness(rec).stale is False
    formats = tree / "repro" / "precision" / "formats.py"
    formats.write_text(formats.read_text() + '\n"""A new note."""\n# and a comment\n')
    assert provenance.staleness(rec).stale is False
    formats.write_text(formats.read_text() + "\nEXTRA = 1\n")
    st = provenance.staleness(rec)
    assert st.stale and st.changed == ("repro/precision/formats.py",)
    assert "repro/precision/formats.py" in st.reason and "abc1234" in st.reason
    # a file off the path (the RL loop) does not touch the GEMM records
    other = _record(code=fingerprint.code("repro.experiments.gemm.measure"))
    ppo = tree / "repro" / "models" / "ppo.py"
    ppo.write_text(ppo.read_text() + "\nEXTRA = 1\n")
    assert provenance.staleness(other).stale is False


def test_data_files_are_hashed_by_bytes(tree):
    corpus = write(tree / "repro" / "data" / "corpus.txt", "abc\n")
    rec = _record(code=fingerprint.code("repro.experiments.gemm.measure",
                                              ["repro/data/corpus.txt"]))
    assert provenance.staleness(rec).stale is False
    corpus.write_text("abd\n")
    assert provenance.staleness(rec).changed == ("repro/data/corpus.txt",)
    with pytest.raises(ValueError, match="repro/data/missing.txt"):
        fingerprint.code("repro.experiments.gemm.measure", ["repro/data/missing.txt"])


def test_records_without_fingerprint_or_with_other_locked_versions_are_stale(tree):
    st = provenance.staleness(_record())
    assert st.stale and "before code fingerprints, at commit abc1234" in st.reason
    write(tree / fingerprint.LOCK, "# a lock\njax==0.11.2\njaxlib==0.11.2\nFlax==0.12.10\n")
    assert fingerprint.locked_versions() == {"jax": "0.11.2", "jaxlib": "0.11.2",
                                            "flax": "0.12.10"}
    code = fingerprint.code("repro.experiments.gemm.measure")
    assert not provenance.staleness(_record(code, jax="0.11.2", jaxlib="0.11.2",
                                            flax="0.12.10")).stale
    st = provenance.staleness(_record(code, jax="0.10.2", jaxlib="0.11.2", flax="0.12.10"))
    assert st.stale and st.reason == "recorded with jax 0.10.2; requirements.lock pins 0.11.2"


def test_since_is_the_first_commit_that_touched_a_changed_file(tmp_path, monkeypatch):
    monkeypatch.setattr(checkout, "CHECKOUT", tmp_path)

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    write(tmp_path / "a.py", "A = 1\n")
    write(tmp_path / "b.py", "B = 1\n")
    git("add", ".")
    git("commit", "-qm", "one")
    recorded = git("rev-parse", "--short", "HEAD")
    write(tmp_path / "b.py", "B = 2\n")
    git("commit", "-qam", "two: b only")
    write(tmp_path / "a.py", "A = 2\n")
    git("commit", "-qam", "three: a")
    three = git("rev-parse", "--short", "HEAD")
    write(tmp_path / "a.py", "A = 3\n")
    git("commit", "-qam", "four: a again")
    assert checkout.first_change(recorded, ["a.py"]) == three
    assert checkout.first_change(recorded + "-dirty", ["a.py"]) == three
    assert checkout.first_change(git("rev-parse", "--short", "HEAD"), ["a.py"]) == \
        "uncommitted"
    assert checkout.first_change("unknown", ["a.py"]) is None
    assert checkout.first_change("deadbeef", ["a.py"]) is None  # not in this history


def toy_study(calls):
    def cells(params):
        def make(name):
            def run(_budget):
                calls.append(name)
                return [results.make_record("toy", "value", 1.0, "1", sizes={"cell": name},
                                            hardware=hardware.lookup("cpu"))]
            return run
        return [runner.Cell(n, make(n)) for n in ("a", "b")]
    return runner.Study("toy", ("A1",), cells)


def test_the_runner_stamps_records_and_records_stale_cells_again(tmp_path):
    calls = []
    study = toy_study(calls)
    runner.run(study, {"profile": "smoke"}, tmp_path, hardware="box", progress=False)
    path = tmp_path / "box" / "toy" / "a.json"
    (rec,) = json.loads(path.read_text())
    here = Path(__file__).resolve()
    assert rec["code"]["module"] == study.source_module == toy_study.__module__
    assert rec["code"]["files"][checkout.rel(here)] == fingerprint.source_hash(here)
    assert "repro/studies/runner.py" in rec["code"]["files"]
    assert rec["versions"]["jax"] == rec["jax"] and "python" in rec["versions"]
    assert not provenance.staleness(rec).stale

    rec["code"]["digest"] = "0" * 16  # as if another version of the code had made it
    path.write_text(json.dumps([rec]))
    out = runner.run(study, {}, tmp_path, hardware="box", progress=False)
    assert calls == ["a", "b", "a"] and out.restale == ["a"] and out.skipped == ["b"]
    assert json.loads(path.read_text())[0]["code"]["digest"] != "0" * 16


def test_load_records_marks_stale_rows(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text("profile: smoke\n")  # a checkout's root
    (tmp_path / "results").mkdir(exist_ok=True)
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    fresh = _record(code=fingerprint.code("repro.experiments.gemm.measure"))
    results.write_records([fresh], "gemm", "new", root=tmp_path / "results")
    results.write_records([_record()], "gemm", "old", root=tmp_path / "results")
    df = evidence.load_records("gemm", roots=tmp_path / "results").set_index("source")
    new, old = (str(tmp_path / "results" / "h200" / "gemm" / f"{n}.json") for n in ("new", "old"))
    assert not df.loc[new, "stale"] and df.loc[new, "stale_reason"] is None
    assert df.loc[old, "stale"] and "before code fingerprints" in df.loc[old, "stale_reason"]


def test_repro_status_lists_stale_cells_and_the_verdicts_they_touch(tmp_path, monkeypatch,
                                                                     capsys):
    from repro import cli

    (tmp_path / "params.yaml").write_text("profile: smoke\n")  # a checkout's root
    (tmp_path / "results").mkdir(exist_ok=True)
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    monkeypatch.delenv("REPRO_VERDICTS", raising=False)
    fresh = _record(code=fingerprint.code("repro.experiments.gemm.measure"),
                    claims=["A2"])
    results.write_records([fresh], "gemm", "new", root=tmp_path / "results")
    results.write_records([_record(claims=["B2", "B3"])] * 2, "gemm", "old",
                          root=tmp_path / "results")
    write(tmp_path / "verdicts" / "A2.json", '{"verdict": "reproduced", "source": "x"}')
    write(tmp_path / "verdicts" / "B2.json", '{"verdict": "partly", "source": "y", '
          '"stale": true, "stale_note": "left out as stale: 1 gemm cell(s) (old code)"}')
    # marked stale, but naming another experiment's cells: it does not say so for gemm
    write(tmp_path / "verdicts" / "B3.json", '{"verdict": "partly", "source": "z", '
          '"stale": true, "stale_note": "left out as stale: 3 lm cell(s) (old code)"}')
    write(tmp_path / "verdicts" / "A9.json", '{"verdict": "partly", "source": '
          '"results/*/gemm (tflops)"}')
    assert cli.main(["status", "--json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)
    assert (group["experiment"], group["hardware"], group["cells"], group["records"]) == \
        ("gemm", "h200", 1, 2)
    # A9 cites gemm and says nothing; B2 and B3 name no records and serve the records'
    # claims: B2 names gemm's stale cells, B3 only lm's; A2 is not touched
    assert group["verdicts"] == {"A9": False, "B2": True, "B3": False}
    (reason,) = group["reasons"]
    assert reason["cells"] == ["old"] and reason["commits"] == ["abc1234"]
    assert cli.main(["status"]) == 0
    text = capsys.readouterr().out
    assert "2 stale record(s) in 1 cell(s)" in text and "A9 (does not say so)" in text


def test_split_keeps_stale_quality_metrics_of_any_experiment_and_leaves_out_stale_timings():
    import pandas as pd

    from repro.claims import staleness

    df = pd.DataFrame({
        "experiment": ["legged", "legged", "legged", "rl_quality", "gemm", "inference"],
        "metric": ["final_return", "env_steps_per_s", "update_ms", "final_return", "tflops",
                   "top1_agreement"],
        "stale": [True, True, False, True, True, True],
    })
    used, left = staleness.split(df)
    assert sorted(zip(used.experiment, used.metric)) == [
        ("inference", "top1_agreement"), ("legged", "final_return"), ("legged", "update_ms"),
        ("rl_quality", "final_return")]
    assert sorted(zip(left.experiment, left.metric)) == [("gemm", "tflops"),
                                                        ("legged", "env_steps_per_s")]


@pytest.mark.parametrize("reason, words", [
    # a jaxpr line quoted as the first difference holds "; " itself
    ("its program changed: first difference at line 1: let base = { lambda a:i32[1,13] "
     "b:bool[256]; c:key<fry>[]. let (since 2548988)", "program changed"),
    ("its measuring kit (bf16) changed; its program (fp8-current) changed: first difference "
     "at line 1458: fwd=_fp8_fwd_rule (since 8c57d52)", "measuring kit changed, program changed"),
    ("recorded before code fingerprints; the code has been restructured",
     "recorded before code fingerprints, code restructured since"),
])
def test_a_stale_reason_in_words_quotes_no_program_text(reason, words):
    from repro.claims import staleness
    from repro.refresh import stale_set

    assert staleness.why(reason) == words
    cell = {"hardware": "h", "folder": "x", "cell": "c", "records": 1, "stale": 1,
            "summary": reason}
    got = stale_set([cell])["h/x/c"]["why"]
    assert "first difference" not in got and "<fry>" not in got and "c:key" not in got, got
