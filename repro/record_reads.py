"""Which committed record folders a notebook reads (:func:`record_reads`), found in its code:
each call of a function that reads records (``evidence.load_records(experiment)``, or a
function that calls one, such as ``Notebook.records`` or ``perfmodel.measured_records``),
reached from the notebook's own code, with its experiment argument resolved statically (a
string, a module constant such as ``E.EXPERIMENT``, a loop over constants). A call whose
experiment cannot be resolved, or one that reads every folder, reads all of them
(:data:`EVERY`). :mod:`repro.pipeline` makes each notebook's DVC stage depend on those
folders."""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

from repro import fingerprint

#: The functions of :mod:`repro.evidence` that read committed records: name -> the parameter
#: naming the experiment (None: every experiment).
READERS: dict[str, str | None] = {"load_records": "experiment", "stale_cells": None}
EVERY = "*"  # an experiment name that stands for all of them


def _own_nodes(node: ast.AST):
    """The nodes of ``node``'s body, not descending into functions or classes defined in it
    (a lambda's body counts as its enclosing function's)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield child
        yield from _own_nodes(child)


def _params(fn: ast.AST) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


class _Module:
    """One source file's constants and import aliases, for resolving names statically."""

    def __init__(self, path: Path):
        self.path = path
        self.tree = fingerprint.parse(path)
        self.consts: dict[str, list[ast.expr]] = {}
        self.aliases: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute)
        here, is_pkg = fingerprint.module_name(path), path.name == "__init__.py"
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.consts.setdefault(t.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and node.value is not None:
                self.consts.setdefault(node.target.id, []).append(node.value)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = (a.name, None)
            elif isinstance(node, ast.ImportFrom):
                base = fingerprint.resolve_from(node, here, is_pkg)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    module = fingerprint.module_file(sub) if sub.startswith("repro") else None
                    self.aliases[a.asname or a.name] = (sub, None) if module else (base, a.name)


def _module(path: Path) -> _Module:
    st = path.stat()
    return _module_at(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _module_at(path: Path, mtime_ns: int, size: int) -> _Module:
    """:func:`_module` of one version of a file."""
    return _Module(path)


def _defined_in(module: str, name: str, seen: frozenset = frozenset()) -> set[Path | None]:
    """The files where ``module.name`` may be defined: the module's, and those it imports the
    name from (a package that re-exports a function of one of its modules)."""
    path = fingerprint.module_file(module)
    if path is None or (module, name) in seen:
        return {path}
    alias = _module(path).aliases.get(name)
    more = _defined_in(alias[0], alias[1] or name, seen | {(module, name)}) if alias and \
        alias[1] else set()
    return {path} | more


def _constant(module: str, name: str, seen: frozenset) -> tuple[set[str], set[str], bool]:
    path = fingerprint.module_file(module)
    if path is None or (module, name) in seen:
        return set(), set(), True
    m = _module(path)
    if name in m.consts:
        return _const_values(m, name, seen | {(module, name)})
    if name in m.aliases and m.aliases[name][1] is not None:
        return _constant(*m.aliases[name], seen | {(module, name)})
    return set(), set(), True


def _live(path: Path, name: str) -> set[str] | None:
    """The strings module constant ``name`` holds once its module is imported (a constant
    computed from the experiment specs, say, which the syntax alone does not give), or None."""
    import importlib

    try:
        v = getattr(importlib.import_module(fingerprint.module_name(path)), name)
    except Exception:  # noqa: BLE001 - not importable here: the caller's fallback
        return None
    if isinstance(v, str):
        return {v}
    if isinstance(v, (tuple, list, set, frozenset, dict)) and all(isinstance(x, str) for x in v):
        return set(v)
    return None


def _const_values(m: _Module, name: str, seen: frozenset) -> tuple[set[str], set[str], bool]:
    out = _values_of(m.consts[name], {}, m, seen)
    if out[2] and (live := _live(m.path, name)) is not None:
        return live, set(), False
    return out


def _values_of(exprs, local, m, seen) -> tuple[set[str], set[str], bool]:
    out: tuple[set[str], set[str], bool] = (set(), set(), False)
    for e in exprs:
        s, p, unknown = _values(e, local, m, seen)
        out = (out[0] | s, out[1] | p, out[2] or unknown)
    return out


def _values(e: ast.expr, local: dict, m: _Module, seen: frozenset = frozenset()
            ) -> tuple[set[str], set[str], bool]:
    """(the strings ``e`` may be or hold, the enclosing function's parameters it may be,
    whether it may be anything else)."""
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return {e.value}, set(), False
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return _values_of(e.elts, local, m, seen)
    if isinstance(e, ast.Starred):
        return _values(e.value, local, m, seen)
    if isinstance(e, ast.Dict) and None not in e.keys:
        return _values_of(e.keys, local, m, seen)
    if isinstance(e, ast.Name):
        if e.id in local:
            bound = local[e.id]
            return (set(), {e.id}, False) if bound == "param" else \
                (set(), set(), True) if bound == "unknown" else _values_of(bound, local, m, seen)
        if e.id in m.consts:
            return _const_values(m, e.id, seen)
        if e.id in m.aliases and m.aliases[e.id][1] is not None:
            return _constant(*m.aliases[e.id], seen)
    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) \
            and e.value.id in m.aliases and m.aliases[e.value.id][1] is None:
        return _constant(m.aliases[e.value.id][0], e.attr, seen)
    return set(), set(), True


def _bindings(fn: ast.AST, params: list[str]) -> dict[str, Any]:
    """A function's local names: its parameters, and what its assignments and loops bind
    (a loop variable is bound to the loop's iterable: its values are the iterable's)."""
    local: dict[str, Any] = {}

    def bind(target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            if value is None:
                local[target.id] = "unknown"
            elif local.get(target.id) not in ("param", "unknown"):
                local.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                bind(t, None)

    for node in _own_nodes(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                bind(t, node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            bind(node.target, node.iter)
        elif isinstance(node, ast.Lambda):
            for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                local[a.arg] = "unknown"
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    bind(item.optional_vars, None)
    for p in params:
        local[p] = "param"
    return local


@functools.lru_cache(maxsize=4096)
def _body(node: ast.AST, params: tuple[str, ...]) -> tuple[dict[str, Any], list[ast.Call]]:
    """A function's local bindings and the calls it makes with a named callee."""
    return _bindings(node, list(params)), [
        n for n in _own_nodes(node) if isinstance(n, ast.Call) and _callee(n)]


def _candidates(call: ast.Call, m: _Module, reads: dict[str, list]) -> list:
    """The functions ``call`` may run, among ``reads``: for ``f(...)``, those of ``m`` and the
    one it imports as ``f``; for ``module.f(...)``, that module's; for ``obj.f(...)``, every
    function named ``f`` (a method of any class)."""
    f, name = call.func, _callee(call)
    files: set[Path | None] | None = None
    if isinstance(f, ast.Name):
        files = {m.path}
        if name in m.aliases and m.aliases[name][1]:
            module, attr = m.aliases[name]
            name = attr
            files |= _defined_in(module, attr)
    elif isinstance(f.value, ast.Name) and f.value.id in m.aliases \
            and m.aliases[f.value.id][1] is None:
        files = _defined_in(m.aliases[f.value.id][0], f.attr)
    return [e for e in reads.get(name or "", [])
            if files is None or e[0] is None or e[0] in files]


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _argument(call: ast.Call, params: list[str], name: str) -> ast.expr | None:
    """The expression ``call`` passes as parameter ``name`` of a function with ``params``."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    i = params.index(name) if name in params else len(call.args)
    if any(isinstance(a, ast.Starred) for a in call.args[: i + 1]):
        return ast.Name("<unknown>")
    return call.args[i] if i < len(call.args) else None


def record_reads(notebook: Path) -> set[str]:
    """The experiments whose committed records ``notebook`` reads (:data:`EVERY` among them
    when a read cannot be narrowed to named experiments)."""
    paths, _ = fingerprint.closure(notebook)
    # what each function of the closure reads, by name (functions of one name: one entry
    # each): (its file (None: any), parameters, experiments read, parameters passed on as an
    # experiment)
    reads: dict[str, list[tuple[Path | None, list[str], set[str], set[str]]]] = {
        name: [(None, [param] if param else [], {EVERY} if param is None else set(),
                {param} if param else set())] for name, param in READERS.items()}
    defs = [(_module(path), node) for path in paths for node in ast.walk(_module(path).tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name not in READERS]
    for _, node in defs:
        reads.setdefault(node.name, [])
    entries = {id(node): (m.path, _params(node), set(), set()) for m, node in defs}
    for _, node in defs:
        reads[node.name].append(entries[id(node)])

    def of(m: _Module, node: ast.AST, params: list[str]) -> tuple[set[str], set[str]]:
        found: set[str] = set()
        passed: set[str] = set()
        local, calls = _body(node, tuple(params))
        for call in calls:
            for _, signature, fixed, through in _candidates(call, m, reads):
                found |= fixed
                for p in through:
                    arg = _argument(call, signature, p)
                    if arg is None:  # left at its default: every experiment (load_records())
                        found.add(EVERY)
                        continue
                    strings, params_, unknown = _values(arg, local, m)
                    found |= strings | ({EVERY} if unknown else set())
                    passed |= params_
        return found, passed

    changed = True
    while changed:  # to a fixed point: a function that calls a reader reads too
        changed = False
        for m, node in defs:
            _, params, fixed, through = entries[id(node)]
            f, p = of(m, node, params)
            if not (f <= fixed and p <= through):
                fixed |= f
                through |= p
                changed = True
    m = _module(notebook)
    return of(m, m.tree, [])[0]
