"""Program fingerprints: the computation a record measured, as a hash of its traced program.

A record's number comes from one computation (a timed training step, a trained function, a
decode step, a physics loop) and from the small measuring kit around it (how it is timed, the
statistic the record holds). A study says, per cell, which computation each record measures,
as a :class:`Program`: the function and abstract arguments (``jax.ShapeDtypeStruct`` pytrees:
the cell's exact shapes and dtypes), built from the cell's settings alone, plus the kit's
functions. :func:`trace` turns it into a :class:`Traced`:

* ``hash``: sha256 of the program's jaxpr, traced for the record's platform and device kind
  (:func:`repro.hardware.target`, so a CPU traces the code paths a GPU ran), printed
  canonically (no addresses; jaxprs carry no source locations), with the values of the
  constants the program captures (code tables, literals) hashed too;
* ``kit``: sha256 of the kit functions' syntax trees, docstrings left out. The kit is what
  shapes the number outside the traced program (the timing loop, the statistic, a size the
  record reports), not how the program is built (its trace holds that) nor how the record
  is labelled;
* ``files``: the hash of every checkout file whose code ran (or that was opened) while the
  program was traced. While these hashes are unchanged, so is the program: the cheap check
  that spares a retrace (:mod:`repro.provenance`).

Nothing else enters: the runner, config checking, results I/O, the command line, notebooks,
docstrings and error messages are outside the hash, so editing them stales no record; adding a
recipe stales no other recipe's records; a change to one recipe's cast stales exactly the
records that ran it. The program's text is kept (``results/programs/<hash>.txt.gz``) so that
``repro status`` can show the first equation that differs.
"""

from __future__ import annotations

import ast
import builtins
import functools
import gzip
import hashlib
import inspect
import io
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from repro import checkout
from repro.fingerprint import dump, file_hash, strip_docstrings, text_hash

TEXTS = "programs"  # under the results root: <hash>.txt.gz, the canonical program texts


@dataclass(frozen=True)
class Program:
    """What one record measured: ``fn(*args)`` (``args``: pytrees of
    ``jax.ShapeDtypeStruct`` or arrays) and the measuring ``kit`` (functions whose code
    shapes the number: the timing loop, the statistic). ``settings``: ``{name: hash}`` of
    inputs the program was built from that no traced file holds (the runner adds the
    hash of the study's params.yaml section, :func:`params_entry`): kept with the files, so
    that a change there is seen without a trace."""

    fn: Callable
    args: tuple = ()
    kit: tuple[Callable, ...] = ()
    settings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Traced:
    """A :class:`Program` traced for one platform: see the module docstring."""

    hash: str
    kit: str
    files: dict[str, str]
    platform: str
    device_kind: str
    text: str = field(repr=False, default="")

    def stamp(self) -> dict[str, Any]:
        """The record's ``program`` field."""
        import jax

        return {"hash": self.hash, "kit": self.kit, "files": dict(sorted(self.files.items())),
                "platform": self.platform, "device_kind": self.device_kind,
                "python": python_minor(), "jax": jax.__version__}


def python_minor() -> str:
    """What ``files``' syntax-tree hashes depend on of Python: nothing ("3.x": they are
    printed without the fields a minor version adds, :func:`repro.fingerprint.dump`)."""
    return "3.x"


# ------------------------------------------------------------------------ canonical text

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def canonical(closed) -> str:
    """The printed jaxpr of a ``ClosedJaxpr`` without object addresses, followed by one line
    per captured constant (dtype, shape, sha256 of its bytes)."""
    import numpy as np

    text = _ADDRESS.sub("", str(closed.jaxpr))
    lines = [text]
    for i, c in enumerate(closed.consts):
        a = np.asarray(c)
        lines.append(f"const {i}: {a.dtype}{list(a.shape)} "
                     f"{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]}")
    return "\n".join(lines) + "\n"


def kit_sources(kit: Iterable[Callable]) -> list[dict[str, str]]:
    """The kit functions as :func:`kit_hash_of` reads them: ``{"src": source}``, or
    ``{"name": qualified name}`` for a function without source (a builtin)."""
    out = []
    for f in kit:
        f = inspect.unwrap(f)
        try:
            out.append({"src": textwrap.dedent(inspect.getsource(f))})
        except (OSError, TypeError):
            out.append({"name": f"{getattr(f, '__module__', '')}."
                                f"{getattr(f, '__qualname__', f)}"})
    return out


def kit_hash_of(parts: Iterable[dict[str, str]]) -> str:
    """sha256 of :func:`kit_sources`' syntax trees (docstrings and comments left out, printed
    alike by every Python version: :func:`repro.fingerprint.dump`), in the order given."""
    return text_hash("\n".join(dump(strip_docstrings(ast.parse(p["src"]))) if "src" in p
                               else p["name"] for p in parts))


def kit_hash(kit: Iterable[Callable]) -> str:
    """:func:`kit_hash_of` the kit functions, in the order given."""
    return kit_hash_of(kit_sources(kit))


# ------------------------------------------------------------------------------ tracing


class _Files:
    """The checkout files whose code runs (``sys.setprofile``) or that are opened while
    active."""

    def __init__(self, root: Path):
        self.root = str(root.resolve()) + "/"
        self.seen: set[str] = set()

    def ours(self, path: str) -> bool:
        """A file of the checkout, not of an environment inside it (``.venv``)."""
        return path.startswith(self.root) and "site-packages" not in path \
            and "/." not in path[len(self.root) - 1:]

    def _profile(self, frame, event, arg):
        if event == "call":
            f = frame.f_code.co_filename
            if f not in self.seen and self.ours(f):
                self.seen.add(f)

    def __enter__(self):
        self._open, self._io_open = builtins.open, io.open
        seen, real, ours = self.seen, builtins.open, self.ours

        def opened(file, *a, **k):
            if isinstance(file, (str, Path)):
                p = str(Path(file).resolve())
                if ours(p):
                    seen.add(p)
            return real(file, *a, **k)

        builtins.open = io.open = opened
        self._old = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._old)
        builtins.open, io.open = self._open, self._io_open


def _kept() -> Callable[[str], bool]:
    """Which files a trace keeps: the tracked ones (a build artifact the trace opened, such
    as an installed package's metadata, is no file of the program: a fresh clone lacks it);
    without git, those outside build folders and package metadata."""
    tracked = checkout.tracked()
    if tracked is not None:
        return lambda rel: rel in tracked or rel.startswith(PARAMS_PREFIX)
    return lambda rel: not (rel.startswith(("build/", "dist/")) or ".egg-info/" in rel)


def trace(program: Program, platform: str, device_kind: str = "") -> Traced:
    """Trace ``program`` for ``platform`` / ``device_kind`` (on whatever device this process
    has) and fingerprint it; see the module docstring."""
    import jax

    from repro import hardware

    with hardware.target(platform, device_kind), _Files(checkout.CHECKOUT) as files:
        closed = jax.make_jaxpr(program.fn)(*program.args)
    text = canonical(closed)
    files.seen.discard(str(Path(__file__).resolve()))  # the harness that traced it
    for f in program.kit:  # the kit's own files: an edit there must be seen without a trace
        try:
            files.seen.add(str(Path(inspect.getsourcefile(inspect.unwrap(f))).resolve()))
        except (TypeError, OSError):
            continue
    hashes = {}
    kept = _kept()
    for f in sorted(files.seen):
        p = Path(f)
        if p.is_file() and files.ours(str(p)) and kept(checkout.rel(p)):
            hashes[checkout.rel(p)] = file_hash(p)
    hashes.update(program.settings)
    return Traced(text_hash(text), kit_hash(program.kit), hashes, platform, device_kind, text)


PARAMS_PREFIX = "params.yaml#"


def params_entry(section: str, raw: dict | None = None, profile: str | None = None
                 ) -> dict[str, str]:
    """``{"params.yaml#SECTION@PROFILE": hash}``: the hash of what a run of ``profile`` reads
    of a params.yaml section, as data (its ``common`` part and its ``profile``'s; comments,
    layout and the other profiles do not count: an edit of the smoke profile leaves a
    full-profile record's settings alone), for a program's ``settings``. Without ``profile``,
    ``{"params.yaml#SECTION": hash}`` of the whole section (every profile), as records made
    before per-profile settings name it."""
    import json

    from repro import config

    data = (raw if raw is not None else config.load_params()).get(section)
    if profile is None:
        return {PARAMS_PREFIX + section: text_hash(json.dumps(data, sort_keys=True,
                                                              default=str))}
    part = {k: (data or {}).get(k) for k in ("common", profile)} if isinstance(data, dict) \
        else data
    return {f"{PARAMS_PREFIX}{section}@{profile}": text_hash(json.dumps(part, sort_keys=True,
                                                                        default=str))}


def params_key(rel: str) -> tuple[str, str | None]:
    """(section, profile) of a ``params.yaml#SECTION[@PROFILE]`` settings key."""
    section, _, profile = rel.removeprefix(PARAMS_PREFIX).partition("@")
    return section, profile or None


def with_settings(prog: Program, section: str | None, profile: str = "full") -> Program:
    """``prog`` with the hash of what a run of ``profile`` reads of the params.yaml
    ``section`` its cells read their settings from among its ``settings``
    (:func:`params_entry`); unchanged where the study has no section."""
    import dataclasses

    if not section:
        return prog
    return dataclasses.replace(prog, settings={**prog.settings,
                                               **params_entry(section, profile=profile)})


# -------------------------------------------------------------------------- the texts


def save_text(root: Path, traced: Traced, what: str = "") -> Path:
    """Keep the canonical text of ``traced`` as ``<root>/programs/<hash>.txt.gz`` (once); a
    failed write raises :func:`repro.results.write_error` naming ``what`` it was for."""
    from repro.results import write_error

    path = Path(root) / TEXTS / f"{traced.hash}.txt.gz"
    if path.exists():
        return path
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # mtime 0: the same text always gives the same bytes
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(traced.text.encode())
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(what or f"the text of program {traced.hash[:12]}", path, e) from None
    return path


def load_text(root: Path, digest: str) -> str | None:
    path = Path(root) / TEXTS / f"{digest}.txt.gz"
    try:
        return gzip.decompress(path.read_bytes()).decode()
    except OSError:
        return None


@functools.lru_cache(maxsize=1024)  # many records of one cell share both texts
def first_difference(old: str | None, new: str) -> str:
    """The first line of ``new`` that differs from ``old`` (the end of their common prefix of
    lines), shortened (or why none can be named)."""
    if old is None:
        return "the recorded program's text is not kept"
    a, b = old.splitlines(), new.splitlines()
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if i == len(a) == len(b):
        return "texts equal"
    line = (b[i] if i < len(b) else a[i]).strip()
    return f"line {i + 1}: {line[:160]}"
