"""The code lints clean: `ruff check` with the repository's configuration (pyproject.toml:
syntax errors and pyflakes' checks) finds nothing in the package, tests, notebooks or scripts."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("repro", "tests", "notebooks", "scripts")


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing():
    r = ruff(*FOLDERS)
    assert "No module named ruff" not in r.stderr, "ruff is missing: pip install '.[test]'"
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_fails_on_an_unused_import(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "x.py").write_text("import os\n")
    r = ruff("x.py", cwd=tmp_path)
    assert r.returncode == 1 and "F401" in r.stdout, r.stdout + r.stderr
