"""This checkout: where it is, which files git tracks, its history and the commit a record names.

Every call to git is made here (:func:`git`), and every path is taken relative to the checkout
here: the package's own (:data:`CHECKOUT`, the one whose code a record's fingerprint hashes)
and the repository root the ``repro`` command reads and writes (:func:`repo_root`: params.yaml,
results/, build/). Nothing here imports the rest of the package.
"""

from __future__ import annotations

import bisect
import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Iterable

# The checkout the running `repro` was imported from (tests point it at a copy).
CHECKOUT = Path(__file__).resolve().parent.parent
# What every checkout holds at its root (REPRO_ROOT is checked for them).
CHECKOUT_MARKS = ("params.yaml", "results/")
# A commit hash as records and REPRO_GIT_COMMIT give it (a prefix of 7 or more hex digits).
HASH = re.compile(r"[0-9a-f]{7,40}")


def rel(path: Path) -> str:
    """``path`` relative to the checkout (posix), or as given where it lies outside."""
    try:
        return path.resolve().relative_to(CHECKOUT).as_posix()
    except ValueError:
        return str(path)


def is_root(folder: Path) -> bool:
    """A checkout of this repository: ``params.yaml`` beside the ``repro`` package."""
    return (folder / "params.yaml").is_file() and (folder / "repro" / "__init__.py").is_file()


def repo_root() -> Path:
    """The repository root, where params.yaml, results/ and build/ are: ``REPRO_ROOT`` where set
    (a folder holding params.yaml and results/, or a one-line ``ValueError`` naming it: a
    mistyped root must not read as a repository with nothing measured); else the nearest
    checkout (:func:`is_root`) at or above the working directory, so each checkout that shares
    a virtual environment reads and writes its own records; else the checkout this package was
    imported from; else a one-line ``ValueError`` naming the working directory."""
    if env := os.environ.get("REPRO_ROOT"):
        if not Path(env).is_dir():
            what = "not a folder" if Path(env).exists() else "no such folder"
            raise ValueError(f"REPRO_ROOT={env}: {what} (the repository root, where "
                             "params.yaml, results/ and build/ are)")
        missing = [m for m in CHECKOUT_MARKS if not (
            (Path(env) / m).is_dir() if m.endswith("/") else (Path(env) / m).is_file())]
        if missing:
            raise ValueError(f"REPRO_ROOT={env}: not a checkout of this repository (no "
                             f"{', '.join(missing)} in it)")
        return Path(env)
    cwd = Path.cwd()
    if found := next((d for d in (cwd, *cwd.parents) if is_root(d)), None):
        return found
    here = Path(__file__).resolve().parent.parent
    if (here / "dvc.yaml").exists():
        return here
    raise ValueError(f"no checkout of this repository at or above {cwd} (a folder with "
                     "params.yaml, results/ and the repro package): run repro in one, or set "
                     "REPRO_ROOT to one")


# The repository's committed folders: no path a user sets may lead a command to write there.
COMMITTED = ("results", "figures", "verdicts", "metrics")


def inside_repository(what: str, value: str | Path, root: Path, under: str | None = None,
                      error: type[Exception] = ValueError, relative_to: Path | None = None
                      ) -> Path:
    """``value`` resolved (relative to ``relative_to``, default the working directory;
    symbolic links followed), or one line starting with ``what`` (the option as given): it
    must lie inside the repository ``root`` (under its folder ``under`` where given) and
    outside its committed folders (:data:`COMMITTED`)."""
    root = Path(root).resolve()
    path = Path(value).expanduser()
    path = (Path(relative_to or Path.cwd()) / path).resolve()
    for folder in COMMITTED:
        if path.is_relative_to(root / folder):
            raise error(f"{what}: resolves into {folder}/, which holds committed files (only "
                        "`repro record --profile full` writes under results/)")
    base = root / under if under else root
    if not path.is_relative_to(base):
        where = f"the repository's {under}/ ({base})" if under else f"the repository ({root})"
        raise error(f"{what}: resolves to {path}, outside {where}")
    return path


# ---------------------------------------------------------------------------------- git


def git(*args: str, cwd: Path | str | None = None, timeout: float = 30
        ) -> subprocess.CompletedProcess | None:
    """``git ARGS`` run in ``cwd`` (default :data:`CHECKOUT`), its output as bytes; None
    where git cannot run (not installed, a timeout)."""
    try:
        return subprocess.run(["git", *args], cwd=cwd or CHECKOUT, capture_output=True,
                              timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None


def _text(out: subprocess.CompletedProcess | None) -> str | None:
    """The standard output of a git call that succeeded, as text; else None."""
    return out.stdout.decode() if out is not None and out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def tracked() -> frozenset[str] | None:
    """The checkout's files git tracks (None: no git here, as in a copy on a GPU machine)."""
    out = _text(git("ls-files", "-z"))
    return None if out is None else frozenset(out.split("\0")) - {""}


def first_change(commit: str, paths: Iterable[str]) -> str | None:
    """The first commit after ``commit`` that touched one of ``paths`` (``git log``), or
    ``"uncommitted"`` when none did (the change is in the working tree); None without git
    or when ``commit`` is not in this repository's history."""
    commit = commit.removesuffix("-dirty")
    if not re.fullmatch(r"[0-9a-f]{4,40}", commit):
        return None
    out = _text(git("log", "--reverse", "--format=%h", f"{commit}..HEAD", "--", *paths,
                    timeout=20))
    if out is None:
        return None
    first = out.split()
    return first[0] if first else "uncommitted"


class History:
    """The commits of a repository's history (HEAD's ancestors) and their times."""

    def __init__(self, top: str, log: str):
        self.top = top
        self.times = {h: int(t) for h, t in (line.split() for line in log.splitlines())}
        self.commits = sorted(self.times)

    def time_of(self, commit: str) -> int | None:
        """The commit time (seconds since 1970) of ``commit``, a hash or a prefix of 7 or
        more hex digits; None where it is not a commit of this history."""
        if not HASH.fullmatch(commit):
            return None
        i = bisect.bisect_left(self.commits, commit)
        return self.times[self.commits[i]] if i < len(self.commits) and \
            self.commits[i].startswith(commit) else None


def history(folder: Path) -> History | None:
    """The git history of the repository holding ``folder``, or None where there is none to
    check commits against: no git, no repository (a copy of the tree without .git), or a
    shallow clone (a commit beyond its depth is missing, not absent)."""
    out = git("-C", str(folder), "rev-parse", "--show-toplevel", "--is-shallow-repository",
              "HEAD")
    if out is None:
        return None
    lines = out.stdout.decode().splitlines()
    if out.returncode or len(lines) != 3 or lines[1].strip() != "false":
        return None
    return _history(lines[0], lines[2].strip())


@functools.lru_cache(maxsize=8)
def _history(top: str, head: str) -> History | None:
    out = _text(git("-C", top, "log", "--format=%H %ct", head, timeout=60))
    return None if out is None else History(top, out)


@functools.cache
def git_commit() -> str:
    """The commit that produced a record (``REPRO_GIT_COMMIT`` wins: the GPU machine gets a
    copy of the working tree without .git). ``REPRO_GIT_COMMIT`` must be a commit hash (7 to
    40 hex digits, optionally ``-dirty``) and, where this checkout has its history, one of
    its commits: else a one-line ``ValueError`` naming it (the study runner asks before the
    first cell runs)."""
    if env := os.environ.get("REPRO_GIT_COMMIT"):
        base = env.strip().removesuffix("-dirty")
        if not HASH.fullmatch(base):
            raise ValueError(f"REPRO_GIT_COMMIT={env}: not a commit (7 to 40 hex digits, "
                             "optionally -dirty)")
        known = history(repo_root())
        if known is not None and known.time_of(base) is None:
            raise ValueError(f"REPRO_GIT_COMMIT={env}: not a commit of the history of "
                             f"{known.top}")
        return env
    root = repo_root()
    commit = (_text(git("rev-parse", "--short=12", "HEAD", cwd=root, timeout=10)) or
              "").strip() or "unknown"
    if commit == "unknown":
        return commit
    dirty = _text(git("status", "--porcelain", "--untracked-files=no", cwd=root, timeout=10))
    return commit + ("-dirty" if (dirty or "").strip() else "")
