"""The package is built in floors, and an experiment's modules import no other experiment's.

Every import of every module under repro/ is read from its syntax tree, lazy imports inside
functions included. A module may import from its own floor and the floors below it:

    ground    what every floor uses and that imports nothing above it: the experiment
              catalogue, the checkout (paths, git), code fingerprints, run conditions,
              hardware, the verdict vocabulary, the configuration checker, markdown and
              plot style
    precision recipes, formats, ops, layers
    config    params.yaml, typed and checked (recipe names against the precision registry)
    models    the networks, PPO, GRPO, the LM and its data
    store     the records' store (results), program fingerprints and the staleness checker
    studies   the studies' registry, runner and measuring kit; each experiment's measure.py
              and its other helper modules
    evidence  the records loaded and judged fresh or stale (the one loader)
    analysis  tables from records (each experiment's tables.py); the performance model
    claims    verdict rules (each experiment's rules.py, the rules index), staleness notes,
              registration, the ledger
    top       the command line, notebooks' helpers, the pipeline, the site, refresh plans

An experiment's modules (every module of its package, ``repro/experiments/<name>/``) import
no module of another experiment; shared helpers live outside the packages
(``repro.analysis.rl``, ``repro.studies.measures``...). ALLOWED lists the exceptions, each
with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repro import catalogue

ROOT = Path(__file__).resolve().parent.parent

FLOORS = ("ground", "precision", "config", "models", "store", "studies", "evidence",
          "analysis", "claims", "top")
# module prefix -> floor; the longest matching prefix decides
PLACES = {
    "repro": "ground",  # the package itself, and the small helpers (markdown, plot style)
    "repro.experiments": "ground",  # the package's docstring; an experiment's: PART_FLOORS
    "repro.catalogue": "ground",
    "repro.checkout": "ground",
    "repro.fingerprint": "ground",
    "repro.conditions": "ground",
    "repro.hardware": "ground",
    "repro.verdict": "ground",
    "repro.schema": "ground",
    "repro.precision": "precision",
    "repro.config": "config",
    "repro.models": "models",
    "repro.results": "store",
    "repro.record_checks": "store",
    "repro.program": "store",
    "repro.provenance": "store",
    "repro.studies": "studies",
    "repro.evidence": "evidence",
    "repro.analysis": "analysis",
    "repro.perfmodel": "analysis",
    "repro.claims": "claims",
    "repro.cli": "top",
    "repro.notebook": "top",
    "repro.run_notebook": "top",
    "repro.pipeline": "top",
    "repro.record_reads": "top",
    "repro.site": "top",
    "repro.refresh": "top",
    "repro.tables": "top",
}

# an experiment package's module (repro.experiments.<name>.<part>) -> its floor; any other
# part (measure, a study's helper) sits on the studies floor
PART_FLOORS = {"tables": "analysis", "rules": "claims"}
PACKAGES = frozenset(p.parent.name for p in (ROOT / "repro" / "experiments").glob("*/measure.py"))

_STUDIES_KERNEL_TIMES = "repro.experiments.kernel_times.measure"
# (importer, imported): why the import crosses a floor or an experiment
ALLOWED = {
    # rl_quality records the device's peak memory with rl_throughput's helper. Moving it
    # would change rl_throughput's measure.py, a file its TPU records' programs ran: traced
    # under that platform's JAX, they cannot be traced again here and would turn stale.
    ("repro.experiments.rl_quality.measure", "repro.experiments.rl_throughput.measure"):
        "_device_peak_bytes",
    # `repro trace` traces other experiments' steps as their studies build them: by design a
    # tool over those experiments (its records say which step they measured)
    (_STUDIES_KERNEL_TIMES, "repro.experiments.gemm.measure"): "repro trace gemm",
    (_STUDIES_KERNEL_TIMES, "repro.experiments.mlp_step.measure"): "repro trace mlp",
    (_STUDIES_KERNEL_TIMES, "repro.experiments.lm_step.measure"): "repro trace lm",
    (_STUDIES_KERNEL_TIMES, "repro.experiments.rl_throughput.measure"): "repro trace ppo",
    (_STUDIES_KERNEL_TIMES, "repro.experiments.inference.measure"): "repro trace inference",
    (_STUDIES_KERNEL_TIMES, "repro.experiments.inference.speed"): "repro trace inference",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(path: Path) -> set[str]:
    """The repro modules ``path`` imports, anywhere in it (``from M import f``: M;
    ``from P import m`` where m is a module: P.m)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base)
    return {m for m in out if m == "repro" or m.startswith("repro.")}


def package(module: str) -> tuple[str, str] | None:
    """(experiment, part) of a module of an experiment's package
    (``repro.experiments.<experiment>.<part>``; the part ``""`` for the package itself)."""
    parts = module.split(".")
    if parts[:2] == ["repro", "experiments"] and len(parts) >= 3 and parts[2] in PACKAGES:
        return parts[2], ".".join(parts[3:])
    return None


def floor(module: str) -> str:
    if (found := package(module)) is not None:
        return PART_FLOORS.get(found[1], "shared" if found[1] == "" else "studies")
    for prefix in sorted(PLACES, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return PLACES[prefix]
    raise AssertionError(f"{module} has no floor: add it to PLACES")


def owners(module: str) -> set[str]:
    """The experiment whose package holds ``module``."""
    found = package(module)
    return {found[0]} if found and found[1] != "" else set()


def allowed(importer: str, imported: str) -> bool:
    return any((importer, b) in ALLOWED for b in (imported, *_parents(imported)))


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def violations(edges: set[tuple[str, str]]) -> list[str]:
    out = []
    for a, b in sorted(edges):
        if allowed(a, b):
            continue
        if FLOORS.index(floor(b)) > FLOORS.index(floor(a)):
            out.append(f"{a} ({floor(a)}) imports {b} ({floor(b)}): a higher floor")
        mine, theirs = owners(a), owners(b)
        if mine and theirs and not mine & theirs:
            out.append(f"{a} ({', '.join(sorted(mine))}) imports {b} "
                       f"({', '.join(sorted(theirs))}): another experiment's module")
    return out


def all_edges() -> set[tuple[str, str]]:
    return {(module_name(p), m) for p in sorted((ROOT / "repro").rglob("*.py"))
            for m in imports(p) if m != module_name(p)}


def test_the_check_fails_on_an_upward_import_and_a_cross_experiment_one():
    legged, quality = "repro.experiments.legged", "repro.experiments.rl_quality"
    assert violations({(f"{legged}.tables", f"{legged}.rules")}) == [
        f"{legged}.tables (analysis) imports {legged}.rules (claims): a higher floor"]
    assert violations({(f"{legged}.measure", f"{legged}.tables")}) == [
        f"{legged}.measure (studies) imports {legged}.tables (analysis): a higher floor"]
    assert violations({(f"{legged}.measure", f"{quality}.measure")}) == [
        f"{legged}.measure (legged) imports {quality}.measure (rl_quality): another "
        "experiment's module"]
    assert violations({(f"{legged}.rules", f"{quality}.rules")}) == [
        f"{legged}.rules (legged) imports {quality}.rules (rl_quality): another "
        "experiment's module"]
    speed, grpo = "repro.experiments.inference.speed", "repro.experiments.grpo.tables"
    assert violations({(speed, grpo)}) == [
        f"{speed} (studies) imports {grpo} (analysis): a higher floor",
        f"{speed} (inference) imports {grpo} (grpo): another experiment's module"]
    assert violations({(f"{legged}.measure", "repro.studies.measures"),
                       (f"{legged}.rules", "repro.analysis.rl"),
                       (f"{legged}.rules", f"{legged}.tables"),
                       (f"{legged}.rules", "repro.catalogue")}) == []
    assert violations({("repro.config", "repro.precision.recipes")}) == []  # a floor below
    assert violations({("repro.provenance", "repro.studies")}) == [
        "repro.provenance (store) imports repro.studies (studies): a higher floor"]


def test_every_experiment_module_sits_in_its_package():
    """The modules an experiment's entry names (``Experiment.owned``) are its package's, and
    its package holds no module that its entry does not name."""
    for e in catalogue.EXPERIMENTS:
        assert e.name in PACKAGES, e.name
        assert all(owners(m) == {e.name} for m in e.owned), e.owned
        held = {module_name(p) for p in (ROOT / "repro" / "experiments" / e.name).glob("*.py")}
        pkg = f"repro.experiments.{e.name}"
        assert held - set(e.owned) == {pkg}, (e.name, held - set(e.owned))
    assert PACKAGES == {e.name for e in catalogue.EXPERIMENTS}


def test_imports_reads_lazy_imports():
    path = ROOT / "repro" / "experiments" / "kernel_times" / "measure.py"
    found = imports(path)
    assert "repro.experiments.gemm.measure" in found  # imported inside a function
    assert "repro.studies.kernel_trace" in found
    assert "repro.precision.export" in found  # `from repro.precision import export`


def test_no_import_goes_up_a_floor_or_into_another_experiment():
    found = violations(all_edges())
    assert not found, "\n".join(found)


def test_every_allowed_exception_is_still_needed():
    edges = all_edges()
    for a, b in ALLOWED:
        assert any(x == a and (y == b or y.startswith(b + ".")) for x, y in edges), (a, b)
