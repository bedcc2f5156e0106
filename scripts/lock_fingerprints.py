"""Give records made with a platform's own JAX a fingerprint the lock's JAX recomputes.

A TPU image ships its own jax (with its libtpu): records made there carry the program as that
JAX traced it. This checkout's JAX (requirements.lock) cannot retrace that, so once a file
the program ran changes, such a record could only be checked on the platform again. This
script traces each such record's cell program with the lock's JAX, for the record's platform
and device (``repro.hardware.target``: the CPU takes the device's code paths), in a checkout
of the record's own commit (a temporary git worktree), and stores the result as the record's
``program.lock`` (:func:`repro.provenance.judged_program`): the program's hash as traced
there, its kit and files hashed by this checkout's functions (so that they compare with what
this checkout computes). From then on ``repro status``
judges the record by that fingerprint: an edit that leaves its program alone stales nothing,
on any machine, with no other JAX installed. The texts of the traced programs are kept under
``results/programs`` (a stale note names the first line that differs).

Run it after bringing such records home (docs/RECORDING.md), with the checkout's own
environment:

    .venv/bin/python scripts/lock_fingerprints.py            # every record that needs one
    .venv/bin/python scripts/lock_fingerprints.py --dry-run  # list them, write nothing
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from repro import program as P
from repro import checkout, fingerprint, provenance, results

ROOT = checkout.CHECKOUT

# Runs in the worktree of a record's commit, importing that commit's repro.
DRIVER = r'''
import inspect, json, sys, textwrap
from repro import provenance, program as P
jobs = json.load(open(sys.argv[1]))
check = provenance.Checker(trace=False)
out = {}
for job in jobs:
    try:
        progs = check.cell_programs(job["experiment"], job["cell"], job["profile"],
                                    job["platform"], job["kind"], job["rec"])
        if isinstance(progs, str):
            raise ValueError(progs)
        prog = progs.get(job["key"], progs.get(""))
        if prog is None:
            raise ValueError(f"no program {job['key']!r}")
        prog = provenance.with_settings(prog, job["experiment"])
        t = P.trace(prog, job["platform"], job["kind"])
        kit = []
        for f in prog.kit:  # hashed by this checkout's functions, as its files are
            f = inspect.unwrap(f)
            try:
                kit.append({"src": textwrap.dedent(inspect.getsource(f))})
            except (OSError, TypeError):
                kit.append({"name": f"{getattr(f, '__module__', '')}."
                                    f"{getattr(f, '__qualname__', f)}"})
        out[job["id"]] = {"hash": t.hash, "kit": kit, "text": t.text,
                          "files": sorted(set(t.files) - set(prog.settings)),
                          "settings": dict(prog.settings)}
    except Exception as e:  # noqa: BLE001 - reported per job, in one line
        out[job["id"]] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
json.dump(out, open(sys.argv[2], "w"))
'''


def wanted(rec: dict, jax_version: str, force: bool) -> bool:
    prog = rec.get("program")
    return (isinstance(prog, dict) and bool(prog.get("hash")) and bool(prog.get("jax"))
            and prog["jax"] != jax_version and not results.defect_of(rec)
            and (force or not isinstance(prog.get(provenance.LOCK_FIELD), dict)))


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _hash_at(commit: str, rel: str) -> str | None:
    """What this checkout's :func:`repro.program.file_hash` gives ``rel`` as it was at
    ``commit`` (a ``params.yaml#SECTION`` entry: that section's hash); None where absent."""
    import yaml

    name, _, section = rel.partition("#")
    try:
        blob = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=ROOT,
                              capture_output=True, check=True).stdout
    except subprocess.CalledProcessError:
        return None
    if section:
        return P.params_entry(section, yaml.safe_load(blob) or {})[rel]
    if name.endswith(".py"):
        return fingerprint.source_text_hash(blob, name)
    import hashlib

    return hashlib.sha256(blob).hexdigest()[:fingerprint.HASH_CHARS]


def verified_at(path: Path, rec: dict) -> str:
    """The checkout that made ``rec``'s program: the newest commit among those that wrote
    its cell file (a recording, or a verification on its platform that rewrote the file
    hashes of its program) and its own commit, whose files hash as the program's ``files``
    say; the record's own commit where none does."""
    own = _git("rev-parse", str(rec.get("git_commit") or "").removesuffix("-dirty"))
    wanted = {f: h for f, h in (rec["program"].get("files") or {}).items()
              if f not in provenance.HARNESS}
    touched = _git("log", "--format=%H", "--", str(path.relative_to(ROOT))).split()
    for commit in [*touched, own]:
        if wanted and all(_hash_at(commit, f) == h for f, h in wanted.items()):
            return commit
    return own


def trace_at(commit: str, jobs: list[dict]) -> dict[str, dict]:
    """The driver's answers for ``jobs``, run in a worktree of ``commit``."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            (Path(tmp) / "jobs.json").write_text(json.dumps(jobs))
            env = {**os.environ, "PYTHONPATH": str(tree), "REPRO_ROOT": str(tree),
                   "JAX_PLATFORMS": "cpu"}
            env.pop("REPRO_GIT_COMMIT", None)
            done = subprocess.run([sys.executable, "-c", DRIVER, str(Path(tmp) / "jobs.json"),
                                   str(Path(tmp) / "out.json")], cwd=tree, env=env,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["?"])[-1]
                return {j["id"]: {"error": f"the driver failed: {tail[:200]}"} for j in jobs}
            out = json.loads((Path(tmp) / "out.json").read_text())
            for ans in out.values():  # the commit's code, hashed by this checkout's functions
                if "error" not in ans:
                    ans["kit"] = P.kit_hash_of(ans["kit"])
                    ans["files"] = {**{f: P.file_hash(tree / f) for f in ans["files"]
                                       if (tree / f).is_file()}, **ans.pop("settings")}
            return out
        finally:
            _git("worktree", "remove", "--force", str(tree))


def main(argv: list[str] | None = None) -> int:
    import jax

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list the records, write nothing")
    ap.add_argument("--force", action="store_true", help="trace records that have one too")
    args = ap.parse_args(argv)
    root = results.results_dir()
    files: dict[Path, list] = {}
    jobs: dict[str, list[dict]] = collections.defaultdict(list)
    seen: dict[tuple, str] = {}
    for path in sorted(root.glob("*/*/*.json")):
        recs = results.read_cell_file(path, root)
        for i, rec in enumerate(recs):
            if not isinstance(rec, dict) or not wanted(rec, jax.__version__, args.force):
                continue
            files[path] = recs
            prog = rec["program"]
            commit = verified_at(path, rec)
            key = (commit, rec["experiment"], prog.get("cell"), prog.get("key") or "",
                   prog["platform"], prog.get("device_kind") or "", rec.get("profile") or "full")
            if key not in seen:
                seen[key] = f"{len(seen)}"
                jobs[commit].append({"id": seen[key], "experiment": rec["experiment"],
                                     "cell": prog.get("cell"), "key": prog.get("key") or "",
                                     "platform": prog["platform"],
                                     "kind": prog.get("device_kind") or "",
                                     "profile": rec.get("profile") or "full", "rec": rec})
            rec["_job"], rec["_commit"] = seen[key], commit
    n = sum(1 for recs in files.values() for r in recs if isinstance(r, dict) and "_job" in r)
    print(f"{n} record(s) in {len(files)} cell(s) need a fingerprint traced with jax "
          f"{jax.__version__}: {len(seen)} program(s) at {len(jobs)} commit(s)")
    if args.dry_run or not jobs:
        return 0
    answers: dict[str, dict] = {}
    for commit, js in jobs.items():
        print(f"  tracing {len(js)} program(s) at {commit[:7]} ...", flush=True)
        answers.update(trace_at(commit, js))
    failed = 0
    for path, recs in files.items():
        out = []
        for rec in recs:
            job = rec.pop("_job", None) if isinstance(rec, dict) else None
            commit = rec.pop("_commit", None) if isinstance(rec, dict) else None
            ans = answers.get(job) if job else None
            if ans and "error" not in ans:
                P.save_text(root, P.Traced(ans["hash"], ans["kit"], {}, rec["program"][
                    "platform"], rec["program"].get("device_kind") or "", ans["text"]))
                rec = {**rec, "program": {**rec["program"], provenance.LOCK_FIELD: {
                    "jax": jax.__version__, "python": P.python_minor(), "hash": ans["hash"],
                    "kit": ans["kit"], "files": dict(sorted(ans["files"].items())),
                    "commit": commit}}}
            elif ans:
                failed += 1
                print(f"  {path.relative_to(root)}: {ans['error']}", file=sys.stderr)
            out.append(rec)
        results.write_records(out, path.parent.name, path.stem, root)
    print(f"wrote {len(files)} cell file(s); {failed} record(s) could not be traced")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
