"""environment.yml (conda) and pyproject.toml (pip) must declare the same dependencies."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _norm(spec: str) -> str:
    return spec.replace(" ", "").lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_norm(d) for d in project["dependencies"]}
    wanted |= {_norm(d) for d in project["optional-dependencies"]["test"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    have = {_norm(d) for d in pip if not d.startswith("-e")}
    assert have == wanted, {"only in environment.yml": sorted(have - wanted),
                            "only in pyproject.toml": sorted(wanted - have)}


def test_every_notebook_has_a_dvc_stage():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    cmds = " ".join(s["cmd"] for s in stages.values())
    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        assert f"repro notebook {nb.stem} " in cmds, f"{nb.name} has no DVC stage"
