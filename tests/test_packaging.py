"""Packaging: what the code imports is declared, what is declared is locked at a version it
allows, the lock holds the versions the records were made with, and every installer uses it."""

import ast
import json
import re
import sys
import tomllib
from collections import Counter
from importlib.metadata import packages_distributions
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Extras that need hardware or software the lock does not cover (CUDA, Transformer Engine).
UNLOCKED_EXTRAS = {"cuda", "te"}
# Declared but never imported, each for a reason: command-line tools and plugins.
NOT_IMPORTED = {"dvc": "the pipeline's command", "ipykernel": "the kernel papermill starts",
                "mujoco": "pinned for brax (unpinned: a 4.x metapackage)",
                "mujoco-mjx": "pinned for brax (brax's mjx backend)",
                "pytest-xdist": "pytest -n", "jupyterlab": "the editor (the lab extra)", "orbax-checkpoint": "imported as orbax",
                "ruff": "run as a command (tests/test_lint.py)"}


def lock() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version.strip()
    return out


def declared(with_unlocked: bool = False) -> list[Requirement]:
    specs = list(PROJECT["dependencies"])
    for extra, deps in PROJECT["optional-dependencies"].items():
        if with_unlocked or extra not in UNLOCKED_EXTRAS:
            specs += deps
    return [Requirement(s) for s in specs]


def test_python_312_everywhere():
    assert PROJECT["requires-python"] == ">=3.12"
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.12" in env["dependencies"]
    install = (ROOT / ".ci" / "install").read_text()
    assert "sys.version_info[:2] != (3, 12)" in install


def test_every_declared_dependency_is_locked_at_a_version_it_allows():
    locked = lock()
    for req in declared():
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is declared in pyproject.toml but not locked"
        assert req.specifier.contains(locked[name], prereleases=True), \
            f"requirements.lock has {req.name}=={locked[name]}, pyproject.toml wants {req}"


def test_the_lock_pins_the_versions_the_records_were_made_with():
    seen = {k: Counter() for k in ("jax", "jaxlib", "flax")}
    for path in (ROOT / "results").glob("*/*/*.json"):
        for rec in json.loads(path.read_text()):
            for k in seen:
                seen[k][rec.get(k)] += 1
    locked = lock()
    for k, counts in seen.items():
        assert counts, "no committed records"
        assert locked[k] == counts.most_common(1)[0][0], (k, locked[k], counts)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_what_is_imported_is_declared_and_what_is_declared_is_used():
    files = [*ROOT.glob("repro/**/*.py"), *ROOT.glob("notebooks/*.py"), *ROOT.glob("tests/*.py")]
    local = {"repro", "tests"} | {p.stem for p in (ROOT / "tests").glob("*.py")}
    modules = set().union(*map(_imports, files)) - set(sys.stdlib_module_names) - local
    dists = packages_distributions()
    names = {canonicalize_name(r.name) for r in declared(with_unlocked=True)}
    used = set()
    for mod in sorted(modules):
        provided = {canonicalize_name(d) for d in dists.get(mod, [])}
        if mod == "transformer_engine" and not provided:
            provided = {"transformer-engine"}  # optional: the te extra, not installed here
        assert provided & names, f"{mod} is imported but no pyproject.toml dependency provides it"
        used |= provided
    unused = {n for n in names - used if n not in NOT_IMPORTED}
    assert not unused, f"declared in pyproject.toml but never imported: {sorted(unused)}"


def test_installers_use_the_lock():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert pip == ["-r requirements.lock", "-e ."]
    install = (ROOT / ".ci" / "install").read_text()
    assert re.search(r"pip install .*-r requirements\.lock", install)
    assert re.search(r"pip install .*--no-deps -e \.", install)


def test_every_notebook_has_a_dvc_stage():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    cmds = " ".join(s["cmd"] for s in stages.values())
    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        assert f"repro notebook {nb.stem} " in cmds, f"{nb.name} has no DVC stage"
