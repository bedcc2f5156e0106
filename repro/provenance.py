"""Whether a record still describes this code: program fingerprints, file fingerprints,
versions.

A record made by a cell that names its programs (``Cell.programs``) carries ``program``
(:mod:`repro.program`): the hash of the jaxpr of the computation it measured, traced for its
platform, the hash of its measuring kit, and the hashes of the checkout files that ran while it
was traced. It is *stale* (:class:`Checker`) when

* its program or kit at HEAD differs: checked without tracing while every file its trace ran
  is unchanged (and the Python minor version is the same, whose syntax trees those hashes are),
  else traced again here (cached in ``build/cache/programs.json``); the reason names the
  recipe and the first line of the program text that differs (texts are kept in
  ``results/programs/``); a program that cannot be traced here is stale with the reason why;
* the versions that compile it differ from the lock of its platform (:data:`PLATFORM_LOCKS`,
  else ``requirements.lock``): jax and jaxlib for speed records, every locked package it
  recorded for quality records (:func:`version_reasons`).

A record without a program fingerprint is judged as before programs existed: by ``code``, one
hash per source file on the study's static import closure (:func:`repro.fingerprint.code`),
stale when any of them changed, and by jax/jaxlib/flax against the lock. ``since`` is the
first commit after the record's that touched a changed file. Nothing here imports JAX unless
a program must be traced.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from repro import catalogue, checkout, fingerprint
from repro.fingerprint import LOCK, LOCKED


# Experiments (and their record folders) whose records are training quality (returns, losses,
# bitwise repeats): a stale one still yields its verdict, marked stale. Other experiments'
# stale records are left out of verdicts unless their metric is one of QUALITY_METRICS: how
# well a run learned or how close a result is to its reference, not how fast or how large it
# is (the legged study's returns sit beside its timings, the inference study's accuracy beside
# its speed). Both come from each experiment's entry in repro.catalogue.
QUALITY_EXPERIMENTS = catalogue.QUALITY_EXPERIMENTS
QUALITY_METRICS = catalogue.QUALITY_METRICS


# ------------------------------------------------------------------------- staleness


@dataclass(frozen=True)
class Staleness:
    """Whether a record still describes this code: ``reason`` (one line) when it does not,
    ``since`` the first commit after the record's that changed a file on its path
    (``"uncommitted"``: the change is in the working tree only), ``changed`` those files;
    ``summary``: the reason without the record's own commit (the same for every record that
    is stale for the same reason)."""

    stale: bool
    reason: str | None = None
    since: str | None = None
    changed: tuple[str, ...] = ()
    summary: str | None = None


def _commit(rec: dict[str, Any]) -> str:
    commit = str(rec.get("git_commit") or "unknown")
    return commit[:7] + ("-dirty" if commit.endswith("-dirty") else "") \
        if re.match(r"[0-9a-f]{8,}", commit) else commit


#: Files of the tracing harness (not of any program) that older stamps list among a trace's files.
HARNESS = ("repro/program.py",)
#: ``program.python`` values whose file hashes are :func:`dump`'s, the same under every Python
#: minor version ("3.x"); older stamps hashed one minor version's own syntax-tree print.
PORTABLE_HASHES = ("3.x",)


def is_quality(rec: dict[str, Any]) -> bool:
    """Whether a record is training quality (returns, losses, agreement, bitwise repeats)
    rather than speed or size."""
    return rec.get("experiment") in QUALITY_EXPERIMENTS or rec.get("metric") in QUALITY_METRICS


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


#: Packages that compile a program: a speed record made with other versions timed another
#: executable, even where the program is the same.
COMPILERS = ("jax", "jaxlib")
#: Packages whose code shapes a trained result outside its traced program (MuJoCo's models
#: and its C engine behind MJX, brax's and Playground's environment assets).
OUTSIDE = ("mujoco", "mujoco-mjx", "brax", "playground")


def version_reasons(rec: dict[str, Any], lock: dict[str, str], lock_name: str = LOCK
                    ) -> list[str]:
    """Why ``rec``'s package versions do not describe this environment (empty: they do).

    A record with a program fingerprint is compared on :data:`COMPILERS` where it is speed
    (flax and the rest shape the program, which the fingerprint already covers: their code is
    traced into it, and what numpy computes lands in it as constants), and also on
    :data:`OUTSIDE` where it is quality (packages whose code shapes a trained result outside
    the traced program: a physics engine's compiled kernels and models). A record without one
    is compared on :data:`LOCKED`, as when it was made. ``lock``: the versions of the lock
    of the record's platform (:data:`PLATFORM_LOCKS`), named ``lock_name``."""
    if isinstance(rec.get("program"), dict) and is_quality(rec):
        have = {_norm(k): v for k, v in (rec.get("versions") or {}).items()}
        have.update({k: rec[k] for k in LOCKED if rec.get(k)})
        names = [n for n in (*COMPILERS, *OUTSIDE) if n in have]
    else:
        have = {k: rec.get(k) for k in LOCKED}
        names = list(COMPILERS if isinstance(rec.get("program"), dict) else LOCKED)
    out = []
    for name in names:
        want, got = lock.get(name), have.get(name)
        if want and got and str(got) != want:
            out.append(f"recorded with {name} {got}; {lock_name} pins {want}")
    return out


#: Platforms that run their own image's JAX rather than the lock's (a TPU VM's JAX comes with
#: its libtpu): their records are compared with this lock of that image's versions instead.
PLATFORM_LOCKS = {"tpu": "requirements-tpu.lock"}


def record_platform(rec: dict[str, Any]) -> str:
    """The platform a record ran on: its program's, else its ``backend`` field."""
    prog = rec.get("program") if isinstance(rec.get("program"), dict) else {}
    plat = str(prog.get("platform") or rec.get("backend") or "")
    return "gpu" if plat in ("cuda", "rocm") else plat


LOCK_FIELD = "lock"  # a record's program traced with the lock's JAX at its commit


def judged_program(prog: dict[str, Any], jax_version: str | None) -> dict[str, Any]:
    """The fingerprint a record's program is judged by in an environment of ``jax_version``
    (the lock's): the program as traced where it ran; for a record made with its platform's
    own JAX (a TPU image's), its ``lock`` fingerprint (the same cell traced for the same
    device with the lock's JAX, in the checkout of the record's commit), so that this
    checkout can trace HEAD's program and compare, with no other JAX installed."""
    lock = prog.get(LOCK_FIELD)
    if prog.get("jax") and jax_version and prog["jax"] != jax_version and \
            isinstance(lock, dict) and lock.get("jax") == jax_version and lock.get("hash"):
        return {**prog, **{k: lock[k] for k in ("hash", "kit", "files", "jax", "python")
                           if k in lock}}
    return prog


PROGRAM_INDEX = ("results", "programs", "index.json")  # committed: HEAD's programs per cell
PROGRAM_CACHE = ("build", "cache", "programs.json")  # this machine's traces


def program_key(experiment: str, cell: str, key: str, platform: str, kind: str) -> str:
    return f"{experiment}/{cell}/{key}@{platform}:{kind}"


class Checker:
    """Decides :func:`staleness` for many records: hashes each file and traces each program
    at most once, and keeps the traces it made in ``build/cache/programs.json``."""

    def __init__(self, lock: Path | None = None, trace: bool = True,
                 programs: Callable[..., dict[str, Any] | str] | None = None):
        self.programs = programs
        self.lock = fingerprint.locked_versions(lock)
        self.platform_locks = {p: fingerprint.locked_versions(checkout.CHECKOUT / f) for p, f in
                               PLATFORM_LOCKS.items()}
        self.trace = trace
        self._now: dict[tuple, dict[str, Any] | str] = {}
        self._since: dict[tuple, str | None] = {}
        self._files: dict[str, str | None] = {}
        self._params: dict[str, Any] | None = None  # params.yaml, read once
        self._programs: dict[str, dict[str, Any] | str] = {}
        self._cells: dict[tuple, dict[str, Any] | str] = {}
        self._stored: dict[str, dict[str, Any]] | None = None
        self._env = {"jax": fingerprint.installed("jax"), "jaxlib": fingerprint.installed("jaxlib")}
        self.traced = 0  # programs traced by this checker (the rest came from a hash check)

    # ---------------------------------------------------------------- file fingerprints

    def current(self, module: str, data: tuple[str, ...]) -> dict[str, Any] | str:
        """The fingerprint of ``module`` now, or why there is none (one line)."""
        key = (module, data)
        if key not in self._now:
            try:
                self._now[key] = fingerprint.code(catalogue.FORMER.get(module, module), data)
            except (ValueError, OSError, SyntaxError) as e:
                self._now[key] = f"its code cannot be fingerprinted now ({e})"
        return self._now[key]

    def since(self, commit: str, changed: tuple[str, ...]) -> str | None:
        key = (commit, changed)
        if key not in self._since:
            self._since[key] = checkout.first_change(commit, changed)
        return self._since[key]

    def file_hash(self, rel_path: str) -> str | None:
        """The hash :func:`repro.program.trace` keeps for a checkout file now (None: gone),
        or for a params.yaml section (``params.yaml#SECTION``)."""
        if rel_path not in self._files and rel_path.startswith("params.yaml#"):
            from repro import program as P

            from repro import config

            try:
                if self._params is None:  # read once: every section hashes the same file
                    self._params = config.load_params()
                section, profile = P.params_key(rel_path)
                self._files[rel_path] = P.params_entry(section, self._params,
                                                       profile)[rel_path]
            except Exception:  # noqa: BLE001 - no params.yaml: the program cannot be checked
                self._files[rel_path] = None
        if rel_path not in self._files:
            try:
                self._files[rel_path] = fingerprint.file_hash(checkout.CHECKOUT / rel_path)
            except (OSError, SyntaxError, ValueError):
                self._files[rel_path] = None
        return self._files[rel_path]

    def unchanged(self, files: dict[str, str], python: str | None) -> bool:
        """Whether every file of a program's trace still hashes as it did (the syntax-tree
        hashes belong to one Python minor version: another one retraces)."""
        return bool(files) and python in PORTABLE_HASHES and all(
            self.file_hash(f) == h for f, h in files.items() if f not in HARNESS)

    def _code(self, rec: dict[str, Any]) -> tuple[str | None, str | None, str | None,
                                                  tuple[str, ...]]:
        """For a record without a program fingerprint: the file fingerprint of its study's
        import closure decides (reason with the record's commit, without it, since,
        changed files)."""
        code, commit = rec.get("code"), _commit(rec)
        if not isinstance(code, dict) or not code.get("digest"):
            return (f"recorded before code fingerprints, at commit {commit}; its code has "
                    "been restructured since"), "recorded before code fingerprints; the code "\
                "has been restructured since", None, ()
        now = self.current(str(code.get("module")), tuple(code.get("data") or ()))
        if isinstance(now, str):
            return now, now, None, ()
        if now["digest"] == code["digest"]:
            return None, None, None, ()
        old, new = code.get("files") or {}, now["files"]
        changed = tuple(sorted(f for f in set(old) | set(new) if old.get(f) != new.get(f)))
        since = self.since(commit, changed)
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4
                                          else "")
        when = {None: "", "uncommitted": " (uncommitted edits)"}.get(since, f" (since {since})")
        return (f"no program fingerprint, and its code changed after commit {commit}{when}: "
                f"{shown}", f"no program fingerprint, and its code changed{when}: {shown}",
                since, changed)

    # ------------------------------------------------------------- program fingerprints

    def _store(self) -> dict[str, dict[str, Any]]:
        """The committed index, then this machine's cache (later entries win)."""
        if self._stored is None:
            self._stored = {}
            for parts in (PROGRAM_INDEX, PROGRAM_CACHE):
                try:
                    self._stored.update(json.loads(checkout.CHECKOUT.joinpath(*parts).read_text()))
                except (OSError, ValueError):
                    continue
        return self._stored

    def _valid(self, entry: dict[str, Any]) -> bool:
        return (entry.get("jax") == self._env["jax"] and entry.get("jaxlib") ==
                self._env["jaxlib"] and self.unchanged(entry.get("files") or {},
                                                        entry.get("python")))

    def cell_programs(self, experiment: str, cell: str, profile: str = "full",
                      platform: str = "gpu", kind: str = "", rec: dict[str, Any] | None = None
                      ) -> dict[str, Any] | str:
        """``{key: Program}`` of a cell of ``experiment``, with their settings, as the program
        builder this checker was handed makes them (:func:`repro.studies.cell_programs`), or
        why there are none (one line)."""
        ckey = (experiment, cell, profile, platform, kind)
        if ckey in self._cells:
            return self._cells[ckey]
        if self.programs is None:
            out: dict[str, Any] | str = "no program builder was handed to the checker"
        else:
            try:
                out = self.programs(experiment, cell, profile, platform, kind, rec)
            except Exception as e:  # noqa: BLE001 - any failure is a reason, in one line
                out = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) \
                    else type(e).__name__
        if rec is None or not isinstance(out, str):
            self._cells[ckey] = out
        return out

    def program_now(self, experiment: str, cell: str, key: str, platform: str,
                    kind: str, profile: str = "full", rec: dict[str, Any] | None = None
                    ) -> dict[str, Any] | str:
        """HEAD's program fingerprint (a record's ``program`` field, plus ``text`` where it
        was traced here) of one cell's program, from the index or cache while the files its
        trace ran are unchanged, else traced now; or why there is none (one line)."""
        from repro import program as P

        name = program_key(experiment, cell, key, platform, kind)
        if profile != "full":
            name = f"{profile}:{name}"
        if name in self._programs:
            return self._programs[name]
        entry = self._store().get(name)
        if entry is not None and self._valid(entry):
            self._programs[name] = entry
            return entry
        if not self.trace:
            self._programs[name] = "not traced (tracing is off)"
            return self._programs[name]
        progs = self.cell_programs(experiment, cell, profile, platform, kind, rec)
        if isinstance(progs, str):
            self._programs[name] = progs
            return progs
        prog = progs.get(key, progs.get(""))
        if prog is None:
            self._programs[name] = f"cell {cell} has no program {key!r} now"
            return self._programs[name]
        try:
            traced = P.trace(prog, platform, kind)
        except Exception as e:  # noqa: BLE001 - any failure is a reason, in one line
            self._programs[name] = f"tracing it failed: {type(e).__name__}: " \
                f"{(str(e).splitlines() or [''])[0][:200]}"
            return self._programs[name]
        self.traced += 1
        entry = {**traced.stamp(), "cell": cell, "key": key, **self._env}
        self._programs[name] = {**entry, "text": traced.text}
        self._remember(name, entry, traced)
        return self._programs[name]

    def _remember(self, name: str, entry: dict[str, Any], traced) -> None:
        """Keep a trace in this machine's cache (a failure to write only costs time)."""
        from repro import program as P

        path = checkout.CHECKOUT.joinpath(*PROGRAM_CACHE)
        try:
            cache = json.loads(path.read_text()) if path.is_file() else {}
            cache[name] = entry
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
            tmp.replace(path)
            P.save_text(path.parent, traced)
        except OSError:
            pass

    @staticmethod
    @functools.lru_cache(maxsize=512)  # many stale records share one program
    def committed_text(digest: str) -> str | None:
        """A program's committed text (``results/programs``)."""
        from repro import program as P

        return P.load_text(checkout.CHECKOUT / "results", digest)

    def text(self, digest: str) -> str | None:
        """A program's kept text: committed (``results/programs``) or cached here."""
        from repro import program as P

        for root in (checkout.CHECKOUT / "results", checkout.CHECKOUT.joinpath(*PROGRAM_CACHE).parent):
            if (t := P.load_text(root, digest)) is not None:
                return t
        return None

    def _program(self, rec: dict[str, Any]) -> tuple[str | None, str | None, str | None,
                                                     tuple[str, ...]]:
        """For a record with a program fingerprint: (reason with the record's commit, without
        it, since, changed files), all None where its program is HEAD's."""
        from repro.program import first_difference

        prog, commit = judged_program(rec["program"], self._env["jax"]), _commit(rec)
        files = prog.get("files") or {}
        if self.unchanged(files, prog.get("python")):
            return None, None, None, ()
        key = str(prog.get("key") or "")
        traced_with = prog.get("jax")
        if traced_with and self._env["jax"] and traced_with != self._env["jax"]:
            why = (f"its program{' (' + key + ')' if key else ''} was traced with jax "
                   f"{traced_with} (its platform's), files it ran changed, and it has no "
                   f"fingerprint traced with jax {self._env['jax']} at its commit: add one "
                   "(scripts/lock_fingerprints.py) or record it again")
            return f"{why}; recorded at {commit}", why, None, ()
        now = self.program_now(str(rec.get("experiment")), str(prog.get("cell")), key,
                               str(prog.get("platform")), str(prog.get("device_kind") or ""),
                               str(rec.get("profile") or "full"), rec)
        what = f" ({key})" if key else ""
        if isinstance(now, str):
            why = f"its program{what} cannot be recomputed here: {now}"
            return f"{why} (recorded at {commit})", why, None, ()
        if now["hash"] == prog.get("hash") and now["kit"] == prog.get("kit"):
            return None, None, None, ()
        changed = tuple(sorted(f for f in set(files) | set(now.get("files") or {})
                               if files.get(f) != self.file_hash(f)))
        since = self.since(commit, changed) if changed else None
        if now["hash"] != prog.get("hash"):
            # from the committed texts only: the note reads alike on every machine
            old, new = self.committed_text(str(prog.get("hash"))), \
                self.committed_text(now["hash"])
            why = f"its program{what} changed" + (
                f": first difference at {first_difference(old, new)}" if new is not None
                else "")
        else:
            why = f"its measuring kit{what} changed"
        when = {None: "", "uncommitted": " (uncommitted edits)"}.get(since, f" (since {since})")
        return f"{why}{when}; recorded at {commit}", f"{why}{when}", since, changed

    def __call__(self, rec: dict[str, Any]) -> Staleness:
        if isinstance(rec.get("program"), dict) and rec["program"].get("hash"):
            reason, summary, since, changed = self._program(rec)
        else:
            reason, summary, since, changed = self._code(rec)
        reasons, summaries = [reason] if reason else [], [summary] if summary else []
        plat = record_platform(rec)
        lock, name = (self.platform_locks[plat], PLATFORM_LOCKS[plat]) \
            if plat in self.platform_locks else (self.lock, LOCK)
        for r in version_reasons(rec, lock, name):
            reasons.append(r)
            summaries.append(r)
        if not reasons:
            return Staleness(False)
        return Staleness(True, "; ".join(reasons), since, changed, "; ".join(summaries))


def staleness(rec: dict[str, Any], lock: Path | None = None) -> Staleness:
    """Whether one record is stale, and why (see the module docstring)."""
    return Checker(lock)(rec)
