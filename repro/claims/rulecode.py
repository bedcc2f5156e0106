"""Running a rule as it was written at an older commit, on today's tables.

A rule's code (:class:`repro.claims.rulesource.Code`, kept as text: in
``repro/data/registration.json`` for the rule each claim had when its first data came, or read
from git) is executed here, each of its modules in a fresh namespace: its statements as they
stood, its imports of other modules resolved to today's modules, its reads of
``repro/data/claims.yaml`` answered from the claim's entry at that commit. :func:`decide` then
calls it with the inputs today's notebook hands the claim's verdict function (the tables and
numbers of :func:`repro.claims.registration.judged`), and returns what it decided.

Where the rule was a notebook's own code, that code reads the notebook's variables of the time
(``poi``, ``sp``, ``HWQ``...): :data:`NOTEBOOK_INPUTS` names each from today's inputs, and
where an old verdict function took other tables than today's, :data:`FUNCTION_INPUTS` builds
them (from the committed records, where it read those). A rule whose code cannot run on today's
inputs raises :class:`RuleError`, naming what failed.

The inputs themselves are written as data by :mod:`repro.claims.ruleinputs` (:func:`dump`,
:func:`load`, handed on here).
"""

from __future__ import annotations

import __future__
import ast
import builtins
import contextlib
import functools
import importlib
import inspect
import io
import itertools
import json
import re
import sys
import types
from types import SimpleNamespace
from typing import Any, Callable

import pandas as pd
import yaml

from repro.verdict import VERDICTS


#: modules whose names moved since an earlier rule imported them: former name -> today's
MOVED = {"repro.claims.verdicts._base": "repro.verdict",
         "repro.experiments._spec": "repro.catalogue"}
#: an experiment's former spec module (``repro/experiments/<name>/spec.py``, its ``SPEC``): its
#: entry is in the catalogue now
FORMER_SPEC = re.compile(r"repro\.experiments\.(\w+)\.spec")


class RuleError(ValueError):
    """A rule's code that cannot run on the inputs given (one line)."""


# ---------------------------------------------------------------- a rule's code, executed

_FLAGS = __future__.annotations.compiler_flag


class _Claims:
    """``repro/data/claims.yaml`` as the rule's commit had it, for ``importlib.resources``
    reads in the rule's modules; other files are today's."""

    def __init__(self, text: str):
        self._text = text

    def files(self, package):
        real = importlib.import_module("importlib.resources").files(package)
        return _Path(real, self._text)


class _Path:
    def __init__(self, real, text: str, rel: str = ""):
        self._real, self._text, self._rel = real, text, rel

    def joinpath(self, *parts: str) -> _Path:
        rel = "/".join([self._rel, *parts]).strip("/")
        return _Path(self._real.joinpath(*parts), self._text, rel)

    __truediv__ = joinpath

    def read_text(self, *a, **k) -> str:
        return self._text if self._rel == "data/claims.yaml" else self._real.read_text(*a, **k)


def _module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # dataclasses look their module up
    return mod


def _exec(code: str, ns: dict[str, Any], where: str) -> None:
    exec(_compiled(code, where), ns)


@functools.lru_cache(maxsize=None)
def _compiled(code: str, where: str):
    return compile(code, where, "exec", flags=_FLAGS, dont_inherit=True)


def _run_statements(files: dict[str, dict[str, list[str]]], spaces: dict[str, dict],
                    bind: Callable[[], None]) -> None:
    """Execute each file's statements in its namespace; a statement that needs a name another
    file has not yet bound runs again once it has (``bind`` binds what is there, before each
    round)."""
    pending = [(p, s) for p, f in files.items() for s in f["code"]]
    for _ in range(len(files) + 1):
        bind()
        failed = []
        for path, stmt in pending:
            try:
                _exec(stmt, spaces[path], path)
            except NameError:
                failed.append((path, stmt))
        if not failed or len(failed) == len(pending):
            pending = failed
            break
        pending = failed
    bind()
    for path, stmt in pending:  # once more, to raise the error where it is
        _exec(stmt, spaces[path], path)


def _imports(stmt_text: str, ns: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Execute an import statement into ``ns`` name by name (what no longer exists stays
    unbound); the (module, name, bound name) of each ``from`` import."""
    links, bound = _resolve(stmt_text)
    ns.update(bound)
    return links


@functools.lru_cache(maxsize=None)
def _resolve(stmt_text: str) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    stmt = ast.parse(stmt_text).body[0]
    links, bound = [], {}
    if isinstance(stmt, ast.ImportFrom):
        if stmt.module == "__future__":
            return links, bound
        for a in stmt.names:
            links.append((stmt.module, a.name, a.asname or a.name))
            with contextlib.suppress(Exception):  # (a module since moved: by today's name)
                mod = importlib.import_module(MOVED.get(stmt.module, stmt.module))
                bound[a.asname or a.name] = getattr(mod, a.name) if hasattr(mod, a.name) \
                    else _submodule(f"{stmt.module}.{a.name}")
    else:
        for a in stmt.names:
            with contextlib.suppress(Exception):
                mod = importlib.import_module(a.name)
                bound[a.asname or a.name.split(".")[0]] = mod if a.asname else \
                    importlib.import_module(a.name.split(".")[0])
    return links, bound


def _submodule(name: str) -> Any:
    """The module ``name`` as an earlier rule imported it: today's, by its name now
    (:data:`MOVED`); a former spec module stands for its catalogue entry (its ``SPEC``)."""
    if m := FORMER_SPEC.fullmatch(name):
        from repro import catalogue

        return SimpleNamespace(SPEC=catalogue.get(m[1]))
    return importlib.import_module(MOVED.get(name, name))


def _module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


_COUNT = itertools.count()


_LOADED: dict[str, Callable[..., Any]] = {}


def load_function(version: dict[str, Any]) -> Callable[..., Any]:
    """The verdict function of a stored function-kind version, its modules executed from
    their stored statements (:func:`decide` calls it); each version once."""
    key = json.dumps([version["claim"], version["entry"], version["code"]], sort_keys=True,
                     default=str)
    if key not in _LOADED:
        _LOADED[key] = _load_function(version)
    return _LOADED[key]


def _load_function(version: dict[str, Any]) -> Callable[..., Any]:
    code, entry = version["code"], version["entry"]
    claims_text = yaml.safe_dump({version["claim"]: entry})
    n = next(_COUNT)
    spaces: dict[str, dict[str, Any]] = {}
    links = []
    files = {p: dict(f) for p, f in (code.get("support") or {}).items()}
    for p, f in code["files"].items():  # the rule's own statements, then what supports them
        files[p] = {"imports": f["imports"],
                    "code": f["code"] + files.get(p, {}).get("code", [])}
    ours = {_module_of(p): p for p in files}
    for path, f in files.items():
        mod = _module(f"_repro_rule_{n}_{_module_of(path).replace('.', '_')}")
        ns = mod.__dict__
        ns["__builtins__"] = builtins
        for imp in f["imports"]:
            for module, name, bound in _imports(imp, ns):
                if module in ours:
                    links.append((path, bound, ours[module], name))
        ns["resources"] = _Claims(claims_text)
        spaces[path] = ns

    def bind():  # names imported from another module of the rule: that module's version
        for path, bound, other, name in links:
            if name in spaces[other]:
                spaces[path][bound] = spaces[other][name]

    _run_statements(files, spaces, bind)
    fn = spaces[code["path"]].get(code["entry"])
    if not callable(fn):
        raise RuleError(f"{code['path']} at {version['commit'][:7]}: no function "
                        f"{code['entry']}")
    return fn


class _Ledger:
    """Stands in for the claims ledger a notebook's verdict code wrote to: keeps each
    claim's verdict instead."""

    def __init__(self):
        self.written: dict[str, tuple[str, str]] = {}

    def write_verdict(self, verdict, *fields, **kw):
        if hasattr(verdict, "verdict"):
            self.written[verdict.claim] = (verdict.verdict, getattr(verdict, "key_number", ""))
        else:
            key = fields[1] if len(fields) > 1 else kw.get("key_number", "")
            self.written[str(verdict)] = (str(fields[0]) if fields else kw.get("verdict", ""),
                                          str(key))
        return None


def run_notebook_code(version: dict[str, Any], names: dict[str, Any]) -> tuple[str, str]:
    """(verdict, key number) that a notebook-kind version writes for its claim, its code run
    with ``names`` (the notebook's variables it reads) and the notebook's imports."""
    code = version["code"]
    f = code["files"][code["path"]]
    ns: dict[str, Any] = {"__builtins__": builtins, "__name__": "_repro_rule_notebook"}
    for imp in f["imports"]:
        _imports(imp, ns)
    ns.update(names)
    ledger = _Ledger()
    ns["claims"] = ns["ledger"] = ledger
    with contextlib.redirect_stdout(io.StringIO()):
        for stmt in f["code"]:
            try:
                _exec(stmt, ns, code["path"])
            except Exception:
                if code["entry"] in ledger.written:
                    break
                raise
    claim = code["entry"]
    if claim in ledger.written:
        return ledger.written[claim]
    # the first notebooks wrote a record by hand: its verdict is a variable of the cell
    if isinstance(ns.get("verdict"), str):
        return ns["verdict"], str(ns.get("key_number", ""))
    raise RuleError(f"{code['path']} at {version['commit'][:7]}: its code wrote no verdict "
                    f"for {claim}")


def word(verdict: Any) -> str:
    """The verdict's word (its vocabulary's, :data:`VERDICTS`) from whatever a rule returned:
    a Verdict, a dict or tuple, or a text that starts with it."""
    v = getattr(verdict, "verdict", None)
    if v is None and isinstance(verdict, dict):
        v = verdict.get("verdict")
    if v is None and isinstance(verdict, tuple) and verdict:
        v = verdict[0]
    v = str(v if v is not None else verdict)
    found = next((w for w in VERDICTS if v == w or v.startswith(w + " ")), None)
    if found is None:
        raise RuleError(f"not a verdict: {v[:60]!r}")
    return found


def key_number(verdict: Any) -> str:
    v = getattr(verdict, "key_number", None)
    if v is None and isinstance(verdict, dict):
        v = verdict.get("key_number")
    if v is None and isinstance(verdict, tuple) and len(verdict) > 1:
        v = verdict[1]
    return str(v or "")


def _call(fn: Callable[..., Any], args: tuple, kw: dict[str, Any], rule: Any) -> Any:
    """``fn`` called with what its signature takes of ``args`` and ``kw`` (and ``rule=``
    where it takes one)."""
    params = inspect.signature(fn).parameters
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params.values())
    varkw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY,
                                                           p.POSITIONAL_OR_KEYWORD)]
    args = args if varargs else args[:len(positional)]
    kw = {k: v for k, v in kw.items() if varkw or (k in params and k not in
                                                    {p.name for p in positional[:len(args)]})}
    if "rule" in params and rule is not None:
        kw["rule"] = rule
    return fn(*args, **kw)


def decide(version: dict[str, Any], args: tuple, kw: dict[str, Any],
           records: pd.DataFrame | None = None) -> tuple[str, str]:
    """(verdict, key number) of a stored version of a claim's rule on today's inputs
    (``args``/``kw`` as today's notebook hands the verdict function; ``records``: the
    committed records of the claim's studies, for rules that read them)."""
    code = version["code"]
    if code is None:
        raise RuleError(f"no rule at {version['commit'][:7]}")
    where = f"{code['path']}:{code['entry']} at {version['commit'][:7]}"
    try:
        if code["kind"] == "notebook":
            names = NOTEBOOK_INPUTS[code["path"]](version["claim"], args, kw, records)
            return run_notebook_code(version, names)
        fn = load_function(version)
        make = FUNCTION_INPUTS.get(code["entry"])
        if make is not None:
            args, kw = make(args, kw, records)
        out = _call(fn, args, kw, (version["entry"] or {}).get("rule"))
        return word(out), key_number(out)
    except RuleError:
        raise
    except KeyError as e:
        if code["kind"] == "notebook" and code["path"] not in NOTEBOOK_INPUTS:
            raise RuleError(f"{where}: no inputs known for {code['path']}") from None
        raise RuleError(f"{where}: {type(e).__name__}: {e}") from None
    except Exception as e:  # any failure of old code on today's tables, named
        raise RuleError(f"{where}: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
                        if str(e) else f"{where}: {type(e).__name__}") from None


# --------------------------------------------- today's inputs under the names of older code

def _hw_list(*frames: pd.DataFrame) -> list[str]:
    return sorted({h for f in frames if isinstance(f, pd.DataFrame) and len(f)
                   and "hardware" in f for h in f["hardware"].unique()})


def _rl_throughput(claim: str, args: tuple, kw: dict, records) -> dict[str, Any]:
    """Notebook 03's variables: ``sp`` (FP8 speedups), ``mem`` (update memory), ``stores``
    (the fp8_stores records), ``HW`` (the hardware measured)."""
    empty = pd.DataFrame(columns=["hardware", "value", "sizes", "network", "width",
                                  "num_envs", "recipe", "emulated", "baseline", "e2e",
                                  "update", "update_memory_bytes"])
    sp = mem = stores = empty
    if claim in ("A2", "A9"):
        sp = args[0]
    elif claim == "A3":
        sp = args[0]  # today's projection rows: the native same-call ratios it projects
    elif claim == "A4":
        mem = args[0]
    elif claim == "A1":
        t = args[0]
        stores = pd.DataFrame({"value": t["stores"].astype(float), "hardware": t["hardware"],
                               "sizes": [{"variant": v} for v in t["variant"]]}) if len(t) \
            else empty
    return {"sp": sp, "mem": mem, "stores": stores, "HW": _hw_list(sp, mem, stores),
            "table": mem, "df": records if records is not None else empty}


def _rl_quality(claim: str, args: tuple, kw: dict, records) -> dict[str, Any]:
    """Notebook 04's variables: ``poi``, ``HWQ``, ``evidence``, ``used_envs``, ``pool``
    (diverged seeds per variant), ``df`` (the same-seed check), ``repeat``."""
    poi, ev = args[0], args[1]
    hw = getattr(ev, "hardware", "none")
    diverged = args[2] if claim == "A8" and len(args) > 2 else {}
    same_seed = args[2] if claim == "A10" and len(args) > 2 else None
    repeat = args[3] if claim == "A10" and len(args) > 3 else pd.DataFrame(
        columns=["hardware", "identical"])
    envs = list(getattr(ev, "envs", ()))
    pool = pd.DataFrame({"hardware": hw, "env": envs[0] if envs else "", "variant":
                         list(diverged), "diverged": [int(v) for v in diverged.values()]},
                        columns=["hardware", "env", "variant", "diverged"])
    df = pd.DataFrame({"metric": ["same_seed_identical"], "hardware": [hw],
                       "value": [1.0 if same_seed else 0.0]}) if same_seed is not None else \
        pd.DataFrame(columns=["metric", "hardware", "value"])
    return {"poi": poi, "HWQ": hw, "evidence": getattr(ev, "profile", "full"),
            "used_envs": envs, "pool": pool, "df": df,
            "repeat": repeat}


def _formats(claim: str, args: tuple, kw: dict, records) -> dict[str, Any]:
    """Notebook 01's variables: ``checks``, the quantized tensor ``t`` (its sizes), the
    mismatch counts, the error table ``flat``, the machine ``HW``."""
    checks, mismatches, sizes, err, hardware, has_fp4 = args[:6]
    flat = pd.DataFrame({"median": [err]}, index=pd.MultiIndex.from_tuples(
        [("NVFP4", "per block (16, E4M3) + FP32 tensor")], names=["format", "scaling"]))
    t = SimpleNamespace(q=SimpleNamespace(size=sizes[0]),
                        block_scale=SimpleNamespace(size=sizes[1]))
    return {"checks": checks, "t": t, "mism_q": mismatches[0], "mism_s": mismatches[1],
            "flat": flat, "HW": SimpleNamespace(slug=hardware, has_fp4=has_fp4),
            "P": {"profile": "full"}}


#: notebook -> today's inputs of a claim's verdict under the names its own verdict code read
NOTEBOOK_INPUTS: dict[str, Callable[[str, tuple, dict, Any], dict[str, Any]]] = {
    "notebooks/01_formats.py": _formats,
    "notebooks/03_rl_throughput.py": _rl_throughput,
    "notebooks/04_rl_quality.py": _rl_quality,
}

def reads_records(version: dict[str, Any]) -> bool:
    """Whether a version of a rule reads the committed records themselves rather than the
    tables today's verdict is given (:data:`RECORD_READERS`)."""
    code = version.get("code") or {}
    return code.get("kind") == "function" and code.get("entry") in RECORD_READERS


#: older verdict functions that read the records themselves
RECORD_READERS = frozenset({"b3_verdict"})

#: older verdict function -> (args, kwargs) it took, from today's inputs and the records
FUNCTION_INPUTS: dict[str, Callable[[tuple, dict, Any], tuple[tuple, dict]]] = {
    # it read the lm records themselves (stored bytes), today's rule their ratios
    "b3_verdict": lambda args, kw, records: ((records,), {}),
    # the gaps to BF16 alone (its other parameters were its thresholds)
    "b4_verdict": lambda args, kw, records: ((args[0],), {}),
}
