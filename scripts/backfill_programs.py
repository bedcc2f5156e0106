"""Give records made before program fingerprints the program they measured, where it can be
recomputed: traced at the record's own commit, compared with the program at HEAD.

For every record under ``results/`` without a ``program`` field whose study defines
``program(**settings)`` and ``program_settings(rec)`` (:mod:`repro.program`):

1. the settings come from the record (sizes, recipe) through HEAD's ``program_settings``;
2. HEAD's program is traced for the record's platform and device (``repro.hardware.target``);
3. the record's own commit is checked out in a temporary git worktree and, in a fresh process
   importing that commit's ``repro``, HEAD's ``program`` function is run against that
   commit's study module (its own ``MLP``, ``make_train_step``, recipes, layers...: the
   functions that made the record) with ``jax.default_backend()`` and ``jax.devices()``
   answering as the record's device did, and traced the same way;
4. equal programs (jaxpr and measuring kit): the record gets HEAD's ``program`` and
   ``program_backfilled`` saying how it was checked; it is fresh again. Different ones: the
   record gets the program of its own commit (and stays stale, now saying which equation
   differs). Where either trace fails, the record is left as it is and the reason printed.

    .venv/bin/python scripts/backfill_programs.py            # report and rewrite records
    .venv/bin/python scripts/backfill_programs.py --dry-run  # report only
    .venv/bin/python scripts/backfill_programs.py --experiment mlp_step
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from tqdm import tqdm

from repro import program as P
from repro import checkout, fingerprint, provenance, results, studies

ROOT = checkout.CHECKOUT

# Runs in the old commit's worktree: HEAD's program function against that commit's modules.
DRIVER = r'''
import importlib, importlib.util, json, os, sys, types
import repro
for name in ("checkout", "fingerprint"):  # HEAD's harness, which HEAD's program.py imports
    spec = importlib.util.spec_from_file_location(
        f"repro.{name}", os.path.join(os.path.dirname(sys.argv[1]), f"{name}.py"))
    sys.modules[spec.name] = m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
spec = importlib.util.spec_from_file_location("head_program", sys.argv[1])
H = importlib.util.module_from_spec(spec); sys.modules["head_program"] = H; spec.loader.exec_module(H)
jobs = json.load(open(sys.argv[2]))
import jax
real_backend, real_devices = jax.default_backend, jax.devices
out = {}
for job in jobs:
    try:
        mod = importlib.import_module(job["module"])
        ns = dict(vars(mod)); ns["Program"] = H.Program
        for src in job["sources"]:
            exec(src, ns)
        prog = ns["program"](**job["settings"])
        class Dev:
            platform = job["platform"]; device_kind = job["kind"]
        jax.default_backend = lambda: job["platform"]
        jax.devices = lambda *a, **k: [Dev()]
        if job["platform"] == "gpu":  # JAX's cuDNN checks answered as the GPU answers them
            from jax._src.cudnn import fused_attention_stablehlo as F
            have = tuple(int(c) for c in (job.get("cc") or "9.0").split("."))
            F.check_cudnn_version = lambda: 91000
            F.check_compute_capability = lambda c: have >= tuple(int(x) for x in c.split("."))
            F.is_cuda_compute_capability_equal = lambda c: have == tuple(
                int(x) for x in c.split("."))
        try:
            with H._Files(H.Path(job["root"])) as files:
                closed = jax.make_jaxpr(prog.fn)(*prog.args)
        finally:
            jax.default_backend, jax.devices = real_backend, real_devices
        text = H.canonical(closed)
        from repro import provenance as OP
        hashes = {}
        for f in sorted(files.seen):
            p = H.Path(f)
            if p.is_file() and p.suffix == ".py":
                hashes[p.relative_to(job["root"]).as_posix()] = OP.source_hash(p)
        out[job["id"]] = {"hash": H.text_hash(text), "kit": H.kit_hash(prog.kit),
                          "files": hashes, "text": text}
    except Exception as e:
        out[job["id"]] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
json.dump(out, open(sys.argv[3], "w"))
'''


def module_of(experiment: str) -> str | None:
    name = studies.of_records(experiment)
    return studies.EXPERIMENTS.get(name) or studies.TRACES.get(name)


def head_program(module):
    """(program function, program_settings, the source texts to exec at an old commit) of a
    study module at HEAD, or None where it defines none."""
    prog, settings = getattr(module, "program", None), getattr(module, "program_settings", None)
    if prog is None or settings is None:
        return None
    extra = getattr(module, "PROGRAM_HELPERS", ())  # helpers program() needs, by name
    sources = [textwrap.dedent(inspect.getsource(getattr(module, n))) for n in extra]
    return prog, settings, sources + [textwrap.dedent(inspect.getsource(prog))]


def pending(redo: bool = False) -> dict[str, list[tuple[Path, int, dict]]]:
    """{experiment: [(file, index, record)]} of records without a program fingerprint (and,
    with ``redo``, those an earlier backfill gave one)."""
    out = collections.defaultdict(list)
    for path in sorted(results.results_dir().glob("*/*/*.json")):
        data = results.read_json(path)
        for i, rec in enumerate(data if isinstance(data, list) else [data]):
            again = redo and rec.get("program_backfilled") if isinstance(rec, dict) else False
            if isinstance(rec, dict) and (again or not isinstance(rec.get("program"), dict)) \
                    and not results.defect_of(rec):
                out[rec.get("experiment") or path.parent.name].append((path, i, rec))
    return out


def platform_of(rec: dict) -> tuple[str, str]:
    backend = str(rec.get("backend") or "gpu")
    return ("gpu" if backend in ("gpu", "cuda", "rocm") else backend,
            str(rec.get("hardware_name") or ""))


def trace_old(commit: str, jobs: list[dict]) -> dict[str, dict]:
    """Run the jobs in a worktree of ``commit`` (see :data:`DRIVER`)."""
    with tempfile.TemporaryDirectory(prefix="backfill-") as tmp:
        wt = Path(tmp) / "wt"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(wt), commit], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            for job in jobs:
                job["root"] = str(wt)
            (Path(tmp) / "jobs.json").write_text(json.dumps(jobs))
            (Path(tmp) / "driver.py").write_text(DRIVER)
            env = {**os.environ, "PYTHONPATH": str(wt), "JAX_PLATFORMS": "cpu"}
            r = subprocess.run([sys.executable, str(Path(tmp) / "driver.py"),
                                str(ROOT / "repro" / "program.py"), str(Path(tmp) / "jobs.json"),
                                str(Path(tmp) / "out.json")], cwd=wt, env=env,
                               capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                err = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
                return {j["id"]: {"error": f"the worktree's process failed: {err}"} for j in jobs}
            return json.loads((Path(tmp) / "out.json").read_text())
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                           capture_output=True)


# The kit hash of records made before repro.program.kit_hash printed syntax trees alike under
# every Python: ``ast.dump``'s text, which differs between versions (run under each Python
# that made records: 3.12 on the GPU host, 3.11 on a TPU host).
LEGACY_DUMP = r'''
import ast, hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from repro.fingerprint import strip_docstrings as strip  # no JAX, no package state
out = {}
for key, srcs in json.load(sys.stdin).items():
    parts = [ast.dump(strip(ast.parse(s))) if s is not None else n for s, n in srcs]
    out[key] = hashlib.sha256("\n".join(parts).encode()).hexdigest()
print(json.dumps(out))
'''


def _kit_sources(kit) -> list[tuple[str | None, str]]:
    out = []
    for f in kit:
        f = inspect.unwrap(f)
        name = f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', f)}"
        try:
            out.append((textwrap.dedent(inspect.getsource(f)), name))
        except (OSError, TypeError):
            out.append((None, name))
    return out


def legacy_kit_hashes(kits: dict[str, list], pythons=("python3.11", sys.executable)
                      ) -> dict[str, set[str]]:
    """Per kit (name -> its functions), the hashes ``ast.dump`` gave it under each Python of
    ``pythons`` (the kit's syntax tree as that version printed it)."""
    srcs = {k: _kit_sources(v) for k, v in kits.items()}
    out: dict[str, set[str]] = {k: set() for k in kits}
    for py in pythons:
        run = subprocess.run([py, "-c", LEGACY_DUMP, str(ROOT)], input=json.dumps(srcs),
                             text=True, capture_output=True)
        if run.returncode:
            print(f"{py}: {run.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        for k, h in json.loads(run.stdout).items():
            out[k].add(h[:len(fingerprint.text_hash(""))])
    return out


def portable_kits(dry_run: bool = False) -> int:
    """Records whose kit hash is HEAD's kit as one Python version printed it get the hash
    that every version prints alike (:func:`repro.program.kit_hash`); other kits are left
    (they differ from HEAD's anyway)."""
    checker = studies.checker()
    paths = sorted(results.results_dir().glob("*/*/*.json"))
    kits, where = {}, collections.defaultdict(list)
    for path in paths:
        data = results.read_json(path)
        for i, rec in enumerate(data if isinstance(data, list) else [data]):
            prog = rec.get("program") if isinstance(rec, dict) else None
            if not isinstance(prog, dict) or not prog.get("kit"):
                continue
            cell = (str(rec.get("experiment")), str(prog.get("cell")),
                    str(rec.get("profile") or "full"), str(prog.get("platform")),
                    str(prog.get("device_kind") or ""))
            progs = checker.cell_programs(*cell, rec)
            key = str(prog.get("key") or "")
            if isinstance(progs, str) or progs.get(key, progs.get("")) is None:
                continue
            kit = progs.get(key, progs.get("")).kit
            name = repr(tuple(f"{f.__module__}.{f.__qualname__}" for f in map(inspect.unwrap, kit)))
            kits[name] = kit
            where[name].append((path, i))
    legacy = legacy_kit_hashes(kits)
    changed, edits = 0, collections.defaultdict(dict)
    for name, kit in kits.items():
        new = P.kit_hash(kit)
        for path, i in where[name]:
            edits[path][i] = (legacy[name], new)
    for path, todo in edits.items():
        data = results.read_json(path)
        recs = data if isinstance(data, list) else [data]
        dirty = False
        for i, (old, new) in todo.items():
            prog = recs[i]["program"]
            if prog["kit"] in old and prog["kit"] != new:
                recs[i] = {**recs[i], "program": {**prog, "kit": new}}
                dirty, changed = True, changed + 1
        if dirty and not dry_run:
            path.write_text(json.dumps(recs if isinstance(data, list) else recs[0], indent=1,
                                       sort_keys=True) + "\n")
    renamed = {old: P.kit_hash(kits[name]) for name in kits for old in legacy[name]}
    for store in (checkout.CHECKOUT / "results" / "programs" / "index.json",
                  checkout.CHECKOUT.joinpath(*provenance.PROGRAM_CACHE)):
        if store.is_file() and not dry_run:  # HEAD's programs, kept to spare a trace
            entries = json.loads(store.read_text())
            for entry in entries.values():
                if isinstance(entry, dict) and entry.get("kit") in renamed:
                    entry["kit"] = renamed[entry["kit"]]
            store.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    print(f"{changed} record(s) given their kit's portable hash")
    return 0



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", action="append", help="only these experiments")
    ap.add_argument("--dry-run", action="store_true", help="report, write nothing")
    ap.add_argument("--verbose", action="store_true", help="name each record that differs")
    ap.add_argument("--redo", action="store_true",
                    help="also the records an earlier backfill gave a program")
    ap.add_argument("--portable-kits", action="store_true",
                    help="only give records their kit's hash as every Python prints it")
    args = ap.parse_args(argv)
    if args.portable_kits:
        return portable_kits(args.dry_run)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()
    todo = pending(args.redo)
    report = collections.Counter()
    reasons = collections.defaultdict(collections.Counter)
    changed_files: set[Path] = set()
    edits: dict[Path, list] = {}
    for exp, items in sorted(todo.items()):
        if args.experiment and exp not in args.experiment:
            continue
        modname = module_of(exp)
        hp = head_program(importlib.import_module(modname)) if modname else None
        if hp is None:
            report[(exp, "no program defined")] += len(items)
            continue
        program, settings_of, sources = hp
        heads, jobs = {}, collections.defaultdict(dict)
        per_rec = []
        for path, i, rec in items:
            plat, kind = platform_of(rec)
            probe = {**{k: v for k, v in rec.items() if k != "program_backfilled"},
                     "program": {"cell": path.stem}}
            try:
                settings = settings_of(probe)
            except Exception as e:  # noqa: BLE001
                settings, why = None, f"{type(e).__name__}: {e}"
            else:
                why = "program_settings: not derivable from the record"
            if settings is None:
                reasons[exp][why[:120]] += 1
                continue
            key = json.dumps([settings, plat, kind], sort_keys=True, default=str)
            if key not in heads:
                try:
                    section = studies.study(studies.of_records(exp)).params_section
                    heads[key] = P.trace(P.with_settings(program(**settings), section),
                                         plat, kind)
                except Exception as e:  # noqa: BLE001
                    heads[key] = f"HEAD trace failed: {type(e).__name__}: {str(e)[:150]}"
            commit = str(rec.get("git_commit") or "").removesuffix("-dirty")
            jobs[commit][key] = {"id": key, "module": modname, "settings": settings,
                                 "platform": plat, "kind": kind, "sources": sources,
                                 "cc": rec.get("compute_capability")}
            per_rec.append((path, i, rec, key, commit))
        olds = {}
        for commit, js in tqdm(sorted(jobs.items()), desc=f"{exp}: commits", file=sys.stderr):
            try:
                res = trace_old(commit, list(js.values()))
            except subprocess.CalledProcessError as e:
                res = {k: {"error": f"no worktree of {commit}: {e.stderr.strip()[:120]}"}
                       for k in js}
            olds.update({(commit, k): v for k, v in res.items()})
        for path, i, rec, key, commit in per_rec:
            now, old = heads[key], olds.get((commit, key), {"error": "not traced"})
            if isinstance(now, str) or "error" in old:
                reasons[exp][(now if isinstance(now, str) else old["error"])[:120]] += 1
                continue
            plat, kind = platform_of(rec)
            probe_cell = path.stem
            key_name = rec.get("recipe") or ""
            same = old["hash"] == now.hash and old["kit"] == now.kit
            how = (f"traced at {commit[:7]} (a worktree of that commit, its own functions, the "
                   f"record's settings) and at {head} for {plat}:{kind} on a CPU")
            if same:
                stamp = {**now.stamp(), "cell": probe_cell, "key": key_name}
                rec = {**rec, "program": stamp,
                       "program_backfilled": f"{how}: equal programs"}
                report[(exp, "fresh: same program")] += 1
            else:
                what = "program" if old["hash"] != now.hash else "measuring kit"
                stamp = {"hash": old["hash"], "kit": old["kit"], "files": old["files"],
                         "platform": plat, "device_kind": kind, "python": P.python_minor(),
                         "cell": probe_cell, "key": key_name}
                rec = {**rec, "program": stamp,
                       "program_backfilled": f"{how}: the {what} differs"}
                if not args.dry_run:
                    P.save_text(results.results_dir(), P.Traced(old["hash"], old["kit"], {},
                                                                plat, kind, old["text"]))
                report[(exp, f"stale: {what} changed")] += 1
                if args.verbose:
                    print(f"{path.parent.name}/{path.stem} {key_name} at {commit[:7]}: the "
                          f"{what} differs", file=sys.stderr)
            edits.setdefault(path, []).append((i, rec))
            changed_files.add(path)
    if not args.dry_run:
        for path, recs in edits.items():
            data = results.read_json(path)
            single = not isinstance(data, list)
            data = [data] if single else data
            for i, rec in recs:
                data[i] = rec
            path.write_text(json.dumps(data[0] if single else data, indent=1, sort_keys=True,
                                       default=results._json_default) + "\n")
    for (exp, what), n in sorted(report.items()):
        print(f"{exp}: {n} record(s) {what}")
    for exp, rs in sorted(reasons.items()):
        for why, n in rs.most_common():
            print(f"{exp}: {n} record(s) left as they were: {why}")
    print(f"{len(changed_files)} file(s) {'would be ' if args.dry_run else ''}rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
