"""dvc.yaml knows what each notebook reads: a stage that misses a module its notebook imports
(directly, through other modules, or lazily) fails here, as does a stale generated file."""

from pathlib import Path

import yaml

from repro import pipeline, provenance

ROOT = Path(__file__).resolve().parent.parent


def stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def missing(stage: dict, notebook: str) -> list[str]:
    """The modules in ``notebook``'s import closure that no dep of ``stage`` covers (a dep
    covers a file when it is the file or a folder above it)."""
    deps = [d.rstrip("/") for d in stage.get("deps", [])]
    files, _ = provenance.closure(ROOT / "notebooks" / f"{notebook}.py")
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
                  "repro/models/ppo.py", "results"):
            assert f in deps, (name, f)
    assert "repro/data/lm_corpus.txt.gz" in stages()["lm"]["deps"]
    assert "repro/data/lm_corpus.txt.gz" not in stages()["gemm_roofline"]["deps"]


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
    assert {"repro/studies/mlp_step.py", "repro/precision/layers.py"} <= set(deps)
    nb.write_text('"""Prose naming mlp_step and lm_corpus.txt.gz."""\nfrom repro import studies\n')
    deps = pipeline.code_deps(nb)
    assert "repro/studies/mlp_step.py" not in deps and "repro/data/lm_corpus.txt.gz" not in deps


def test_a_notebook_receipt_lists_what_the_run_wrote_and_is_the_same_for_the_same_bytes(
        tmp_path):
    import os

    from repro import run_notebook

    (tmp_path / "figures").mkdir()
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "build" / "notebooks").mkdir(parents=True)
    (tmp_path / "figures" / "02_old.png").write_bytes(b"old")
    receipts = []
    for run in range(2):
        before = run_notebook._snapshot(tmp_path)
        for rel, data in (("figures/01_a.png", b"png"), ("verdicts/B1.json", b"{}")):
            path = tmp_path / rel
            path.write_bytes(data)
            os.utime(path, ns=(run + 10**18, run + 10**18))  # as a later run would
        path = run_notebook.write_receipt(tmp_path, "01_x", "smoke", before)
        receipts.append(path.read_bytes())
    assert receipts[0] == receipts[1]
    data = __import__("json").loads(receipts[0])
    assert sorted(data["outputs"]) == ["figures/01_a.png", "verdicts/B1.json"]  # not 02_old
    assert data["outputs"]["verdicts/B1.json"] == \
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"[:16]  # sha256("{}")
