"""The experiment catalogue (repro/catalogue.py) is the one list of experiments and notebooks:
every other list is derived from it, and each part an entry names exists."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro import catalogue, config, pipeline, provenance, results, studies
from repro.experiments.kernel_times import measure as kernel_times
from repro.perfmodel import measured
from repro.precision.recipes import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "repro" / "catalogue.py"
SCANNED = ("repro", "notebooks", "scripts")

NAMES = frozenset({e.name for e in catalogue.EXPERIMENTS}
                  | {f for e in catalogue.EXPERIMENTS for f in e.folders})
NOTEBOOK_NAMES = frozenset(n.name for n in catalogue.NOTEBOOKS)


def hand_kept(source: str) -> list[tuple[int, list[str]]]:
    """(line, names) of each list, tuple, set or dict literal of ``source`` that holds two or
    more experiment names, or two or more notebook names, as string constants."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None] + node.values
        else:
            continue
        strings = [x.value for x in items if isinstance(x, ast.Constant)
                   and isinstance(x.value, str)]
        for names in (NAMES, NOTEBOOK_NAMES):
            hits = [s for s in strings if s in names]
            if len(hits) >= 2:
                found.append((node.lineno, hits))
    return found


def test_the_scan_finds_a_list_kept_by_hand():
    assert hand_kept('ORDER = ("gemm", "rl_quality")\n') == [(1, ["gemm", "rl_quality"])]
    assert hand_kept('def f():\n    return {"legged": 1, "lm": 2}\n')[0][1] == ["legged", "lm"]
    assert hand_kept('NB = ["01_formats", "12_grpo"]\n')[0][1] == ["01_formats", "12_grpo"]
    assert hand_kept('ONE = ("gemm",)\nNOT = ("mlp", "ppo")\n') == []


def test_no_list_of_experiment_or_notebook_names_is_kept_by_hand():
    """Outside repro/catalogue.py, experiment and notebook names are read from the
    catalogue."""
    found = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == HOME:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {hits}"
                      for line, hits in hand_kept(path.read_text())]
    assert not found, "lists of names kept by hand (derive them from repro.catalogue):\n" \
        + "\n".join(found)


def test_every_list_is_derived_from_the_catalogue():
    recorded = [e.name for e in catalogue.EXPERIMENTS if e.recorded]
    assert list(studies.EXPERIMENTS) == recorded
    assert set(studies.TRACES) == {e.name for e in catalogue.EXPERIMENTS if not e.recorded}
    assert studies.RECORDED_BY == results.SHARED_FOLDERS == {"rl_quality_repeat": "rl_quality"}
    assert [nb for nb, _ in pipeline.STAGES.values()] == [n.name for n in catalogue.NOTEBOOKS]
    assert provenance.QUALITY_EXPERIMENTS == {"rl_quality", "rl_quality_repeat", "lm"}
    assert {"final_return", "eval_loss", "heldout_accuracy"} <= provenance.QUALITY_METRICS
    assert "env_steps_per_s" not in provenance.QUALITY_METRICS
    assert measured.WORKLOADS == {"mlp_step": "mlp", "lm_step": "lm"}
    assert kernel_times.WORKLOADS[:4] == ("mlp", "lm", "gemm", "ppo")
    assert set(config.SECTIONS) == {s for n in catalogue.NOTEBOOKS for s in n.params} \
        | set(recorded)


def test_each_part_an_entry_names_exists():
    for e in catalogue.EXPERIMENTS:
        assert e.study == f"repro.experiments.{e.name}.measure", e.name
        study = importlib.import_module(e.study).STUDY
        assert study.experiment == e.name, e.name
        for module in e.owned:
            assert importlib.util.find_spec(module) is not None, (e.name, module)
        assert e.notebook in NOTEBOOK_NAMES, e.name
    on_disk = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py")}
    assert on_disk == NOTEBOOK_NAMES
    stages = [n.stage for n in catalogue.NOTEBOOKS]
    assert len(set(stages)) == len(stages)


def test_the_catalogue_imports_no_experiment_code():
    """``repro.catalogue`` is data (any module may import it): no study, table or rule, no
    other module of the package, and no JAX."""
    code = ("import sys; from repro import catalogue; "
            "print(' '.join(m for m in sys.modules if m.startswith(('repro', 'jax'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert set(out) == {"repro", "repro.catalogue"}, out


def test_every_records_folder_belongs_to_an_experiment():
    folders = {p.name for p in (ROOT / "results").glob("*/*") if p.is_dir()} - {"programs"}
    assert folders <= NAMES, folders - NAMES


def test_get_names_the_valid_experiments():
    assert catalogue.get("legged").study == "repro.experiments.legged.measure"
    with pytest.raises(ValueError, match="valid experiments: gemm, mlp_step"):
        catalogue.get("nope")
    assert catalogue.get("rl_throughput").source("a", "b") == "results/*/rl_throughput (a, b)"


# ------------------------------------------------------------------- claims

def rule_studies() -> dict[str, set[str]]:
    """experiment -> the claims whose rule in repro/data/claims.yaml judges its records."""
    data = yaml.safe_load((ROOT / "repro" / "data" / "claims.yaml").read_text())
    out: dict[str, set[str]] = {}
    for claim, spec in data.items():
        for study in (spec.get("rule") or {}).get("studies") or ():
            out.setdefault(study, set()).add(claim)
    return out


# Where a study says it serves claims that claims.yaml's rules do not judge from its records,
# or the other way round. Each entry is a known difference, kept so that a new one fails:
# the records carry their study's claims, so changing a study's list would change what new
# records say. (study's extra claims, rules' extra claims)
KNOWN = {
    # the GEMM sweep and the MLP step are A2/A4 context (notebooks 02 and 07); A2 and A4 are
    # decided from rl_throughput in notebook 03
    "gemm": ({"A2"}, set()),
    "mlp_step": ({"A2", "A4"}, {"B2"}),
    # A3 is a projection from rl_throughput's measured ratios
    "rl_throughput": (set(), {"A3"}),
    # B1 (formats) and B2 (the step model) read lm records besides B3 and B4
    "lm": (set(), {"B1", "B2"}),
    # the PureJaxRL comparison checks our PPO's speed; no rule reads it
    "rl_purejaxrl": ({"A2"}, set()),
}


def test_claims_yaml_decides_which_records_a_claim_reads():
    """Study.claims against the rules' ``studies`` in claims.yaml (the one source): every
    difference is one of KNOWN."""
    by_rule = rule_studies()
    for e in catalogue.EXPERIMENTS:
        mine = set(importlib.import_module(e.study).STUDY.claims)
        judged = set().union(by_rule.get(e.name, set()),
                             *(by_rule.get(f, set()) for f in e.folders))
        assert (mine - judged, judged - mine) == KNOWN.get(e.name, (set(), set())), e.name
    assert set(by_rule) <= NAMES, set(by_rule) - NAMES


def test_recipe_claims_are_claims():
    claims = set(yaml.safe_load((ROOT / "repro" / "data" / "claims.yaml").read_text()))
    for name, recipe in REGISTRY.items():
        assert set(recipe.claims) <= claims, (name, recipe.claims)
