"""dvc.yaml knows what each notebook reads: a stage that misses a module its notebook imports
(directly, through other modules, or lazily) fails here, as does a stale generated file."""

from pathlib import Path

import pytest
import yaml

from repro import fingerprint, pipeline

ROOT = Path(__file__).resolve().parent.parent


def stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def missing(stage: dict, notebook: str) -> list[str]:
    """The modules in ``notebook``'s import closure that no dep of ``stage`` covers (a dep
    covers a file when it is the file or a folder above it)."""
    deps = [d.rstrip("/") for d in stage.get("deps", [])]
    files, _ = fingerprint.closure(ROOT / "notebooks" / f"{notebook}.py")
    rel = [f.resolve().relative_to(ROOT).as_posix() for f in files]
    return [f for f in rel if not any(f == d or f.startswith(d + "/") for d in deps)]


def notebook_stages() -> dict[str, str]:
    out = {}
    for name, stage in stages().items():
        words = stage["cmd"].split()
        if words[:2] == ["repro", "notebook"]:
            out[name] = words[2]
    return out


def test_every_notebook_stage_depends_on_its_whole_import_closure():
    found = notebook_stages()
    assert sorted(found.values()) == sorted(p.stem for p in (ROOT / "notebooks").glob(
        "[0-9]*.py"))
    for name, notebook in found.items():
        assert not missing(stages()[name], notebook), (name, missing(stages()[name], notebook))


def test_the_check_catches_a_dropped_module():
    stage = dict(stages()["rl_quality"])
    assert "repro/precision/formats.py" in stage["deps"]
    stage["deps"] = [d for d in stage["deps"] if d != "repro/precision/formats.py"]
    assert missing(stage, "04_rl_quality") == ["repro/precision/formats.py"]
    stage["deps"].append("repro/precision")  # a folder above it covers it
    assert missing(stage, "04_rl_quality") == []


def test_rl_stages_depend_on_the_fp8_quantizer_and_the_records():
    for name in ("rl_quality", "rl_throughput"):
        deps = stages()[name]["deps"]
        for f in ("repro/precision/formats.py", "repro/precision/scaling.py",
                  "repro/models/ppo.py", "results/programs", f"results/h200/{name}"):
            assert f in deps, (name, f)
    assert "repro/data/lm_corpus.txt.gz" in stages()["lm"]["deps"]
    assert "repro/data/lm_corpus.txt.gz" not in stages()["gemm_roofline"]["deps"]


def test_a_stage_depends_on_the_record_folders_its_notebook_reads_and_no_other():
    """A new gemm record reruns the stages that read gemm (02, 06 and 07), not all of them;
    every stage that reads records also depends on the program index (staleness)."""
    readers = {name: [d for d in stage["deps"] if d.startswith("results")]
               for name, stage in stages().items() if name in notebook_stages()}
    assert sorted(n for n, deps in readers.items() if "results/h200/gemm" in deps) == \
        ["fp8_train_step", "gemm_roofline", "perfmodel"]
    assert readers["rl_quality"] == ["results/cpu/rl_quality", "results/h200/rl_quality",
                                     "results/h200/rl_quality_repeat", "results/programs"]
    assert readers["ppo_speed"] == ["results/cpu/rl_throughput", "results/h200/kernel_times",
                                    "results/h200/rl_purejaxrl",
                                    "results/h200/rl_throughput", "results/programs",
                                    "results/tpu-v5e/rl_throughput"]
    for name, deps in readers.items():
        assert "results" not in deps and "results/programs" in deps, name
        assert all((ROOT / d).is_dir() for d in deps), name  # DVC needs every dep to exist
    assert "results" not in stages()["claims"]["deps"]


def test_record_reads_follows_constants_loops_and_wrappers(tmp_path):
    """The experiment of each read, resolved in the code: a string, another module's
    constant, a loop over constants (a dict's keys, a starred tuple), a function that passes
    its argument on; an experiment it cannot resolve stands for every folder."""
    nb = tmp_path / "99_x.py"
    nb.write_text(
        "from repro import notebook, results\n"
        "from repro.experiments.lm import measure as E\n"
        "from repro.perfmodel.measured import GEMM\n"
        "MORE = {'a1': 1, 'a2': 2}\n"
        "def mine(what, n=0):\n"
        "    return evidence.load_records(what)\n"
        "def records(folder):  # the same name as Notebook.records, reading nothing\n"
        "    return folder\n"
        "nb = notebook.start('99_x')\n"
        "nb.records(E.EXPERIMENT)\n"
        "[evidence.load_records(e) for e in (GEMM, *MORE)]\n"
        "mine('b', n=1)\n"
        "records('not_read')\n")
    assert pipeline.record_reads(nb) == {"lm", "gemm", "a1", "a2", "b"}
    nb.write_text(nb.read_text() + "evidence.load_records(input())\n")
    assert pipeline.EVERY in pipeline.record_reads(nb)
    assert pipeline.result_deps({pipeline.EVERY, "gemm"}) == ["results"]
    nb.write_text("from repro import results\nresults.stale_cells()\n")
    assert pipeline.record_reads(nb) == {pipeline.EVERY}
    nb.write_text("from repro import results\nresults.load_records()\n")  # every experiment
    assert pipeline.record_reads(nb) == {pipeline.EVERY}
    nb.write_text("x = 1\n")
    assert pipeline.record_reads(nb) == set() and pipeline.result_deps(set()) == []


def test_metrics_and_plots_are_declared():
    for name, notebook in notebook_stages().items():
        stage = stages()[name]
        assert [next(iter(m)) for m in stage["metrics"]] == [f"metrics/{notebook}.json"]
        prefix = notebook.split("_")[0]
        plots = sorted(next(iter(p)) for p in stage.get("plots", []))
        assert plots == sorted(f"figures/{p.name}" for p in (ROOT / "figures").glob(
            f"{prefix}_*.png"))


def test_dvc_yaml_is_what_repro_pipeline_writes():
    assert (ROOT / "dvc.yaml").read_text() == pipeline.render(), \
        "dvc.yaml is out of date: run `repro pipeline`"


def test_studies_run_by_name_are_followed(tmp_path):
    nb = tmp_path / "99_x.py"
    nb.write_text('from repro import studies\nstudies.record("mlp_step", "smoke")\n')
    deps = pipeline.code_deps(nb)
    assert {"repro/experiments/mlp_step/measure.py", "repro/precision/layers.py"} <= set(deps)
    nb.write_text('"""Prose naming mlp_step and lm_corpus.txt.gz."""\nfrom repro import studies\n')
    deps = pipeline.code_deps(nb)
    assert "repro/experiments/mlp_step/measure.py" not in deps
    assert "repro/data/lm_corpus.txt.gz" not in deps


def test_a_notebook_receipt_lists_what_the_run_wrote_and_is_the_same_for_the_same_bytes(
        tmp_path):
    from repro import run_notebook

    (tmp_path / "figures").mkdir()
    (tmp_path / "build" / "notebooks").mkdir(parents=True)
    (tmp_path / "figures" / "02_old.png").write_bytes(b"old")
    receipts = []
    for _ in range(2):
        staging = tmp_path / "build" / "notebooks" / "01_x.staged"
        for rel, data in (("figures/01_a.png", b"png"), ("verdicts/B1.json", b"{}")):
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
        path = run_notebook.write_receipt(tmp_path, "01_x", "smoke", staging)
        receipts.append(path.read_bytes())
        assert run_notebook.commit_outputs(tmp_path, staging) == ["figures/01_a.png",
                                                                  "verdicts/B1.json"]
        assert not staging.exists() and (tmp_path / "verdicts" / "B1.json").read_bytes() == b"{}"
    assert receipts[0] == receipts[1]
    data = __import__("json").loads(receipts[0])
    assert sorted(data["outputs"]) == ["figures/01_a.png", "verdicts/B1.json"]  # not 02_old
    assert data["outputs"]["verdicts/B1.json"] == \
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"[:16]  # sha256("{}")
    assert (tmp_path / "figures" / "02_old.png").read_bytes() == b"old"


def test_committed_outputs_are_persist_outputs():
    for name, notebook in notebook_stages().items():
        stage = stages()[name]
        kept = [o for key in ("outs", "metrics", "plots") for o in stage.get(key, [])
                if not next(iter(o)).startswith("build/")]
        assert kept and all(next(iter(o.values())) == {"cache": False, "persist": True}
                            for o in kept), name


@pytest.mark.slow  # runs dvc repro on a toy pipeline
def test_a_broken_notebook_leaves_its_stages_committed_outputs_in_place(tmp_path):
    """`dvc repro -s formats` of a copy of the tree with a syntax error in its notebook: the
    stage fails naming the notebook's own line, and figures, verdict and metrics are the
    committed bytes (DVC deletes a stage's outputs before running it unless they persist)."""
    import os
    import shutil
    import subprocess
    import sys

    import pytest

    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "dvc").exists() or not (bin_dir / "repro").exists():
        pytest.skip("dvc or the repro command is not installed beside this Python")
    shutil.copytree(ROOT / "repro", tmp_path / "repro",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for rel in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / rel, tmp_path / rel)
    outputs = [p.relative_to(ROOT) for p in (*(ROOT / "figures").glob("01_*.png"),
                                             ROOT / "verdicts" / "B1.json",
                                             ROOT / "metrics" / "01_formats.json")]
    for rel in outputs:
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    for dep in stages()["formats"]["deps"]:  # the record folders it reads, empty
        if dep.startswith("results"):
            (tmp_path / dep).mkdir(parents=True)
            (tmp_path / dep / "README").write_text("no records\n")
    lines = (ROOT / "notebooks" / "01_formats.py").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("import "))
    lines.insert(at, "x = (1,\n")  # the notebook's line at + 1 no longer parses
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_formats.py").write_text("".join(lines))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    env.pop("REPRO_ROOT", None)
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True)
    r = subprocess.run(["dvc", "repro", "-s", "formats"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert f"notebooks/01_formats.py:{at + 1}: SyntaxError" in r.stdout + r.stderr, r.stderr
    for rel in outputs:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    assert not (tmp_path / "build" / "notebooks" / "01_formats.staged").exists()


def test_data_plots_are_outputs_and_top_level_plots_with_their_x_and_y():
    """Each committed figures/data/*.csv is kept by the stage of its notebook and declared
    as a top-level plot (x: its first column, y: the others), so `dvc plots diff` overlays
    two commits' series."""
    data = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    plots = {next(iter(p)): next(iter(p.values())) for p in data.get("plots", [])}
    assert sorted(plots) == pipeline.plot_data() == sorted(
        f"figures/data/{p.name}" for p in (ROOT / "figures" / "data").glob("*.csv"))
    for path, spec in plots.items():
        header = (ROOT / path).read_text().splitlines()[0].split(",")
        assert spec["x"] == header[0] and spec["y"] == header[1:] and spec["y"], path
        owners = [n for n, s in stages().items()
                  if {path: {"cache": False, "persist": True}} in s.get("outs", [])]
        assert owners == [n for n, nb in notebook_stages().items()
                          if Path(path).name.startswith(nb.split("_")[0] + "_")], path


def test_plot_data_is_sorted_rounded_and_the_same_bytes_for_the_same_table(tmp_path,
                                                                         monkeypatch):
    import pandas as pd

    from repro import notebook

    monkeypatch.setenv("REPRO_STAGING", str(tmp_path))
    nb = notebook.Notebook("03_x", "full", {}, None, tmp_path)
    t = pd.DataFrame({"b": [2.0, 1 / 3], "a": [float("nan"), 1.23456]},
                     index=pd.Index([4096, 64], name="width"))
    path = nb.plot_data("03_x_speedup", t, "committed records")
    assert path == tmp_path / "figures" / "data" / "03_x_speedup.csv"
    assert path.read_text() == "width,a,b\n64,1.235,0.3333\n4096,,2\n"
    first = path.read_bytes()
    nb.plot_data("03_x_speedup", t.iloc[::-1][["a", "b"]], "committed records")
    assert path.read_bytes() == first
    t.index = pd.Index([20480.0, 6553600.0], name="tokens")  # whole numbers stay whole
    assert nb.plot_data("03_x_speedup", t, "committed records").read_text().splitlines()[1:] \
        == ["20480,,2", "6553600,1.235,0.3333"]
