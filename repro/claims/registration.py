"""Was a claim's rule fixed before its data? Checked from git.

A claim's rule is its ``rule`` in ``repro/data/claims.yaml`` and its verdict function
(``repro.claims.verdicts``, the function named after the claim; it lives in an experiment's
``rules.py`` or in the verdicts package). :func:`registered` walks the repository's history and
finds the last commit that changed either: the claim's entry (less its statement, notebook and
``first_registered``) or the function's normalized source (its AST without the docstring,
wherever in the verdict modules it lives, so moving it is no change). Commits listed in
``repro/data/rule_restatements.yaml`` restate rules without changing what they decide (a rule
moved from code into data) and do not count as a change.

:func:`check` compares that commit's date with the claim's first data: the earlier of the
first record the verdict uses and the first commit that added records of its studies (data
seen before, even if re-recorded since), or of the files its rule's ``data`` names where it
names them (a claim about one hardware and recipe: ``results/tpu-v5e/rl_throughput/*int8*``). A rule changed after its data is allowed; the verdict
then says so and shows the verdict under the rule as registered before the data
(:func:`judged`): the claim's ``first_registered`` rule, or its ``rule`` at the last commit
before the data. Without the history (no git, a shallow clone) nothing is claimed:
``preregistered`` is ``"unknown"`` and the verdict says "registration not checked".

    v = registration.judged(verdicts.a4, "A4", mem, records=df)
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import subprocess
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import yaml

CLAIMS_PATH = "repro/data/claims.yaml"
RESTATEMENTS_PATH = "repro/data/rule_restatements.yaml"
# where the verdict functions live: the verdicts package (formerly one module) and each
# experiment's rules (repro/experiments/<name>/rules.py)
VERDICT_PATHS = ("repro/claims/verdicts", "repro/claims/verdicts.py",
                 ":(glob)repro/experiments/*/rules.py")
RULES_DIR, RULES_FILE = "repro/experiments/", "/rules.py"
# an entry's keys that are not its rule; ``ledger`` names the recorded cells where the rule's
# config is found (repro.claims.ledger_set), which the rule itself states
NOT_RULE = ("claim", "notebook", "first_registered", "ledger", "kind")


def _root(root: Path | str | None) -> Path:
    from repro.results import repo_root

    return Path(root) if root is not None else repo_root()


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def history_available(root: Path | str | None = None) -> bool:
    """Whether ``root`` has its whole git history (not a shallow clone, not an export)."""
    shallow = _git(_root(root), "rev-parse", "--is-shallow-repository")
    return shallow is not None and shallow.strip() == "false"


def _normalized(node: ast.FunctionDef) -> str:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(
            getattr(body[0], "value", None), ast.Constant) and isinstance(
            body[0].value.value, str):
        body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def _functions(sources: dict[str, str], names: frozenset[str] | None = None
               ) -> dict[str, str]:
    """The top-level functions of ``sources`` (path -> text), those of ``names`` where
    given: name -> its normalized source (the first definition of a name, in the order of
    ``sources``)."""
    out: dict[str, str] = {}
    for text in sources.values():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name not in out and (
                    names is None or node.name in names):
                out[node.name] = _normalized(node)
    return out


def _function_source(sources: dict[str, str], name: str) -> str | None:
    """The normalized source of function ``name`` in any of ``sources`` (path -> text): its
    AST without the docstring, so comments, layout and docs do not count as a change."""
    return _functions(sources).get(name)


@functools.lru_cache(maxsize=8)
def _commits(root: Path) -> tuple[tuple[str, str], ...]:
    """(commit, committer date) of every commit that touched the rules' files, oldest first."""
    out = _git(root, "log", "--first-parent", "--reverse", "--format=%H %cI", "--",
               CLAIMS_PATH, *VERDICT_PATHS)
    return tuple(tuple(line.split(" ", 1)) for line in (out or "").splitlines() if line)


@functools.lru_cache(maxsize=4096)
def _state(root: Path, commit: str) -> tuple[dict[str, Any], dict[str, str]]:
    """claims.yaml and the verdict modules' sources at ``commit``."""
    claims = yaml.safe_load(_git(root, "show", f"{commit}:{CLAIMS_PATH}") or "{}") or {}
    names = _git(root, "ls-tree", "-r", "--name-only", commit, "--", *VERDICT_PATHS[:2],
                 RULES_DIR) or ""
    sources = {p: _git(root, "show", f"{commit}:{p}") or ""
               for p in names.split() if p.endswith(".py") and (
                   not p.startswith(RULES_DIR) or p.endswith(RULES_FILE))}
    return claims, sources


@functools.lru_cache(maxsize=4096)
def _functions_at(root: Path, commit: str) -> dict[str, str]:
    """:func:`_functions` of the verdict modules at ``commit`` named after a claim of its
    claims.yaml, parsed once per commit."""
    claims, sources = _state(root, commit)
    return _functions(sources, frozenset(str(c).lower() for c in claims))


def fingerprint(claim: str, claims: dict[str, Any], sources: dict[str, str],
                functions: dict[str, str] | None = None) -> str:
    """What a change of ``claim``'s rule changes: its entry less :data:`NOT_RULE`, and its
    verdict function's normalized source (``functions``: :func:`_functions` of ``sources``,
    where already parsed)."""
    entry = {k: v for k, v in (claims.get(claim) or {}).items() if k not in NOT_RULE}
    fns = _functions(sources) if functions is None else functions
    return json.dumps([entry, fns.get(claim.lower())], sort_keys=True, default=str)


def restatements(root: Path | str | None = None) -> dict[str, str]:
    """Commits that restate rules without changing them (full or abbreviated hash -> why)."""
    path = _root(root) / RESTATEMENTS_PATH
    return {str(k): str(v) for k, v in (yaml.safe_load(path.read_text()) or {}).items()} \
        if path.is_file() else {}


def registered(claim: str, root: Path | str | None = None) -> dict[str, str] | None:
    """``{"commit", "date"}`` of the last commit that changed ``claim``'s rule (None without
    the history)."""
    root = _root(root)
    if not history_available(root):
        return None
    skip = tuple(restatements(root))

    def fp_at(commit: str) -> str:
        return fingerprint(claim, *_state(root, commit), _functions_at(root, commit))

    def restated(commit: str) -> bool:
        return any(commit.startswith(s) or s.startswith(commit) for s in skip)

    last, prev = None, None
    for commit, date in _commits(root):
        fp = fp_at(commit)
        if fp != prev and not restated(commit):
            # a merge brings the change of the branch it merges: the branch's own commit
            # that last changed the rule to what the merge holds is when it was written
            branch = _in_merged_branch(root, commit, prev, fp, fp_at, restated)
            if branch is None:
                last = {"commit": commit[:7], "date": date}
            elif branch:  # else: the branch only restated the rule
                last = branch
        prev = fp
    return last


def _in_merged_branch(root: Path, merge: str, before: str | None, after: str, fp_at,
                      restated) -> dict[str, str] | None:
    """Where ``merge`` is a merge commit whose rule is its merged branch's: the commit of
    that branch that last changed the rule ({} if the branch only restated it); None
    otherwise."""
    parents = (_git(root, "rev-list", "--parents", "-n", "1", merge) or "").split()[1:]
    if len(parents) < 2 or fp_at(parents[1]) != after:
        return None
    out = _git(root, "log", "--reverse", "--format=%H %cI", f"{parents[0]}..{parents[1]}",
               "--", CLAIMS_PATH, *VERDICT_PATHS) or ""
    last, prev = {}, before
    for line in out.splitlines():
        commit, date = line.split(" ", 1)
        fp = fp_at(commit)
        if fp != prev and not restated(commit):
            last = {"commit": commit[:7], "date": date}
        prev = fp
    return last


def first_data(studies: list[str], records: pd.DataFrame | None,
               root: Path | str | None = None, paths: list[str] | None = None
               ) -> dict[str, str] | None:
    """The claim's first data: the earliest ``timestamp`` of ``records`` (those the verdict
    uses) and the date of the first commit that added records of ``studies`` under
    ``results/`` (or files matching ``paths``, globs from the repository root), whichever is
    earlier: ``{"date", "records_used_from", "committed_from"}``."""
    used = None
    if records is not None and len(records) and "timestamp" in records:
        used = str(pd.to_datetime(records["timestamp"], utc=True).min().isoformat())
    committed = None
    globs = list(paths or [f"results/*/{s}/*" for s in studies])
    if globs and history_available(root):
        out = _git(_root(root), "log", "--first-parent", "--reverse", "--diff-filter=A",
                   "--format=%cI", "--", *globs)
        committed = out.split()[0] if out and out.split() else None
    dates = [d for d in (used, committed) if d]
    if not dates:
        return None
    first = min(dates, key=_utc)
    return {"date": first, "records_used_from": used or "", "committed_from": committed or ""}


def _utc(date: str) -> pd.Timestamp:
    t = pd.Timestamp(date)
    return t.tz_convert("UTC") if t.tzinfo else t.tz_localize("UTC")


def check(claim: str, records: pd.DataFrame | None = None, root: Path | str | None = None,
          claims: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"rule_registered", "first_record", "preregistered"}`` of ``claim``:
    ``preregistered`` is True when the rule's last change precedes its first data, False
    when it follows it, ``"unknown"`` without the history or without data."""
    from repro.verdict import definitions

    claims = definitions() if claims is None else claims
    rule = claims.get(claim, {}).get("rule") or {}
    studies = list(rule.get("studies", []))
    reg = registered(claim, root)
    first = first_data(studies, records, root, rule.get("data"))
    pre: bool | str = "unknown"
    if reg and first:
        pre = bool(_utc(reg["date"]) < _utc(first["date"]))
    return {"rule_registered": reg, "first_record": first, "preregistered": pre}


def rule_before(claim: str, date: str, root: Path | str | None = None,
                claims: dict[str, Any] | None = None) -> tuple[str, str, dict] | None:
    """(commit, date, rule) of ``claim``'s rule as registered before ``date``: its
    ``first_registered`` entry where claims.yaml has one, else its ``rule`` at the last
    commit before ``date`` that had one; None where no rule was written down before."""
    from repro.verdict import definitions

    root = _root(root)
    entry = (definitions() if claims is None else claims).get(claim, {})
    if fr := entry.get("first_registered"):
        when = _git(root, "show", "-s", "--format=%cI", str(fr["commit"])) or ""
        return str(fr["commit"]), when.strip(), fr["rule"]
    best = None
    for commit, when in _commits(root):
        if _utc(when) >= _utc(date):
            break
        rule = (_state(root, commit)[0].get(claim) or {}).get("rule")
        if rule:
            best = (commit[:7], when, rule)
    return best


def _day(date: str) -> str:
    return _utc(date).strftime("%Y-%m-%d")


def judged(fn: Callable[..., Any], claim: str, *args: Any, records: pd.DataFrame | None = None,
           root: Path | str | None = None, claims: dict[str, Any] | None = None,
           **kw: Any):
    """``fn(*args, **kw)`` (a verdict function, under the claim's current rule), its key
    number saying whether that rule was registered before the data and, where it changed
    after them, the verdict under the rule as registered before (the same tables), which its
    ``caveat`` then leads with; its ``numbers`` carry ``registration``."""
    from repro.verdict import definitions

    claims = definitions() if claims is None else claims
    current = claims[claim]["rule"]
    v = fn(*args, rule=current, **kw)
    c = check(claim, records, root, claims)
    reg, first = c["rule_registered"], c["first_record"]
    numbers = dict(v.numbers)
    numbers["registration"] = {"preregistered": {True: 1, False: 0}.get(c["preregistered"], -1)}
    if c["preregistered"] == "unknown":
        said = "registration not checked" + (
            " (no git history)" if reg is None else " (no records)")
        return dataclasses.replace(v, key_number=f"{v.key_number}; {said}", numbers=numbers)
    if c["preregistered"] is True:
        return dataclasses.replace(v, numbers=numbers)
    said = (f"rule changed on {_day(reg['date'])}, after the first record of "
            f"{_day(first['date'])}")
    before = rule_before(claim, first["date"], root, claims)
    if before is None:
        said += "; no rule was written down before it"
        caveat = "rule changed after its data, none written down before"
    else:
        commit, when, rule = before
        old = fn(*args, rule=rule, **kw)
        said += (f"; under the rule as first registered ({commit}"
                 + (f", {_day(when)}" if when else "") + f"): {old.verdict}, {old.key_number}")
        numbers["registration"]["first_rule_verdict"] = old.verdict
        caveat = f"rule changed after its data: {old.verdict} under the rule first registered"
    return dataclasses.replace(v, key_number=f"{v.key_number}; {said}", numbers=numbers,
                               caveat="; ".join(c for c in (caveat, v.caveat) if c))


def table(root: Path | str | None = None, records_of: Callable[[list[str]], pd.DataFrame]
          | None = None) -> dict[str, dict[str, Any]]:
    """:func:`check` of every claim (``repro claims --json``), ``records_of(studies)`` giving
    the records each verdict may use."""
    from repro.verdict import definitions

    out = {}
    for cid, c in definitions().items():
        studies = list((c.get("rule") or {}).get("studies", []))
        out[cid] = check(cid, records_of(studies) if records_of else None, root)
    return out
