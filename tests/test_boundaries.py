"""Where the `repro` command may read and write: every path a user sets (`-p scratch=`,
`site --out`, REPRO_ROOT) stays inside the repository and out of its committed folders, or is
refused in one line naming it, with nothing written."""

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro import cli, run_notebook
from repro.cli_checks import COMMITTED, UsageError, inside_repository

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
    except UsageError as e:
        assert str(e).startswith(f"-p scratch={value}: ") and "\n" not in str(e)
        return
    base = (root / under if under else root).resolve()
    assert path.is_relative_to(base), (value, path)
    assert not any(path.is_relative_to(root.resolve() / c) for c in COMMITTED), (value, path)
