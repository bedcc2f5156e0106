"""A claim's rule through the repository's history, read from git.

A claim's rule at a commit is what decided its verdict there (:func:`version`): its entry in
``repro/data/claims.yaml`` (less its statement, notebook and ``first_registered``) and its code,
either

* a **function**: the verdict function its notebook calls (``verdicts.a8``, ``b4_verdict``...),
  or where no notebook calls one yet, the function named after the claim, with every helper,
  constant and class it reaches in the verdict modules (``repro/claims/verdicts/``,
  ``repro/verdict.py``, ``repro/experiments/*/rules.py``, and the module that defines the
  function), or
* **notebook code**: where the claim's notebook computed the verdict itself, the statements of
  its verdict cells the verdict depends on (a slice ending at the statement that writes it) and
  the notebook's functions they call.

The code is kept as its syntax tree without docstrings or comments (``ast.unparse``), so layout,
comments, docs and moving a function between modules change nothing. :func:`history` lists the
commits where that changed (**events**); :func:`repro.claims.registration` decides which of them
changed what the rule decides, by running both versions on the same inputs (:mod:`rulecode`).

Reading the history needs git and the whole history; :func:`available` says whether ``root``
has both. The reading of git is :mod:`repro.claims.rulegit`'s, the reading of a rule's code
:mod:`repro.claims.rulesource`'s; here the versions, the events and the proofs.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from repro.claims.rulegit import CLAIMS_PATH, NOT_RULE, WORKTREE, Git, available
from repro.claims.rulesource import (Code, _calls, _verdict_functions, free_names,
                                     function_code, notebook_code, notebook_rule)

__all__ = ["CLAIMS_PATH", "WORKTREE", "Code", "Event", "Git", "Version", "available", "build",
           "first_data", "free_names", "history", "prove", "render", "thresholds", "version"]


@dataclasses.dataclass(frozen=True)
class Version:
    """``claim``'s rule at ``commit``: its claims.yaml entry and its code."""

    claim: str
    commit: str
    entry: dict[str, Any]
    code: Code | None
    broken: bool = False  # its notebook calls a verdict function the package lacks

    @property
    def rule(self) -> dict[str, Any]:
        return {k: v for k, v in self.entry.items() if k not in NOT_RULE}

    def fingerprint(self) -> str:
        return json.dumps([self.rule, self.code.fingerprint() if self.code else None],
                          sort_keys=True, default=str)

    def exists(self) -> bool:
        return bool(self.rule.get("rule")) or self.code is not None

    def digest(self) -> str:
        """A name for this version of this claim's rule (two claims decided by one notebook
        cell share its code, not their versions)."""
        return f"{self.claim}-" + hashlib.sha256(self.fingerprint().encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        """What :func:`repro.claims.rulecode.decide` runs."""
        return {"claim": self.claim, "commit": self.commit[:7], "entry": self.entry,
                "code": self.code.to_dict() if self.code else None}


@functools.lru_cache(maxsize=None)
def _claims_at(git: Git, commit: str) -> dict[str, Any]:
    sha = git.tree(commit).get(CLAIMS_PATH)
    try:
        return (yaml.safe_load(git.blob(sha)) or {}) if sha else {}
    except yaml.YAMLError:
        return {}


def _notebook_today(claim: str) -> str | None:
    from repro.verdict import definitions

    return (definitions().get(claim) or {}).get("notebook")


def version(git: Git, commit: str, claim: str, notebook: str | None = None) -> Version:
    """``claim``'s rule at ``commit`` (see the module's docstring)."""
    entry = dict(_claims_at(git, commit).get(claim) or {})
    # where claims.yaml named no notebook yet (it came later): the one that decides it today
    notebook = entry.get("notebook") or notebook or _notebook_today(claim)
    fns = _verdict_functions(git, commit)
    code = None
    sliced = notebook_rule(git, commit, notebook, claim) if notebook else None
    if sliced is not None:
        stmts, funcs, _ = sliced
        called = _calls(stmts) - set(funcs)
        named = [n for n in (claim.lower(), f"{claim.lower()}_verdict") if n in called]
        if named:  # the notebook hands the verdict to a function of the package
            if named[0] not in fns:  # one it no longer has: a commit between two moves
                return Version(claim, commit, entry, None, broken=True)
            code = function_code(git, commit, *fns[named[0]])
        else:
            code = notebook_code(git, commit, notebook, claim, sliced)
    else:
        for name in (claim.lower(), f"{claim.lower()}_verdict"):
            if name in fns:
                code = function_code(git, commit, *fns[name])
                break
    return Version(claim, commit, entry, code)


@dataclasses.dataclass(frozen=True)
class Event:
    """A commit that changed ``claim``'s rule: ``before`` its first parent's version (None
    where it had none), ``after`` its own."""

    commit: str
    date: str
    before: Version | None
    after: Version


@functools.lru_cache(maxsize=None)
def history(git: Git, claim: str, notebook: str | None = None) -> list[Event]:
    """Every commit of HEAD that changed ``claim``'s rule, oldest first: a commit whose
    version differs from its first parent's (a merge only where it differs from every parent,
    a conflict resolved by hand)."""
    out = []
    fp: dict[str, str] = {}
    ver: dict[str, Version] = {}
    for commit, date, parents in git.commits():
        v = version(git, commit, claim, notebook)
        known = [p for p in parents if p in fp]
        if v.broken:  # keeps its parent's rule
            if known:
                ver[commit], fp[commit] = ver[known[0]], fp[known[0]]
            continue
        ver[commit], fp[commit] = v, v.fingerprint()
        if not v.exists() and not any(ver[p].exists() for p in known):
            continue
        if known and any(fp[p] == fp[commit] for p in known):
            continue
        if len(known) > 1:  # a merge: its version is one of its parents', as merged
            continue
        before = ver[known[0]] if known and ver[known[0]].exists() else None
        if before is None and not v.exists():
            continue
        out.append(Event(commit, date, before, v))
    return out


# ------------------------------------------------------------------ findings from the history

def first_data(git: Git, studies: list[str], root: Path, paths: list[str] | None = None
               ) -> dict[str, str] | None:
    """The claim's first data: the earliest ``timestamp`` of a committed record of
    ``studies`` (under ``results/``; or of the files ``paths`` names, globs from the
    repository root, where its rule's ``data`` names them: a claim about one hardware and
    recipe), or the commit that first added such records where that came earlier:
    ``{"date", "source"}``."""
    import pandas as pd

    globs = list(paths or [f"results/*/{s}/*" for s in studies])
    best: tuple[pd.Timestamp, str] | None = None
    for glob in globs:
        for path in sorted(p for p in root.glob(glob) if p.suffix == ".json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for rec in data if isinstance(data, list) else [data]:
                ts = rec.get("timestamp") if isinstance(rec, dict) else None
                if ts:
                    t = pd.Timestamp(ts)
                    t = t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")
                    if best is None or t < best[0]:
                        best = (t, path.relative_to(root).as_posix())
    if globs:
        out = git.run("log", "--reverse", "--diff-filter=A", "--format=%h %cI", "HEAD", "--",
                      *globs) or ""
        if out.split():
            commit, date = out.split()[:2]
            t = pd.Timestamp(date).tz_convert("UTC")
            if best is None or t < best[0]:
                best = (t, f"commit {commit}")
    if best is None:
        return None
    return {"date": best[0].isoformat(), "source": best[1]}


def _numbers(x: Any) -> set[float]:
    """Every number in a rule's entry (nested) or code (its literals)."""
    out: set[float] = set()
    if isinstance(x, bool):
        return out
    if isinstance(x, (int, float)):
        out.add(float(x))
    elif isinstance(x, dict):
        for v in x.values():
            out |= _numbers(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            out |= _numbers(v)
    return out


def thresholds(*versions: dict[str, Any]) -> list[float]:
    """The numbers the versions of a rule compare with: those of their claims.yaml entries
    and the number literals of their code."""
    out: set[float] = set()
    for v in versions:
        if not v:
            continue
        out |= _numbers({k: x for k, x in (v.get("entry") or {}).items() if k not in NOT_RULE})
        for f in ((v.get("code") or {}).get("files") or {}).values():
            for stmt in f["code"]:
                for n in ast.walk(ast.parse(stmt)):
                    if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) \
                            and not isinstance(n.value, bool):
                        out.add(float(n.value))
    return sorted(x for x in out if abs(x) < 1e6)


def _slots(x: Any, path: tuple = ()) -> list[tuple[tuple, str, Any]]:
    """The numbers of a verdict's inputs a generated table may move: (where, kind, column)
    for each numeric or boolean column of a table and each number of a mapping or
    sequence."""
    import pandas as pd

    out = []
    if isinstance(x, pd.DataFrame):
        for c in x.columns:
            kind = x[c].dtype.kind
            if len(x) and kind in "fiu":
                out.append((path, "number", c))
            elif len(x) and kind == "b":
                out.append((path, "flag", c))
    elif isinstance(x, dict):
        for k, v in x.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((path + (k,), "scalar", None))
            else:
                out.extend(_slots(v, path + (k,)))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((path + (i,), "scalar", None))
            else:
                out.extend(_slots(v, path + (i,)))
    return out


def _get(x: Any, path: tuple) -> Any:
    for p in path:
        x = x[p]
    return x


def _copy_inputs(x: Any) -> Any:
    import pandas as pd

    if isinstance(x, pd.DataFrame):
        return x.copy()
    if isinstance(x, dict):
        return {k: _copy_inputs(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy_inputs(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_copy_inputs(v) for v in x)
    return x


def _apply(inputs: Any, slots: list, moves: list[tuple[int, int, float]]) -> tuple[Any, str]:
    """``inputs`` with ``moves`` applied (slot, row, value; row -1: every row of its table),
    and what was moved, in words."""
    data = [_copy_inputs(v) for v in inputs]  # [args (list), kwargs]
    data[0] = list(data[0])
    said = []
    for slot, row, value in moves:
        path, kind, column = slots[slot]
        if kind == "scalar":
            parent = _get(data, path[:-1])
            old = parent[path[-1]]
            new = int(round(value)) if isinstance(old, int) else float(value)
            if isinstance(parent, tuple):
                parent = list(parent)
                parent[path[-1]] = new
                holder = _get(data, path[:-2])
                holder[path[-2]] = tuple(parent)
            else:
                parent[path[-1]] = new
            said.append(f"{path[-1]} = {new:g}")
            continue
        frame = _get(data, path)
        j = list(frame.columns).index(column)
        for i in (range(len(frame)) if row < 0 else [row % len(frame)]):
            if kind == "flag":
                new = not bool(frame.iat[i, j])
            else:
                new = int(round(value)) if frame[column].dtype.kind in "iu" else float(value)
            frame.iat[i, j] = new
        where = "every row" if row < 0 else f"row {row % len(frame)}"
        said.append(f"{column} of {where} " + ("flipped" if kind == "flag" else f"= {new:g}"))
    return (tuple(data[0]), data[1]), ", ".join(said)


def prove(before: dict[str, Any], after: dict[str, Any], inputs: tuple[tuple, dict],
          records: Any = None, examples: int = 100) -> tuple[str, str]:
    """Whether two versions of a rule decide differently: on ``inputs`` (today's, as the
    verdict function takes them), then on inputs generated from them with numbers moved onto
    and around the rules' thresholds (Hypothesis, derandomized: the same answer every run).
    ("differently" and where, "the same" and on how many inputs, or "not run" and why)."""
    with _params_read_once():
        return _prove(before, after, inputs, records, examples)


@contextlib.contextmanager
def _params_read_once():
    """params.yaml read once while a proof runs old notebook code that reads it per call."""
    import copy
    from unittest import mock

    from repro import config

    read = functools.lru_cache(maxsize=4)(config.load_params)
    with mock.patch.object(config, "load_params", lambda path=None: copy.deepcopy(read(path))):
        yield


def _prove(before, after, inputs, records, examples):
    from hypothesis import HealthCheck, find, settings
    from hypothesis import strategies as st
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    from repro.claims import rulecode

    def both(args, kw):
        return (rulecode.decide(before, args, kw, records)[0],
                rulecode.decide(after, args, kw, records)[0])

    args, kw = inputs
    try:
        old, new = both(args, kw)
    except rulecode.RuleError as e:
        return "not run", f"on today's inputs: {e}"
    if old != new:
        return "differently", f"on today's inputs: {old} before, {new} after"
    if any(rulecode.reads_records(v) for v in (before, after)):
        return "the same", ("on today's inputs (tables generated from them do not apply: a "
                            "version read the records themselves)")
    slots = _slots([list(args), kw])
    if not slots or not examples:
        return "the same", "on today's inputs" + ("" if examples else
                                                  " (no table generated)")
    cuts = thresholds(before, after)
    values = sorted({v for c in cuts for v in (c, c - 1e-3, c + 1e-3, c * 0.999, c * 1.001)}
                    | {0.0})
    # a few rows, each with a few of its numbers moved together (a rule may need two
    # columns of one row to cross its thresholds at once)
    rows = st.tuples(st.integers(0, 10 ** 6), st.lists(st.tuples(
        st.integers(0, len(slots) - 1), st.sampled_from(values)), min_size=1, max_size=4))
    grouped = st.lists(rows, min_size=1, max_size=3).map(
        lambda rs: [(slot, row, value) for row, sv in rs for slot, value in sv])
    scattered = st.lists(st.tuples(st.integers(0, len(slots) - 1), st.integers(0, 10 ** 6),
                                   st.sampled_from(values)), min_size=1, max_size=6)
    # a whole column set to one value (every row at a threshold; a flag flipped everywhere)
    columns = st.lists(st.tuples(st.integers(0, len(slots) - 1), st.just(-1),
                                 st.sampled_from(values)), min_size=1, max_size=3)
    moves = st.one_of(columns, grouped, scattered)
    seen: dict[str, Any] = {}

    def differs(m) -> bool:
        try:
            (a, k), said = _apply((args, kw), slots, m)
            x, y = both(a, k)
        except (rulecode.RuleError, ValueError, TypeError, KeyError, IndexError):
            return False
        if x != y:
            seen.update(said=said, old=x, new=y)
        return x != y

    try:
        found = find(moves, differs, settings=settings(
            max_examples=examples, database=None, derandomize=True, deadline=None,
            suppress_health_check=list(HealthCheck)))
    except (NoSuchExample, Unsatisfiable):
        return "the same", f"on today's inputs and {examples} tables generated around " \
                           "the thresholds"
    differs(found)
    return "differently", (f"on a table generated from today's, {seen['said']}: "
                           f"{seen['old']} before, {seen['new']} after")[:300]


def _where(v: Version) -> str:
    return v.code.path if v.code else CLAIMS_PATH


def build(root: Path | str, examples: int = 100, only: list[str] | None = None,
          progress=None, records_of=None) -> dict[str, Any]:
    """The registration findings of every claim (``repro/data/registration.json``), from the
    history of ``root`` (which must be whole) and its committed verdict inputs; each change
    after a claim's data proven on them and on ``examples`` generated tables (:func:`prove`).
    ``records_of(studies)``: the committed records a rule of the time may read (default:
    :func:`repro.claims.registration.records_of`)."""
    import pandas as pd

    from repro.claims import registration

    root = Path(root)
    if not available(root):
        raise ValueError(f"{root}: registration needs the whole git history (a full clone; "
                         "`git fetch --unshallow` in a shallow one)")
    git = Git(root)
    defs = yaml.safe_load((root / CLAIMS_PATH).read_text())
    out: dict[str, Any] = {"claims": {}, "examples": examples, "rules": {}}
    records_of = records_of or registration.records_of
    for claim, entry in defs.items():
        if only and claim not in only:
            continue
        rule = entry.get("rule") or {}
        studies = list(rule.get("studies") or [])
        events = history(git, claim)
        data = first_data(git, studies, root, rule.get("data"))
        if not events:
            raise ValueError(f"{claim}: no rule in the history")
        if data is None:  # registered before any record: nothing can have come after its data
            first = events[0]
            out["claims"][claim] = {
                "studies": studies, "first_rule": {"commit": first.commit[:7],
                                                   "date": first.date,
                                                   "where": _where(first.after)},
                "first_data": None, "rule_at_data": None, "changes": [], "changed": None,
                "preregistered": True}
            continue
        t0 = pd.Timestamp(data["date"])
        before = [e for e in events if pd.Timestamp(e.date) < t0]
        at = before[-1].after if before else None
        inputs = registration.read_inputs(claim, root)
        records = records_of(studies)
        changes = []
        for e in events:
            if pd.Timestamp(e.date) < t0:
                continue
            if progress:
                progress(f"{claim} {e.commit[:7]}")
            decides, how = (prove(e.before.to_dict(), e.after.to_dict(), inputs, records,
                                  examples)
                            if e.before else ("differently", "the first rule"))
            changes.append({"commit": e.commit[:7], "date": e.date, "decides": decides,
                            "how": how, "where": _where(e.after)})
        changed = next(({"commit": c["commit"], "date": c["date"]} for c in changes
                        if c["decides"] != "the same"), None)
        first = events[0]
        f = {"studies": studies,
             "first_rule": {"commit": first.commit[:7], "date": first.date,
                            "where": _where(first.after)},
             "first_data": data,
             "rule_at_data": None, "changes": changes, "changed": changed,
             "preregistered": at is not None and changed is None}
        if at is not None:
            key = at.digest()
            out["rules"][key] = at.to_dict()
            f["rule_at_data"] = {"commit": at.commit[:7], "date": before[-1].date,
                                 "where": _where(at), "version": key}
        out["claims"][claim] = f
    git.close()
    return out


def render(found: dict[str, Any]) -> str:
    """The text of ``repro/data/registration.json``."""
    return json.dumps(found, indent=1, sort_keys=True) + "\n"
