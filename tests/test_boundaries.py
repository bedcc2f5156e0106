"""Where the `repro` command may read and write: every path a user sets (`-p scratch=`,
`site --out`, REPRO_ROOT) stays inside the repository and out of its committed folders, or is
refused in one line naming it, with nothing written."""

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro import cli, run_notebook
from repro.checkout import COMMITTED, inside_repository

ROOT = Path(__file__).resolve().parent.parent
PROPERTY = settings(deadline=None, derandomize=True, database=None, max_examples=200,
                    suppress_health_check=list(HealthCheck))


def one_line(capsys, status, argv):
    assert cli.main(argv) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repro: error: "), err
    return err[0]


def tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    (root / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "02_gemm_roofline.py", root / "notebooks")
    (root / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(root))
    monkeypatch.setenv("REPRO_VERDICTS", str(root / "verdicts"))
    monkeypatch.chdir(root)
    monkeypatch.setattr(run_notebook, "_execute", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr(run_notebook, "_require_kernel", lambda: None)
    return root


@pytest.mark.parametrize("scratch, says", [
    ("results", "resolves into results/"), ("/", "outside the repository's build/"),
    ("../elsewhere", "outside the repository's build/"), ("build/../results/x", "results/"),
    (".", "outside the repository's build/"), ("figures", "resolves into figures/"),
])
def test_a_scratch_folder_outside_build_is_refused(repo, capsys, scratch, says):
    before = tree(repo)
    line = one_line(capsys, 2, ["notebook", "02_gemm_roofline", "--profile", "smoke", "-p",
                                f"scratch={scratch}"])
    assert f"-p scratch={scratch}:" in line and says in line, line
    assert tree(repo) == before


def test_a_scratch_folder_under_build_is_taken_relative_to_the_repository(repo, monkeypatch,
                                                                         tmp_path):
    seen = []
    monkeypatch.setattr(run_notebook, "_execute", lambda name, ipynb, params, *a: seen.append(
        params) or 1)
    monkeypatch.chdir(tmp_path)  # elsewhere: the value is still the repository's build/x
    assert run_notebook.run("02_gemm_roofline", "smoke", {"scratch": "build/x"}) == 1
    assert seen[0]["scratch"] == str((repo / "build" / "x").resolve())


@pytest.mark.parametrize("out, says", [
    ("results/site", "resolves into results/"), ("/tmp/site-elsewhere", "outside the repository"),
    ("../site", "outside the repository"), ("figures", "resolves into figures/"),
])
def test_site_out_outside_the_repository_is_refused(repo, capsys, out, says):
    before = tree(repo)
    line = one_line(capsys, 2, ["site", "--out", out])
    assert f"--out {out}:" in line and says in line, line
    assert tree(repo) == before and not Path("/tmp/site-elsewhere").exists()


def test_a_symlink_out_of_the_repository_is_followed_and_refused(repo, capsys, tmp_path):
    (tmp_path / "outside").mkdir()
    (repo / "build").mkdir()
    (repo / "build" / "link").symlink_to(tmp_path / "outside")
    line = one_line(capsys, 2, ["site", "--out", "build/link/site"])
    assert "outside the repository" in line and not list((tmp_path / "outside").iterdir())


@pytest.mark.parametrize("command", [["claims"], ["status"], ["site"], ["claims", "--json"],
                                     ["record", "gemm", "--profile", "smoke"]])
def test_a_missing_repro_root_is_one_line_not_an_empty_repository(tmp_path, monkeypatch,
                                                                  capsys, command):
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path / "nonexistent" / "dir"))
    monkeypatch.delenv("REPRO_VERDICTS", raising=False)
    line = one_line(capsys, 2, command)
    assert f"REPRO_ROOT={tmp_path / 'nonexistent' / 'dir'}: no such folder" in line
    assert not (tmp_path / "nonexistent").exists()  # `repro site` created it before
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path / "afile"))
    assert "not a folder" in one_line(capsys, 2, command)
    # an existing folder that is no checkout: not a project with nothing measured either
    (tmp_path / "other").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path / "other"))
    assert f"REPRO_ROOT={tmp_path / 'other'}: not a checkout of this repository (no " \
        "params.yaml, results/ in it)" in one_line(capsys, 2, command)
    assert list((tmp_path / "other").iterdir()) == []


SEGMENT = st.sampled_from(["..", ".", "build", "results", "figures", "x", "verdicts", "metrics",
                           "", "build/..", "/", "~"])


@PROPERTY
@given(st.lists(SEGMENT, min_size=1, max_size=5), st.sampled_from([None, "build"]))
def test_a_resolved_path_is_inside_and_out_of_committed_folders_or_refused(tmp_path_factory,
                                                                           parts, under):
    root = tmp_path_factory.getbasetemp() / "prop-root"
    value = "/".join(parts)
    try:
        path = inside_repository(f"-p scratch={value}", value, root, under=under,
                                 relative_to=root)
    except ValueError as e:
        assert str(e).startswith(f"-p scratch={value}: ") and "\n" not in str(e)
        return
    base = (root / under if under else root).resolve()
    assert path.is_relative_to(base), (value, path)
    assert not any(path.is_relative_to(root.resolve() / c) for c in COMMITTED), (value, path)


# ------------------------------------------------------------------ records and their place

import json  # noqa: E402

from repro import evidence, results  # noqa: E402
from repro.results import RecordError  # noqa: E402

GEMM_CELL = sorted((ROOT / "results" / "h200" / "gemm").glob("*.json"))[0]


def committed_records() -> list[dict]:
    return json.loads(GEMM_CELL.read_text())


@pytest.fixture
def records_root(repo):
    return repo / "results"


def put(root: Path, rel: str, data) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def every_reader_names(path: Path, root: Path, says: str, capsys, monkeypatch):
    """load_records, stale_cells (`repro status`) and read_cell (`repro record`'s resume)
    each refuse the file in one line naming it."""
    hw, exp, cell = path.relative_to(root).with_suffix("").parts
    for read in (lambda: evidence.load_records(roots=root), lambda: evidence.stale_cells(root),
                 lambda: results.read_cell(exp, cell, hw, root)):
        with pytest.raises(RecordError) as e:
            read()
        assert str(e.value).startswith(f"{path}: ") and says in str(e.value), str(e.value)
        assert "\n" not in str(e.value)
    line = one_line(capsys, 2, ["status"])
    assert str(path) in line and says in line


def test_a_record_of_another_gpu_under_h200_is_refused(records_root, capsys, monkeypatch):
    recs = committed_records()
    recs[1]["hardware"] = "b200"
    path = put(records_root, f"h200/gemm/{GEMM_CELL.name}", recs)
    every_reader_names(path, records_root, "says hardware 'b200', but the file is under h200/",
                       capsys, monkeypatch)


def test_a_record_of_another_experiment_is_refused(records_root, capsys, monkeypatch):
    path = put(records_root, "h200/mlp_step/x.json", committed_records())
    every_reader_names(path, records_root, "says experiment 'gemm', but the file is under "
                       "h200/mlp_step/", capsys, monkeypatch)


@pytest.mark.parametrize("data, says", [(None, "holds no records (null)"),
                                        ([], "holds no records ([])")])
def test_an_empty_record_file_is_named(records_root, capsys, monkeypatch, data, says):
    path = put(records_root, "h200/gemm/empty.json", data)
    every_reader_names(path, records_root, says, capsys, monkeypatch)


@pytest.mark.parametrize("target", ["outside", "inside"])
def test_a_record_that_is_a_symbolic_link_is_refused(records_root, tmp_path, capsys,
                                                     monkeypatch, target):
    real = put(tmp_path if target == "outside" else records_root,
               "h200/gemm/real.json" if target == "inside" else "elsewhere/real.json",
               committed_records())
    path = records_root / "h200" / "gemm" / "link.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(real)
    every_reader_names(path, records_root, f"a symbolic link to {real}", capsys, monkeypatch)


def test_a_folder_linked_out_of_the_records_is_refused(records_root, tmp_path):
    put(tmp_path, "elsewhere/gemm/a.json", committed_records())
    (records_root / "h200").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RecordError, match="a symbolic link"):
        evidence.load_records("gemm", roots=records_root)


def test_the_committed_records_are_each_at_their_place():
    from repro.experiments.rl_quality.measure import QUALITY_REPEAT

    assert results.SHARED_FOLDERS == {QUALITY_REPEAT: "rl_quality"}
    for path in (ROOT / "results").glob("*/*/*.json"):
        results.read_cell_file(path, ROOT / "results")


@PROPERTY
@given(st.sampled_from(["h200", "b200", "cpu"]), st.sampled_from(["h200", "b200", "cpu", None]),
       st.sampled_from(["gemm", "mlp_step", "rl_quality_repeat"]),
       st.sampled_from(["gemm", "mlp_step", "rl_quality", None]))
def test_a_record_file_is_read_only_at_its_place(tmp_path_factory, hw_dir, hw, exp_dir, exp):
    root = tmp_path_factory.mktemp("place")
    rec = {**committed_records()[0], "hardware": hw, "experiment": exp}
    path = put(root, f"{hw_dir}/{exp_dir}/c.json", [rec])
    fits = hw == hw_dir and (exp is None or exp == exp_dir or
                             (exp_dir, exp) == ("rl_quality_repeat", "rl_quality"))
    try:
        assert results.read_cell_file(path, root) == [rec] and fits
    except RecordError as e:
        assert not fits and str(e).startswith(f"{path}: record 0"), str(e)


# ------------------------------------------------------------------- params.yaml, strictly

from repro import config, pipeline, studies  # noqa: E402
from repro.config import ConfigError  # noqa: E402

PARAMS = (ROOT / "params.yaml").read_text()


def params_error(tmp_path, text: str) -> str:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        raw = config.load_params(path)
        for name in studies.EXPERIMENTS:
            studies.check_params(name, raw)
        for name in config.NOTEBOOK_SCHEMAS:
            for profile in ("smoke", "full"):
                config.stage_params(name, profile, raw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_params_sections_are_those_of_the_studies_and_the_notebooks():
    from_studies = {studies.study(n).params_section for n in studies.EXPERIMENTS} - {None}
    from_notebooks = {s for _, sections in pipeline.STAGES.values() for s in sections}
    assert set(config.SECTIONS) == from_studies | from_notebooks
    assert set(config.NOTEBOOK_SCHEMAS) == from_notebooks - from_studies


@pytest.mark.parametrize("text, says", [
    (PARAMS.replace("profile: smoke\n", "profile: smoke\nprofile: full\n"),
     "params.yaml: profile: duplicate key (lines 3 and 4)"),
    (PARAMS.replace("    repeats: 3\n", "    repeats: 3\n    repeats: 4\n", 1),
     "params.yaml: repeats: duplicate key"),
    (PARAMS.replace("profile: smoke\n", "profile: smoke\nprofle: full\n"),
     "params.yaml: profle: unknown key (did you mean 'profile'?)"),
    (PARAMS + "gemm_extra: {smoke: {}}\n", "params.yaml: gemm_extra: unknown key"),
    (PARAMS.replace("    repeats: 3\n", "    repeats: 100000000000000000000\n", 1),
     "gemm.smoke.repeats: 100000000000000000000 is out of range: expected an integer in "
     "[-2147483648, 2147483647]"),
    (PARAMS.replace("common: {n_samples: 20000}", "common: {n_samples: -5}"),
     "params.yaml: formats.common.n_samples: must be > 0, got -5 (an integer in [1, "),
    (PARAMS.replace("common: {n_samples: 20000}", "common: {n_sample: 5}"),
     "params.yaml: formats.common.n_sample: unknown key (did you mean 'n_samples'?)"),
    (PARAMS.replace("perfmodel: {smoke: {}, full: {}}", "perfmodel: {smoke: {model: 1}, full: {}}"),
     "params.yaml: perfmodel.smoke.model: unknown key"),
    (__import__("yaml").safe_dump({**__import__("yaml").safe_load(PARAMS), "gemm": [1, 2]}),
     "params.yaml: gemm: expected a mapping of common/smoke/full sub-sections, got list"),
    (PARAMS.replace("profile: smoke\n", "profile: smoke\nseed: 0\n"),
     "params.yaml: seed: unknown key"),  # no notebook or study reads a global seed
])
def test_params_yaml_is_read_strictly(tmp_path, text, says):
    assert says in params_error(tmp_path, text)


def test_an_unknown_key_deep_in_a_section_is_refused_naming_it(tmp_path):
    from repro.studies import runner

    path = tmp_path / "params.yaml"
    path.write_text(PARAMS.replace("ppo: {num_envs: 4,", "ppo: {num_env: 4, num_envs: 4,"))
    p = studies.params("rl_quality", "smoke", config.load_params(path))
    with pytest.raises(ValueError, match=r"the PPO config of ppo .*unknown PPO config key\(s\) "
                       r"\['num_env'\]"):
        runner.plan(studies.study("rl_quality"), p)


def test_the_committed_params_yaml_passes():
    raw = config.load_params(ROOT / "params.yaml")
    for name in config.NOTEBOOK_SCHEMAS:
        assert config.stage_params(name, "smoke", raw)["profile"] == "smoke"


KEY = st.sampled_from(["profile", "gemm", "formats", "repeats", "smoke", "x"])


@PROPERTY
@given(st.lists(st.tuples(KEY, st.integers(0, 3)), min_size=1, max_size=6))
def test_a_mapping_with_a_key_twice_is_refused_naming_it(tmp_path_factory, pairs):
    path = tmp_path_factory.mktemp("dup") / "params.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in pairs))
    keys = [k for k, _ in pairs]
    dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    try:
        config.load_params(path)
    except ConfigError as e:
        if dup is not None:
            assert str(e).startswith(f"params.yaml: {dup}: duplicate key"), str(e)
        else:
            assert "duplicate" not in str(e)
        return
    assert dup is None and set(keys) <= set(config.TOP_LEVEL)


# --------------------------------------------------------------- selections must select


def test_a_recipe_no_cell_runs_is_refused_naming_the_recipes_that_would_match(repo, capsys):
    line = one_line(capsys, 2, ["record", "rl_throughput", "--recipe", "jax-nvfp4",
                                "--profile", "smoke"])
    assert "--recipe jax-nvfp4 runs on the jax backend, which the PPO networks do not take; " \
           "recipes of its cells: fp16, fp8-delayed" in line, line
    assert not (repo / "build").exists()
    line = one_line(capsys, 2, ["record", "gemm", "--recipe", "fp8-delayed",
                                "--profile", "smoke"])
    assert "unknown GEMM recipe(s) fp8-delayed; valid recipes: fp32, tf32" in line, line


def test_a_recipe_some_cell_runs_selects_it_and_the_recipe_free_cells():
    from repro.studies import runner

    p = studies.params("rl_throughput", "smoke")
    chosen, _ = runner.plan(studies.study("rl_throughput"), p, recipes=["fp16"])
    names = [c.name for c in chosen]
    assert "stores" in names and any("fp16" in n for n in names)
    assert not any("bf16" in n for n in names)


# ------------------------------------------------------------------------------- faults


def test_an_interrupted_notebook_does_not_claim_to_resume(repo, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_notebook, "_execute", interrupted)
    assert cli.main(["notebook", "02_gemm_roofline", "--profile", "smoke"]) == 130
    err = capsys.readouterr().err
    assert "resume" not in err.replace("does not resume", "") and "unchanged" in err, err
    assert not (repo / "build" / "notebooks" / "02_gemm_roofline.staged").exists()
    assert "rerun the same command to resume" in cli.interrupted_message("record")


def test_records_are_written_with_the_users_umask(tmp_path):
    import os

    rec = committed_records()[0]
    old = os.umask(0o022)
    try:
        path = results.write_records([rec], "gemm", "a", root=tmp_path)
        assert path.stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        path = results.write_records([rec], "gemm", "b", root=tmp_path)
        assert path.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


# ------------------------------------------------------ an unreadable params.yaml is named


@pytest.mark.parametrize("garbage, says", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00", "not UTF-8 text: byte 0x89 at line 1, column 1"),
    (b"profile: smoke\ngemm: {smoke: {repeats: 3}\n\x00\x00",
     "not YAML text: character '\\x00' at line 3, column 1")])
def test_status_and_every_loader_name_an_unreadable_params_yaml(repo, capsys, garbage, says):
    """Records whose programs hash their params.yaml section cannot be checked against a
    params.yaml that cannot be read: `repro status` and the loaders stop, naming the file and
    the position, instead of calling every such record stale."""
    (repo / "params.yaml").write_bytes(garbage)
    program_cell = ROOT / "results" / "h200" / "gemm" / "16384x16384x16384.json"
    assert "params.yaml#gemm" in json.loads(program_cell.read_text())[0]["program"]["files"]
    put(repo / "results", "h200/gemm/16384x16384x16384.json",
        json.loads(program_cell.read_text()))
    line = one_line(capsys, 2, ["status"])
    assert line.startswith(f"repro: error: {repo / 'params.yaml'}: {says} ("), line
    for load in (lambda: evidence.load_records("gemm"), lambda: evidence.stale_cells()):
        with pytest.raises(config.ConfigError, match=f"params.yaml: {re.escape(says)}"):
            load()
