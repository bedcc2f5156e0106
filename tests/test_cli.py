"""The `repro` command: dispatch, one-line errors, recording, notebooks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro import cli

ROOT = Path(__file__).resolve().parent.parent


def repro_cmd():
    exe = Path(sys.executable).parent / "repro"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "repro.cli"]


def run(*args, timeout=240, **env):
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **{k: str(v) for k, v in env.items()}}
    full_env.pop("REPRO_HARDWARE", None)
    full_env.update({k: str(v) for k, v in env.items()})
    return subprocess.run(repro_cmd() + list(args), capture_output=True, text=True, cwd=ROOT,
                          env=full_env, timeout=timeout)


def one_error_line(result):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("repro: error: "), result.stderr
    return lines[0]


def test_unknown_experiment_lists_valid_ones():
    line = one_error_line(run("record", "nope"))
    assert "unknown experiment 'nope'" in line
    assert all(name in line for name in cli.EXPERIMENTS)


def test_record_gemm_smoke_writes_records(tmp_path):
    env = dict(REPRO_RESULTS=tmp_path / "results", REPRO_SCRATCH_RESULTS=tmp_path / "scratch")
    r = run("record", "gemm", "--profile", "smoke", "--hardware", "test-box", **env)
    assert r.returncode == 0, r.stderr
    files = sorted((tmp_path / "scratch" / "test-box" / "gemm").glob("*.json"))
    assert len(files) >= 2 and not (tmp_path / "results").exists()  # smoke -> scratch only
    recs = [rec for f in files for rec in json.loads(f.read_text())]
    assert {r["recipe"] for r in recs if r["metric"] == "tflops"} == {
        "fp32", "tf32", "bf16", "fp16", "fp8"}
    assert {r["hardware"] for r in recs} == {"test-box"}
    assert {r["profile"] for r in recs} == {"smoke"}
    again = run("record", "gemm", "--profile", "smoke", "--hardware", "test-box", **env)
    assert again.returncode == 0 and "wrote 0 cell(s)" in again.stdout


def test_unknown_recipe_lists_valid_ones(tmp_path, capsys):
    assert cli.main(["record", "gemm", "--recipe", "bf16,fp9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown recipe(s) fp9" in err[0]
    assert "valid recipes: fp32, tf32, bf16, fp16, fp8" in err[0]


@pytest.mark.parametrize("argv,expected", [
    (["record", "gemm", "--profile", "fast"], "unknown profile 'fast'"),
    (["bench", "mlp_step"], "repro bench knows gemm"),
    (["notebook", "99_nope"], "no notebook '99_nope'"),
    (["notebook", "01_formats", "-p", "novalue"], "-p expects key=value"),
    (["record"], "required"),
    ([], "required"),
])
def test_bad_input_is_one_line(argv, expected, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repro: error: ") and expected in err[0], err


def test_malformed_params_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    (tmp_path / "params.yaml").write_text("profile: smoke\ngemm: {smoke: [1, 2\n")
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    monkeypatch.setenv("REPRO_SCRATCH_RESULTS", str(tmp_path / "scratch"))
    assert cli.main(["record", "gemm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "malformed YAML" in err[0]
    assert not (tmp_path / "scratch").exists()


def test_missing_module_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(cli.EXPERIMENTS, "ghost", "repro.ghost_experiment:record")
    with pytest.raises(cli.UsageError, match="not available yet: module repro.ghost_experiment"):
        cli.resolve_experiment("ghost")


def test_registry_targets_are_module_colon_function():
    for target in cli.EXPERIMENTS.values():
        module, func = target.split(":")
        assert module.startswith("repro.") and func.isidentifier()
    assert cli.EXPERIMENTS["gemm"] == "repro.studies.gemm:record_gemm"


def test_hardware_command(capsys):
    assert cli.main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "detected:" in out and all(s in out for s in ("gb200", "b200", "h100-sxm", "cpu"))


TINY_NOTEBOOK = '''# %% [markdown]
# A notebook for the CLI test.

# %% tags=["parameters"]
profile = "smoke"
answer = 0

# %%
from pathlib import Path
Path("build/answer.txt").write_text(f"{profile} {answer}")
assert answer != 13, "unlucky"
'''


def test_notebook_converts_and_executes(tmp_path):
    (tmp_path / "params.yaml").write_text("profile: smoke\n")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "00_tiny.py").write_text(TINY_NOTEBOOK)
    r = run("notebook", "00_tiny", "-p", "answer=42", REPRO_ROOT=tmp_path)
    assert r.returncode == 0, r.stderr
    nb_dir = tmp_path / "build" / "notebooks"
    assert (tmp_path / "build" / "answer.txt").read_text() == "smoke 42"  # cwd = repo root
    out = json.loads((nb_dir / "00_tiny.out.ipynb").read_text())
    assert out["metadata"]["kernelspec"]["name"] == "python3"
    assert out["metadata"]["papermill"]["parameters"] == {"answer": 42, "profile": "smoke"}
    assert (nb_dir / "00_tiny.ipynb").exists() and (tmp_path / "build/logs/00_tiny.log").exists()

    # A failing run leaves the previous output alone and says where to look, in one line.
    before = (nb_dir / "00_tiny.out.ipynb").read_bytes()
    bad = run("notebook", "00_tiny", "-p", "answer=13", REPRO_ROOT=tmp_path)
    assert bad.returncode == 1
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("repro: error: notebook 00_tiny failed") and "unlucky" in last
    assert (nb_dir / "00_tiny.out.ipynb").read_bytes() == before
    assert (nb_dir / "00_tiny.failed.ipynb").exists()
    assert not list(nb_dir.glob(".*"))  # no temp files left


def test_recipe_variants_and_peers_pass_validation():
    from repro.cli import _recipe_ok, valid_recipes

    valid = valid_recipes("rl_throughput")
    assert _recipe_ok("rl_throughput", "fp8-delayed:fp8_gemm_out=float32", valid)
    assert _recipe_ok("mlp_step", "flax-fp8", valid)
    assert not _recipe_ok("rl_throughput", "fp8-delayed:nope=1", valid)
    assert not _recipe_ok("gemm", "flax-fp8", valid_recipes("gemm"))


def test_full_record_refuses_a_device_that_skips_roundings(tmp_path, monkeypatch, capsys):
    from repro.precision import check as numerics_check

    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(numerics_check, "checks", lambda: [
        {"check": "formats.cast to bfloat16 matches ml_dtypes", "ok": False, "required": True}])
    for argv in (["record", "gemm", "--profile", "full"], ["record", "all", "--profile", "full"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "numerics check failed" in err[0] and "bfloat16" in err[0]
    assert not (tmp_path / "results").exists()
