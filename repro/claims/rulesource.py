"""A claim's rule as code (:class:`Code`), read from the repository at a commit: the verdict
function and every helper, constant and class it reaches in the verdict modules
(:func:`function_code`), or the statements of a notebook's verdict cells
(:func:`notebook_code`); kept as syntax without docstrings or comments, so layout, comments,
docs and moving a function between modules change nothing. :mod:`repro.claims.rulehistory`
lists where a claim's rule changed."""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import re
from typing import Any


from repro.claims.rulegit import DEF_VERDICT, NOT_CODE, VERDICT_MODULES, Git, _parse

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
    call (``judged(verdicts.a8, ...)``) or paired with its claim in a tuple a loop hands on
    (``for fn, claim in ((verdicts.a8, "A8"), ...)``)."""
    out = set()
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, ast.Call):
                if isinstance(n.func, ast.Name):
                    out.add(n.func.id)
                out |= {x.attr for x in [n.func, *n.args] if isinstance(x, ast.Attribute)}
            elif isinstance(n, ast.Tuple):
                out |= {x.attr for x in n.elts if isinstance(x, ast.Attribute)}
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
