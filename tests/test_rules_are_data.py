"""Every threshold, config and recipe choice of a verdict is data in ``repro/data/claims.yaml``
(each claim's ``rule``), never typed in a verdict function: the rules' history is then the
history of that file (``repro.claims.registration``)."""

import ast
from pathlib import Path

import pytest
import yaml

from repro.claims import verdicts as V

VERDICTS = Path(V.__file__).parent
CLAIMS = yaml.safe_load((VERDICTS.parents[1] / "data" / "claims.yaml").read_text())

#: Numbers a verdict function may compare with, and why. Anything else is a threshold, a
#: config or a count that belongs in a claim's rule.
ALLOWED_NUMBERS = {
    0: "nothing (an empty table, no divergence)",
    1: "one (a single row)",
    0.5: "P(X > Y) of no difference: the definition of a win probability",
    0.05: "the share of tied scores is named from 5% on (display only)",
    2: "a t-interval needs two seeds to be shown at all",
}

#: Module constants that hold a recipe name but decide nothing, and why.
ALLOWED_CONSTANTS = {
    "FP8_PREFIX": "quality.py: says in A10's text whether an FP8 variant was checked across "
                  "processes; the verdict does not depend on it",
}


def _names_in_rules() -> set[str]:
    """Every recipe and format name the rules use (the choices that must stay data)."""
    out: set[str] = set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("recipes", "formats", "fp8_formats", "shown", "reference",
                         "references", "baseline", "beats", "default", "pairs", "network",
                         "networks"):
                    walk_names(v)
                elif k in ("ablations", "bytes"):  # {what: recipe}, {format: limit}
                    walk_names(list(v.values()) if k == "ablations" else list(v))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    def walk_names(v):
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, list):
            for x in v:
                walk_names(x)

    for c in CLAIMS.values():
        walk(c.get("rule", {}))
        walk(c.get("first_registered", {}))
    return {n for n in out if "-" in n or n.isalnum()} - {"every variant"}


RULE_NAMES = _names_in_rules()


def typed_choices(source: str) -> list[str]:
    """The thresholds and recipe names ``source`` (a verdict module) types: a number other than
    :data:`ALLOWED_NUMBERS` or a name of :data:`RULE_NAMES` compared with, tested for
    membership, or bound to a module-level name."""
    tree = ast.parse(source)
    found = []

    def constants(node):
        """The constants of ``node``, less the keys it reads (``r["target"]``)."""
        keys = {id(n.slice) for n in ast.walk(node) if isinstance(n, ast.Subscript)}
        for n in ast.walk(node):
            if isinstance(n, ast.Constant) and not isinstance(n.value, bool) \
                    and id(n) not in keys:
                yield n

    def bad(c: ast.Constant) -> bool:
        if isinstance(c.value, (int, float)):
            return c.value not in ALLOWED_NUMBERS
        return isinstance(c.value, str) and c.value in RULE_NAMES

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for c in constants(ast.Tuple(elts=[node.left, *node.comparators], ctx=ast.Load())):
                if bad(c):
                    found.append(f"line {node.lineno}: compares with {c.value!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("isin", "startswith", "index"):
            for a in node.args:
                for c in constants(a):
                    if isinstance(c.value, str) and bad(c):
                        found.append(f"line {node.lineno}: .{node.func.attr}({c.value!r})")
    for node in tree.body:  # module-level constants: thresholds or recipe lists kept in code
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id in ALLOWED_CONSTANTS for t in targets):
                continue
            if any(bad(c) for c in constants(node.value)):
                found.append(f"line {node.lineno}: module constant {ast.unparse(node)[:60]}")
    return found


@pytest.mark.parametrize("module", sorted(p.name for p in VERDICTS.glob("*.py")))
def test_no_threshold_config_or_recipe_is_typed_in_a_verdict_module(module):
    assert typed_choices((VERDICTS / module).read_text()) == []


def test_the_scan_finds_a_typed_threshold_and_a_typed_recipe():
    src = ("TARGET = 1.6\n"
           "def a2(sp):\n"
           "    real = sp[sp.recipe == 'fp8-delayed']\n"
           "    return real.e2e.max() >= 1.6 or sp.baseline.isin(['fp16']).any()\n")
    found = typed_choices(src)
    assert any("1.6" in f and "module constant" in f for f in found)
    assert any("'fp8-delayed'" in f for f in found) and any("'fp16'" in f for f in found)
    assert any("compares with 1.6" in f for f in found)
    # a threshold read from the rule is not typed
    assert typed_choices("def a2(sp, r):\n    return sp.e2e.max() >= r['target']\n") == []


def test_every_claim_has_a_rule_with_its_studies_statistic_and_combination():
    for cid, c in CLAIMS.items():
        r = c.get("rule")
        assert r, f"{cid} has no rule"
        assert r.get("studies") and r.get("statistic") and r.get("combine"), cid
        assert V.rule(cid) == r


def test_best_of_only_where_the_claim_says_up_to_and_then_the_default_is_named():
    """Taking the best of several recipes reads "up to" into a claim; a claim that does not
    say it is judged on one recipe (the others shown beside it, not judged)."""
    for cid, c in CLAIMS.items():
        r = c["rule"]
        if r["combine"] == "best-of":
            assert "up to" in c["claim"], f"{cid} takes the best of several without 'up to'"
            assert r.get("default"), f"{cid} takes the best of several without a default"
        else:
            assert r["combine"] in ("one", "all"), (cid, r["combine"])
