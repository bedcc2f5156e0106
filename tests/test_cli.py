"""The `repro` command: dispatch, one-line errors, exit codes, recording, notebooks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro import cli, studies

ROOT = Path(__file__).resolve().parent.parent
GEMM_PARAMS = """profile: smoke
gemm:
  common: {dtypes: [fp32, tf32, bf16, fp16, fp8], repeats: 1, input_sets: 1}
  smoke: {shapes: [[32, 16, 16]], error_shape: [16, 16, 16]}
  full: {shapes: [[64, 64, 64]]}
"""


def repro_cmd():
    exe = Path(sys.executable).parent / "repro"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "repro.cli"]


def run(*args, timeout=240, **env):
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **{k: str(v) for k, v in env.items()}}
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
    assert all(name in line for name in studies.EXPERIMENTS)


@pytest.mark.slow  # end-to-end record (dvc repro's gemm stage records the same smoke cells)
def test_record_gemm_smoke_writes_records(tmp_path):
    (tmp_path / "params.yaml").write_text(GEMM_PARAMS)
    (tmp_path / "results").mkdir()
    r = run("record", "gemm", "--profile", "smoke", "--hardware", "test-box", "--note", "a note",
            REPRO_ROOT=tmp_path)
    assert r.returncode == 0, r.stderr
    files = sorted((tmp_path / "build" / "results" / "test-box" / "gemm").glob("*.json"))
    assert [f.name for f in files] == ["32x16x16.json", "rel_error_16x16x16.json"]
    assert not any((tmp_path / "results").iterdir())  # smoke -> scratch only
    recs = [rec for f in files for rec in json.loads(f.read_text())]
    assert {r["recipe"] for r in recs if r["metric"] == "tflops"} == {
        "fp32", "tf32", "bf16", "fp16", "fp8"}
    assert {r["hardware"] for r in recs} == {"test-box"}
    assert {r["profile"] for r in recs} == {"smoke"} and {r["run_note"] for r in recs} == {
        "a note"}
    again = run("record", "gemm", "--profile", "smoke", "--hardware", "test-box",
                REPRO_ROOT=tmp_path)
    assert again.returncode == 0 and "wrote 0 cell(s)" in again.stdout
    assert "2 already recorded" in again.stdout


def test_bare_repro_prints_help_and_version_comes_from_the_package(capsys):
    from importlib.metadata import version

    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: repro") and "record" in out and "REPRO_ROOT" in out
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"repro {version('repro')}"


def test_help_documents_debug_and_the_environment(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for word in ("--debug", "REPRO_ROOT", "REPRO_GIT_COMMIT", "130 interrupted"):
        assert word in out, word


@pytest.mark.parametrize("argv,expected", [
    (["record", "gemm", "--profile", "fast"], "unknown profile 'fast'"),
    (["record", "gemm", "--recipe", "bf16,fp9"],
     "unknown GEMM recipe(s) fp9; valid recipes: fp32, tf32, bf16, fp16, fp8"),
    (["record", "mlp_step", "--recipe", "bf16,fp9"], "unknown recipe 'fp9'; valid recipes: "),
    (["record", "gemm", "--only", "9x*"], "gemm: --only 9x* selects no cell; cells: "),
    (["record", "kernel_times"], "unknown experiment 'kernel_times' (it is traced"),
    (["record", "gemm", "--time-budget", "soon"], "invalid float value: 'soon'"),
    (["trace", "conv"], "unknown workload 'conv'; valid: mlp, lm, gemm, ppo"),
    (["notebook", "99_nope"], "no notebook '99_nope'"),
    (["notebook", "01_formats", "-p", "novalue"], "-p expects key=value"),
    (["notebook", "01_formats", "-p", "profle=full"],
     "notebook 01_formats has no parameter 'profle' (did you mean 'profile'?)"),
    (["record"], "required"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_with_exit_status_2(argv, expected, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repro: error: ") and expected in err[0], err


def test_debug_shows_the_traceback_instead(capsys):
    from repro.cli.checks import UsageError

    with pytest.raises(UsageError, match="unknown profile 'fast'"):
        cli.main(["--debug", "record", "gemm", "--profile", "fast"])


def test_malformed_params_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    (tmp_path / "params.yaml").write_text("profile: smoke\ngemm: {smoke: [1, 2\n")
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    assert cli.main(["record", "gemm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "malformed YAML" in err[0]
    assert not (tmp_path / "build").exists()


def test_a_failing_cell_exits_1_and_ctrl_c_130(tmp_path, capsys, monkeypatch):
    from repro.experiments.gemm import measure as bench

    (tmp_path / "params.yaml").write_text(GEMM_PARAMS)
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))

    def broken(*a, **k):
        raise RuntimeError("no FP8 GEMM here\nsecond line")

    monkeypatch.setattr(bench, "gemm_sweep", broken)
    assert cli.main(["record", "gemm", "--hardware", "test-box"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("repro: error: gemm: 1 cell(s) failed, the others were written: 32x16x16 "
                   "(RuntimeError: no FP8 GEMM here)")
    assert [p.name for p in tmp_path.rglob("*.json")] == ["rel_error_16x16x16.json"]

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "gemm_sweep", interrupted)
    assert cli.main(["record", "gemm", "--hardware", "test-box"]) == 130
    assert "finished cells are kept" in capsys.readouterr().err


def test_hardware_and_recipes_commands(capsys):
    assert cli.main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "detected:" in out and all(s in out for s in ("gb200", "b200", "h100-sxm", "cpu"))
    assert cli.main(["recipes"]) == 0
    rows = {line.split()[0]: line.split()[1:7] for line in capsys.readouterr().out.splitlines()}
    assert rows["name"] == ["family", "gemm", "scaling", "backend", "scope", "storage"]
    assert rows["bf16"] == ["bf16", "dense", "none", "repro", "default", "fp32"]
    assert rows["nvfp4"][:3] == ["nvfp4", "nvfp4", "block"]
    assert rows["flax-fp8"][3] == "flax" and rows["fp8-all-layers"][:5] == [
        "fp8-delayed", "fp8", "delayed", "repro", "all"]


def test_check_command_passes_on_this_device(capsys):
    assert cli.main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("numerics check on cpu") and "FAIL" not in out
    assert "[ok  ] formats.cast to bfloat16 matches ml_dtypes" in out


TINY_NOTEBOOK = '''# %% [markdown]
# A notebook for the CLI test.

# %% tags=["parameters"]
profile = "smoke"
answer = 0
scratch = "unset"

# %%
from pathlib import Path
from repro.claims import ledger
Path(scratch).mkdir(parents=True)  # a fresh folder: fails if it exists
Path("build/answer.txt").write_text(f"{profile} {answer} {scratch}")
(ledger.outputs_root() / "figures").mkdir(parents=True, exist_ok=True)
(ledger.outputs_root() / "figures" / "00_tiny.png").write_text(f"figure {answer}")

# %%
def check(answer):
    assert answer != 13, "unlucky"
check(answer)
'''


@pytest.mark.slow  # executes a notebook (dvc repro executes every one)
def test_notebook_converts_and_executes(tmp_path):
    (tmp_path / "params.yaml").write_text("profile: smoke\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "00_tiny.py").write_text(TINY_NOTEBOOK)
    r = run("notebook", "00_tiny", "-p", "answer=42", REPRO_ROOT=tmp_path)
    assert r.returncode == 0, r.stderr
    nb_dir, scratch = tmp_path / "build" / "notebooks", tmp_path / "build" / "results" / "00_tiny"
    assert (tmp_path / "build" / "answer.txt").read_text() == f"smoke 42 {scratch}"  # cwd: root
    out = json.loads((nb_dir / "00_tiny.out.ipynb").read_text())
    assert out["metadata"]["kernelspec"]["name"] == "python3"
    assert out["metadata"]["papermill"]["parameters"] == {"answer": 42, "profile": "smoke",
                                                          "scratch": str(scratch)}
    assert (nb_dir / "00_tiny.ipynb").exists() and (tmp_path / "build/logs/00_tiny.log").exists()
    # the committed output, moved in after the whole run, and the receipt naming it
    figure = tmp_path / "figures" / "00_tiny.png"
    assert figure.read_text() == "figure 42" and not (nb_dir / "00_tiny.staged").exists()
    assert list(json.loads((nb_dir / "00_tiny.outputs.json").read_text())["outputs"]) == [
        "docs/notebooks/00_tiny.md", "figures/00_tiny.png"]
    page = (tmp_path / "docs" / "notebooks" / "00_tiny.md").read_text()  # the executed notebook
    assert "A notebook for the CLI test." in page and "check(answer)" in page
    assert str(tmp_path) not in page

    # A failing run leaves the previous output and the committed figure alone and says where
    # to look, in one line: the notebook's own line; the scratch folder of the first run was
    # emptied for it.
    before = (nb_dir / "00_tiny.out.ipynb").read_bytes()
    bad = run("notebook", "00_tiny", "-p", "answer=13", REPRO_ROOT=tmp_path)
    assert bad.returncode == 1
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("repro: error: notebook 00_tiny failed") and "unlucky" in last
    line = TINY_NOTEBOOK.splitlines().index('    assert answer != 13, "unlucky"') + 1
    assert f"(notebooks/00_tiny.py:{line})" in last, last
    assert (nb_dir / "00_tiny.out.ipynb").read_bytes() == before
    assert (nb_dir / "00_tiny.failed.ipynb").exists()
    assert figure.read_text() == "figure 42" and not (nb_dir / "00_tiny.staged").exists()
    assert (tmp_path / "docs" / "notebooks" / "00_tiny.md").read_text() == page
    assert not list(nb_dir.glob(".*"))  # no temp files left

    # A notebook that does not parse is refused before a kernel starts, naming its line.
    (tmp_path / "notebooks" / "00_tiny.py").write_text(TINY_NOTEBOOK.replace(
        "\ncheck(answer)", "\ncheck(answer +"))
    broken = run("notebook", "00_tiny", "-p", "answer=1", REPRO_ROOT=tmp_path)
    assert broken.returncode == 1 and figure.read_text() == "figure 42"
    line = TINY_NOTEBOOK.splitlines().index("check(answer)") + 1  # the line, not its cell's
    assert f"notebooks/00_tiny.py:{line}: SyntaxError" in broken.stderr, broken.stderr
    (tmp_path / "notebooks" / "00_tiny.py").write_text(TINY_NOTEBOOK)

    unknown = run("notebook", "00_tiny", "-p", "answr=1", REPRO_ROOT=tmp_path)
    assert "has no parameter 'answr' (did you mean 'answer'?); its parameters: profile, " \
           "answer, scratch" in one_error_line(unknown)


def test_full_record_refuses_a_device_that_skips_roundings(tmp_path, monkeypatch, capsys):
    from repro.precision import check as numerics_check

    (tmp_path / "params.yaml").write_text(GEMM_PARAMS)
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    monkeypatch.setattr(studies, "EXPERIMENTS", {"gemm": "repro.experiments.gemm.measure"})
    monkeypatch.setattr(numerics_check, "checks", lambda: [
        {"check": "formats.cast to bfloat16 matches ml_dtypes", "ok": False, "required": True}])
    for argv in (["record", "gemm", "--profile", "full", "--yes"],
                 ["record", "all", "--profile", "full", "--yes"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "numerics check failed" in err[0] and "bfloat16" in err[0]
    assert cli.main(["check"]) == 1
    assert "[FAIL] formats.cast to bfloat16" in capsys.readouterr().out
    assert not any((tmp_path / "results").iterdir())


# a module's child-process hook (run by the module itself, never by a user): not an entry point
CHILD_HOOKS = {
    "repro/experiments/rl_purejaxrl/measure.py": "the fresh process of first_result()"}


def test_no_library_module_has_a_main():
    """`repro` is the one entry point: no `python -m repro.<module>` elsewhere (but for the
    child-process hooks of CHILD_HOOKS, each marked as such where it is)."""
    for path in (ROOT / "repro").rglob("*.py"):
        if path.parent.name != "cli":  # the command's own package
            text = path.read_text()
            rel = path.relative_to(ROOT).as_posix()
            if rel in CHILD_HOOKS:
                assert CHILD_HOOKS[rel] in text.split('if __name__ == "__main__"')[-1], rel
                continue
            assert 'if __name__ == "__main__"' not in text and "def main(" not in text, path
