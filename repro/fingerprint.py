"""Fingerprints of code: the import closure of a module, syntax-tree hashes of its files, and
the versions of the packages it imports.

A source file's hash is the sha256 of its syntax tree without docstrings, printed alike by
every Python version (:func:`dump`): comments, docstrings, layout and the Python minor version
do not change it. Any other file is hashed byte for byte. A study's ``code`` fingerprint
(:func:`code`) holds one hash per file on its static import closure (:func:`closure`:
``import repro...`` statements followed, lazy ones too; data files it declares hashed byte for
byte), and a record's ``versions`` (:func:`versions`) the packages on that closure. What these
fingerprints decide, and when a record is stale, is :mod:`repro.provenance`'s. Nothing here
imports JAX or the rest of the package but :mod:`repro.checkout`.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sys
from pathlib import Path
from typing import Any, Iterable

from repro import checkout

PACKAGE = "repro"
LOCK = "requirements.lock"
HASH_CHARS = 16  # the first 64 bits of each sha256: enough to tell versions of a file apart
# Versions a record must share with the lock to count as made by this environment.
LOCKED = ("jax", "jaxlib", "flax")
# Always recorded where installed, whatever the study imports.
CORE = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes")
# Installed distributions whose versions matter to GPU numbers (CUDA plugins and libraries).
_ACCELERATOR_DISTS = re.compile(r"^(jax[-_]cuda|jax[-_]rocm|nvidia[-_]|transformer[-_]engine)",
                                re.I)


# ------------------------------------------------------------------------- the closure


def module_file(name: str) -> Path | None:
    """The source file of module ``name``: under the checkout for ``repro...`` (no import),
    else that of an already imported module (a study defined outside the package)."""
    if name == PACKAGE or name.startswith(PACKAGE + "."):
        base = checkout.CHECKOUT.joinpath(*name.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None
    file = getattr(sys.modules.get(name), "__file__", None)
    return Path(file) if file and file.endswith(".py") else None


def module_name(path: Path) -> str | None:
    """The dotted name of the checkout's file ``path`` (None: outside the checkout)."""
    try:
        parts = list(path.resolve().relative_to(checkout.CHECKOUT).with_suffix("").parts)
    except ValueError:
        return None
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=512)
def _tree(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_bytes(), filename=path)


def parse(path: Path) -> ast.Module:
    """The syntax tree of a source file (kept while the file is unchanged: do not edit it)."""
    st = path.stat()
    return _tree(str(path), st.st_mtime_ns, st.st_size)


def resolve_from(node: ast.ImportFrom, here: str | None, is_pkg: bool) -> str:
    """The absolute module an ``from ... import`` statement of module ``here`` names."""
    if not node.level:
        return node.module or ""
    base = (here or "").split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(``repro`` modules whose code the file's import statements run, top-level names of
    the other modules it imports), from every import statement in the file."""
    tree, here = parse(path), module_name(path)
    is_pkg = path.name == "__init__.py"
    ours, theirs = set(), set()

    def note(name: str) -> None:
        top = name.split(".")[0]
        ours.add(name) if top == PACKAGE else theirs.add(top)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                note(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(node, here, is_pkg)
            if not base or base.split(".")[0] != PACKAGE:
                note(base or "")
                continue
            attrs = [a.name for a in node.names
                     if a.name == "*" or module_file(f"{base}.{a.name}") is None]
            ours.update(f"{base}.{a.name}" for a in node.names if a.name not in attrs)
            if attrs:  # names defined by the package's (or module's) own file
                ours.add(base)
    theirs.discard("")
    return ours, theirs - set(sys.stdlib_module_names) - {"__future__"}


def closure(module: str | Path) -> tuple[list[Path], set[str]]:
    """(the source files of ``module`` (a module name, or the path of a file such as a
    notebook) and of every ``repro`` module it reaches through import statements, sorted;
    the top-level names of every other module they import)."""
    seen: dict[str, Path] = {}
    others: set[str] = set()
    todo: list[str | Path] = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = name if isinstance(name, Path) else module_file(name)
        if path is None or not path.is_file():
            if name == module:
                raise ValueError(f"no source file for module {module!r}")
            continue
        seen[name] = path
        ours, theirs = imports(path)
        others |= theirs
        todo.extend(sorted(ours - set(seen)))
    return sorted(set(seen.values()), key=checkout.rel), others


# --------------------------------------------------------------------------- hashing


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` (changed in place) without its docstrings: a body left empty holds ``pass``."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        kept = [s for s in body if not (isinstance(s, ast.Expr)
                                         and isinstance(s.value, ast.Constant)
                                         and isinstance(s.value.value, str))]
        node.body = kept or [ast.Pass()]
    return tree


def dump(node: Any) -> str:
    """A syntax tree printed without the fields a Python version adds empty (3.12's
    ``type_params=[]``) or leaves unset: the same text under Python 3.11, 3.12 and 3.13 for
    code that any of them parses."""
    if isinstance(node, ast.JoinedStr):  # 3.12 adds empty parts to format specs
        node = ast.JoinedStr(values=[v for v in node.values if not (
            isinstance(v, ast.Constant) and v.value == "")])
    if isinstance(node, ast.AST):
        fields = [f"{name}={dump(value)}" for name, value in ast.iter_fields(node)
                  if value is not None and value != []]
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(dump(v) for v in node) + "]"
    return repr(node)


def text_hash(text: str) -> str:
    """sha256 (first :data:`HASH_CHARS` hex digits) of a text."""
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def source_text_hash(source: bytes | str, filename: str = "<source>") -> str:
    """:func:`source_hash` of a source text."""
    return text_hash(dump(strip_docstrings(ast.parse(source, filename=filename))))


@functools.lru_cache(maxsize=512)
def _source_hash(path: str, mtime_ns: int, size: int) -> str:
    return source_text_hash(Path(path).read_bytes(), path)


def source_hash(path: Path) -> str:
    """sha256 (first :data:`HASH_CHARS` hex digits) of the file's syntax tree without
    docstrings (:func:`dump`): comments, docstrings, layout and the Python minor version do
    not change it."""
    st = path.stat()
    return _source_hash(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _bytes_hash(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:HASH_CHARS]


def data_hash(path: Path) -> str:
    """sha256 (first :data:`HASH_CHARS` hex digits) of the file's bytes."""
    st = path.stat()
    return _bytes_hash(str(path), st.st_mtime_ns, st.st_size)


def file_hash(path: Path) -> str:
    """The hash kept for a checkout file: :func:`source_hash` for Python source,
    :func:`data_hash` for anything else."""
    return source_hash(path) if path.suffix == ".py" else data_hash(path)


def digest(files: dict[str, str]) -> str:
    """One hash of every (file, hash) pair."""
    return text_hash("\n".join(f"{k} {v}" for k, v in sorted(files.items())))


def code(module: str, data: Iterable[str] = ()) -> dict[str, Any]:
    """The ``code`` field of a record made by ``module``: ``{"module", "files": {path:
    hash}, "data": [paths], "digest"}``; ``data``: data files (paths in the checkout)."""
    paths, _ = closure(module)
    files = {checkout.rel(p): source_hash(p) for p in paths}
    data = sorted(data)
    for rel in data:
        path = checkout.CHECKOUT / rel
        if not path.is_file():
            raise ValueError(f"{module}: declared data file {rel} does not exist")
        files[rel] = data_hash(path)
    return {"module": module, "files": files, "data": data, "digest": digest(files)}


# -------------------------------------------------------------------------- versions


@functools.cache
def _distributions() -> dict[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _accelerator_versions() -> dict[str, str]:
    """CUDA runtime, cuDNN, driver ... versions as JAX's CUDA plugin reports them, where JAX
    is imported and has one (nothing on a CPU)."""
    if "jax" not in sys.modules:
        return {}
    try:
        from jax._src.lib import cuda_versions
    except ImportError:
        return {}
    out = {}
    for name in dir(cuda_versions or ()):
        if name.endswith("_get_version"):
            try:
                out[name.removesuffix("_get_version")] = str(getattr(cuda_versions, name)())
            except Exception:  # noqa: BLE001 - a library the plugin cannot load: not recorded
                continue
    return out


def versions(imported: Iterable[str] = ()) -> dict[str, str]:
    """``{distribution: version}`` of the :data:`CORE` packages, of the distributions that
    provide the top-level modules ``imported``, of installed CUDA plugins and libraries, plus
    the CUDA versions JAX reports and ``python``."""
    from importlib.metadata import PackageNotFoundError, distributions, version

    names = set(CORE)
    for mod in imported:
        names.update(_distributions().get(mod, ()))
    names.update(d.metadata["Name"] for d in distributions()
                 if d.metadata["Name"] and _ACCELERATOR_DISTS.match(d.metadata["Name"]))
    out = {}
    for name in sorted(names, key=str.lower):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    out.update(_accelerator_versions())
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    return out


def installed(name: str) -> str | None:
    """The installed version of distribution ``name`` (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def study_stamp(module: str, data: Iterable[str] = ()) -> dict[str, Any]:
    """``{"code": code fingerprint, "versions": versions}`` for the records of a study run."""
    fingerprint = code(module, data)
    _, others = closure(module)
    return {"code": fingerprint, "versions": versions(others)}


def locked_versions(lock: Path | None = None) -> dict[str, str]:
    """``{name: version}`` of the ``name==version`` lines of ``requirements.lock`` (lower
    case, ``_`` as ``-``); empty where there is no lock."""
    path = lock or checkout.CHECKOUT / LOCK
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if m := re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)", line):
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out
