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
has both.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

CLAIMS_PATH = "repro/data/claims.yaml"
# an entry's keys that are not its rule: its statement and notebook; ``ledger``, the recorded
# cells where the rule's config is found (repro.claims.ledger_set), which the rule itself states;
# ``kind`` (a projection)
NOT_RULE = ("claim", "notebook", "first_registered", "ledger", "kind")
#: where verdict functions and their helpers live, as path patterns
VERDICT_MODULES = (re.compile(r"repro/claims/verdicts(/[^/]+)?\.py$"),
                   re.compile(r"repro/verdicts?\.py$"),
                   re.compile(r"repro/experiments/[^/]+/rules\.py$"))
#: a function that decides a claim: ``a8`` or ``a8_verdict``
DEF_VERDICT = re.compile(rb"^def ([ab]\d+)(_verdict)?\(", re.M)
#: what a verdict function reaches that is no part of its rule: the record it returns
NOT_CODE = frozenset({"Verdict"})
#: the working tree, read as if it were a commit (a rule changed but not yet committed)
WORKTREE = "WORKTREE"


class Git:
    """Reads one repository's history: trees and blobs through one ``git cat-file`` process,
    each blob parsed once."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._cat: subprocess.Popen | None = None
        self._blobs: dict[str, bytes] = {}
        self._trees: dict[str, ast.Module | None] = {}

    def run(self, *args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=self.root, capture_output=True,
                                 text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    def blob(self, sha: str) -> bytes:
        if sha.startswith(WORKTREE + ":"):  # a file of the working tree, read as it is now
            return (self.root / sha.split(":", 1)[1]).read_bytes()
        if sha not in self._blobs:
            if self._cat is None:
                self._cat = subprocess.Popen(["git", "cat-file", "--batch"], cwd=self.root,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._cat.stdin.write(sha.encode() + b"\n")
            self._cat.stdin.flush()
            header = self._cat.stdout.readline().split()
            if len(header) < 3 or header[1] != b"blob":
                raise ValueError(f"git: {sha} is not a blob in {self.root}")
            data = self._cat.stdout.read(int(header[2]))
            self._cat.stdout.readline()
            self._blobs[sha] = data
        return self._blobs[sha]

    def tree(self, commit: str) -> dict[str, str]:
        """{path: blob sha} of the files under repro/ and notebooks/ at ``commit``
        (:data:`WORKTREE`: the working tree's, tracked or not ignored, each read anew)."""
        if commit == WORKTREE:
            out = self.run("ls-files", "--cached", "--others", "--exclude-standard", "--",
                           "repro", "notebooks") or ""
            return {p: f"{WORKTREE}:{p}" for p in out.splitlines() if (self.root / p).is_file()}
        return self._tree(commit)

    @functools.lru_cache(maxsize=None)
    def _tree(self, commit: str) -> dict[str, str]:
        out = self.run("ls-tree", "-r", commit, "--", "repro", "notebooks") or ""
        files = {}
        for line in out.splitlines():
            meta, path = line.split("\t", 1)
            if meta.split()[1] == "blob":
                files[path] = meta.split()[2]
        return files

    def text(self, commit: str, path: str) -> str | None:
        sha = self.tree(commit).get(path)
        return self.blob(sha).decode("utf-8", "replace") if sha else None

    def parsed(self, commit: str, path: str) -> ast.Module | None:
        """The syntax tree of ``path`` at ``commit`` (None where it is missing or does not
        parse), each blob parsed once."""
        sha = self.tree(commit).get(path)
        if sha is None:
            return None
        if sha not in self._trees:  # (a working-tree file: as it was when first read)
            self._trees[sha] = _parse(self.blob(sha).decode("utf-8", "replace"))
        return self._trees[sha]

    @functools.lru_cache(maxsize=None)
    def commits(self) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        """(commit, committer date, parents) of every commit of HEAD that touched repro/ or
        notebooks/, oldest first; parents as rewritten to such commits."""
        out = self.run("log", "--reverse", "--topo-order", "--parents", "--format=%H|%cI|%P",
                       "HEAD", "--", "repro", "notebooks") or ""
        rows = []
        for line in out.splitlines():
            commit, date, parents = line.split("|")
            rows.append((commit, date, tuple(parents.split())))
        return tuple(rows)

    def date(self, commit: str) -> str:
        return (self.run("show", "-s", "--format=%cI", commit) or "").strip()

    def close(self):
        if self._cat is not None:
            self._cat.stdin.close()
            self._cat.wait()
            self._cat = None


def available(root: Path | str) -> bool:
    """Whether ``root`` is a git checkout with its whole history (not a shallow clone)."""
    out = Git(root).run("rev-parse", "--is-shallow-repository")
    return out is not None and out.strip() == "false"


# --------------------------------------------------------------------------- code of a rule

def _strip_doc(node: ast.AST) -> ast.AST:
    """``node`` (and the functions and classes it holds) without docstrings."""
    node = _copy(node)
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            b = n.body
            if b and isinstance(b[0], ast.Expr) and isinstance(b[0].value, ast.Constant) \
                    and isinstance(b[0].value.value, str):
                n.body = b[1:] or [ast.Pass()]
    return node


def _copy(node):
    return ast.parse(ast.unparse(node)).body[0] if not isinstance(node, ast.Module) else node


def _parse(text: str | None) -> ast.Module | None:
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _defined(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement binds, in any of its branches (``V["A5"] = ...``
    changes ``V``: counted as binding it); not those local to a function it defines."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    out = set()
    todo = [stmt]
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
                          ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = (n.targets if isinstance(n, ast.Assign) else [n.target]
                       if not isinstance(n, ast.With) else
                       [i.optional_vars for i in n.items if i.optional_vars])
            for t in targets:
                out |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
        if isinstance(n, ast.NamedExpr):
            out.add(n.target.id)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _used(node: ast.AST) -> set[str]:
    """Names ``node`` reads (loads), the bodies of functions it defines included."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}


_MEMO: dict[tuple[str, int], Any] = {}  # per syntax tree (kept alive by Git's cache)


def _memo(kind: str, node: ast.AST, make) -> Any:
    key = (kind, id(node))
    if key not in _MEMO:
        _MEMO[key] = (node, make(node))
    return _MEMO[key][1]


def _top_defs(tree: ast.Module) -> dict[str, ast.stmt]:
    """Top-level functions, classes and assignments of a module: name -> its first
    statement."""
    return _memo("defs", tree, _top_defs_of)


def _top_defs_of(tree: ast.Module) -> dict[str, ast.stmt]:
    out: dict[str, ast.stmt] = {}
    for s in tree.body:
        if isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
            for name in _defined(s):
                out.setdefault(name, s)
    return out


def _imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """{bound name: (module, name)} of a module's top-level ``from X import y``."""
    return _memo("imports", tree, _imports_of)


def _imports_of(tree: ast.Module) -> dict[str, tuple[str, str]]:
    out = {}
    for s in tree.body:
        if isinstance(s, ast.ImportFrom) and s.module and not s.level:
            for a in s.names:
                out[a.asname or a.name] = (s.module, a.name)
    return out


def _module_path(module: str, files: dict[str, str]) -> str | None:
    base = module.replace(".", "/")
    return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in files), None)


def _is_verdict_module(path: str) -> bool:
    return any(p.match(path) for p in VERDICT_MODULES)


@dataclasses.dataclass(frozen=True)
class Code:
    """A rule's code: per file (module or notebook), its import statements and the
    statements of the rule, in source order, as ``ast.unparse`` writes them without
    docstrings. ``kind``: ``function`` (``entry`` the function, in ``path``) or ``notebook``
    (``entry`` the claim whose verdict the statements write). ``support``: what the rule
    reaches in other modules of the package at that commit (tables' helpers, constants), kept
    to run it as it was; no part of its fingerprint."""

    kind: str
    path: str
    entry: str
    files: dict[str, dict[str, list[str]]]  # path -> {"imports": [...], "code": [...]}
    support: dict[str, dict[str, list[str]]] = dataclasses.field(default_factory=dict)

    def fingerprint(self) -> str:
        """What a change of the rule's code changes: the statements (not the imports, not
        the file they are in)."""
        parts = sorted(s for f in self.files.values() for s in f["code"])
        return json.dumps([self.kind if self.kind == "notebook" else "function", parts])

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def function_code(git: Git, commit: str, path: str, name: str) -> Code:
    """Function ``name`` of ``path`` at ``commit`` with every top-level function, class and
    constant it reaches in its own module and, through ``from ... import``, in the verdict
    modules (its code); what it reaches in other modules of the package is kept as
    ``support``, so the version runs as it was, but is no part of the rule."""
    files = git.tree(commit)

    def tree(p: str) -> ast.Module:
        return git.parsed(commit, p) or ast.Module(body=[], type_ignores=[])

    seen: dict[tuple[str, bool], set[ast.stmt]] = {}
    todo = [(path, name, False)]
    while todo:
        p, n, support = todo.pop()
        t = tree(p)
        defs = _top_defs(t)
        if n not in defs:
            continue
        stmt = defs[n]
        if stmt in seen.setdefault((p, support), set()):
            continue
        seen[(p, support)].add(stmt)
        imp = _imports(t)
        for used in {d.id for d in ast.walk(stmt) if isinstance(d, ast.Name)}:
            if used in NOT_CODE:
                continue
            if used in defs and defs[used] is not stmt:
                todo.append((p, used, support))
            elif used in imp and imp[used][0].split(".")[0] == "repro":
                mp = _module_path(imp[used][0], files)
                if mp:
                    rule = not support and (_is_verdict_module(mp) or mp == path)
                    todo.append((mp, imp[used][1], not rule))
    out: dict[str, dict[str, list[str]]] = {}
    extra: dict[str, dict[str, list[str]]] = {}
    for (p, support), stmts in sorted(seen.items()):
        t = tree(p)
        if not support:
            stmts = stmts
        else:  # what the rule's own code already holds is not support
            stmts = stmts - seen.get((p, False), set())
            if not stmts:
                continue
        (extra if support else out)[p] = {
            "imports": [_memo("unparse", s, ast.unparse) for s in t.body
                        if isinstance(s, (ast.Import, ast.ImportFrom))],
            "code": [_text(s) for s in t.body if s in stmts]}
    return Code("function", path, name, out, extra)


def _text(stmt: ast.stmt) -> str:
    """A statement as kept in a rule's code: ``ast.unparse`` without docstrings."""
    return _memo("text", stmt, lambda s: ast.unparse(_strip_doc(s)))


def _cells(text: str) -> list[str]:
    """The code cells of a Jupytext py:percent notebook."""
    out, cur, markdown = [], [], False
    for line in text.splitlines():
        if line.startswith("# %%"):
            if not markdown:
                out.append("\n".join(cur))
            cur, markdown = [], "[markdown]" in line
        else:
            cur.append(line)
    if not markdown:
        out.append("\n".join(cur))
    return out


def _mentions(node: ast.AST, claim: str) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == claim for n in ast.walk(node))


def _other_claim_store(stmt: ast.stmt, claim: str) -> bool:
    """``V["A6"] = ...`` in the slice of another claim than A6: not part of it."""
    if not isinstance(stmt, ast.Assign):
        return False
    keys = [t.slice.value for t in stmt.targets if isinstance(t, ast.Subscript)
            and isinstance(t.slice, ast.Constant)]
    return bool(keys) and all(isinstance(k, str) and re.fullmatch(r"[AB]\d+", k)
                              and k != claim for k in keys)


def _calls(stmts: list[ast.stmt]) -> set[str]:
    """Names called in ``stmts``: ``f(...)``, ``m.f(...)``, and ``m.f`` handed to another
    call (``judged(verdicts.a8, ...)``)."""
    out = set()
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, ast.Call):
                if isinstance(n.func, ast.Name):
                    out.add(n.func.id)
                out |= {x.attr for x in [n.func, *n.args] if isinstance(x, ast.Attribute)}
    return out


def notebook_rule(git: Git, commit: str, notebook: str, claim: str
                  ) -> tuple[list[ast.stmt], dict[str, ast.stmt], ast.Module] | None:
    """The verdict statements of ``claim`` in ``notebook`` at ``commit`` (its slice: the
    statements that write its verdict, those naming the claim or calling its verdict
    function, and the statements of their cells they depend on), the notebook's functions
    defined anywhere in it, and the whole notebook's tree; None where the notebook does not
    write the claim's verdict."""
    sha = git.tree(commit).get(f"notebooks/{notebook}.py")
    return None if sha is None else _notebook_rule(git, sha, claim)


@functools.lru_cache(maxsize=None)
def _notebook_rule(git: Git, sha: str, claim: str):
    text = git.blob(sha).decode("utf-8", "replace")
    names = {claim.lower(), f"{claim.lower()}_verdict"}
    body: list[ast.stmt] = []
    cells: list[range] = []
    for cell in _cells(text):
        t = _parse(cell)
        if t is not None:
            cells.append(range(len(body), len(body) + len(t.body)))
            body.extend(t.body)
    named = [i for i, s in enumerate(body) if _mentions(s, claim) or _calls([s]) & names]
    if not named:
        return None
    verdict_cells = sorted({i for c in cells if set(c) & set(named) for i in c})
    # and the statements of those cells that write verdicts (a loop over several claims)
    writers = sorted(set(named) | {i for i in verdict_cells
                                   if _calls([body[i]]) & {"write_verdict", "conclusion"}})
    funcs = {s.name: s for s in body if isinstance(s, ast.FunctionDef)}
    keep, need = set(writers), set()
    for i in writers:
        need |= _used(body[i])
    for i in reversed(verdict_cells):
        if i > max(writers) or i in keep:
            continue
        s = body[i]
        if isinstance(s, ast.FunctionDef) or _other_claim_store(s, claim):
            continue
        if _defined(s) & need:
            keep.add(i)
            need |= _used(s)
    stmts = [body[i] for i in sorted(keep)]
    return stmts, funcs, ast.Module(body=body, type_ignores=[])


def notebook_code(git: Git, commit: str, notebook: str, claim: str,
                  sliced: tuple[list[ast.stmt], dict[str, ast.stmt], ast.Module]) -> Code:
    """:class:`Code` of a notebook's own verdict statements and the notebook functions they
    reach."""
    stmts, funcs, whole = sliced
    used = set()
    todo = [n for s in stmts for n in _used(s)]
    while todo:
        n = todo.pop()
        if n in funcs and n not in used:
            used.add(n)
            todo.extend(_used(funcs[n]))
    defs = [s for s in whole.body if isinstance(s, ast.FunctionDef) and s.name in used
            and funcs[s.name] is s]
    imports = [ast.unparse(s) for s in whole.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    code = [_text(s) for s in defs + stmts]
    path = f"notebooks/{notebook}.py"
    return Code("notebook", path, claim, {path: {"imports": imports, "code": code}})


@functools.lru_cache(maxsize=None)
def _verdict_functions(git: Git, commit: str) -> dict[str, tuple[str, str]]:
    """{function name: (path, name)} of every ``a8``/``a8_verdict`` function under repro/ at
    ``commit`` (verdict modules first)."""
    out: dict[str, tuple[str, str]] = {}
    files = git.tree(commit)
    paths = sorted((p for p in files if p.startswith("repro/") and p.endswith(".py")),
                   key=lambda p: (not _is_verdict_module(p), p))
    for p in paths:
        for m in DEF_VERDICT.finditer(git.blob(files[p])):
            name = (m.group(1) + (m.group(2) or b"")).decode()
            out.setdefault(name, (p, name))
    return out


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


def _free(node: ast.AST, bound: frozenset[str] = frozenset()) -> set[str]:
    """Names ``node`` reads that are not bound in its own scopes (a function's parameters
    and locals, a comprehension's or lambda's variables)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        local = {x.arg for x in a.args + a.kwonlyargs + a.posonlyargs}
        local |= {x.arg for x in (a.vararg, a.kwarg) if x}
        body = node.body if isinstance(node.body, list) else [node.body]
        for b in body:
            local |= {n.id for n in ast.walk(b) if isinstance(n, ast.Name)
                      and isinstance(n.ctx, ast.Store)}
        out = set()
        for d in (a.defaults + [d for d in a.kw_defaults if d]):
            out |= _free(d, bound)
        for b in body:
            out |= _free(b, bound | local)
        return out
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        local = {n.id for g in node.generators for n in ast.walk(g.target)
                 if isinstance(n, ast.Name)}
        out = set()
        for child in ast.iter_child_nodes(node):
            out |= _free(child, bound | local)
        return out
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return set() if node.id in bound else {node.id}
    out = set()
    for child in ast.iter_child_nodes(node):
        out |= _free(child, bound)
    return out


def free_names(code: dict[str, Any]) -> set[str]:
    """The names a notebook-kind rule's statements read that neither they, the notebook's
    imports nor Python define: the notebook's variables it needs as inputs."""
    import builtins

    f = code["files"][code["path"]]
    defined = set(dir(builtins))
    for imp in f["imports"]:
        defined |= _defined(ast.parse(imp).body[0])
    used: set[str] = set()
    for text in f["code"]:
        stmt = ast.parse(text).body[0]
        defined |= _defined(stmt)
        used |= _free(stmt)
    return used - defined
