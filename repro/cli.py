"""The ``repro`` command: record measurements, run notebooks, show what is known.

    repro record EXPERIMENT|all [--profile P] [--force] [--only GLOB] [--recipe R] ...
    repro trace WORKLOAD [--recipes R,...] ...   kernel times of traced steps (GPU)
    repro check                                  the numerics check of this device
    repro notebook NAME [--profile P] [-p KEY=VALUE ...]
    repro status [--json]                        stale records and the verdicts they touch
    repro pipeline [--check]                     write dvc.yaml from the notebooks' imports
    repro hardware | recipes | claims | site

``record`` runs a study (``repro.studies``: one resumable cell at a time, through
``repro.studies.runner``); records go to ``results/`` (full profile, committed) or
``build/results/`` (smoke, scratch). ``notebook`` converts ``notebooks/NAME.py`` (Jupytext
py:percent) to ``build/notebooks/NAME.ipynb`` and executes it with papermill into
``build/notebooks/NAME.out.ipynb`` (``repro.run_notebook``); every DVC stage runs it. Bad input
prints one line ``repro: error: ...`` and exits 2 before anything is written; any other error
prints one line and exits 1 (``--debug``: the traceback instead).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from repro.checkout import repo_root
from repro.cli_checks import (UsageError, check_cpu_full, check_label, inside_repository,
                              notebook_profile, number, parse_params, split, text)
from repro.config import ConfigError

EPILOG = """\
environment:
  REPRO_ROOT        the repository root: params.yaml, notebooks/, results/ and build/ are
                    read and written there (default: the checkout at or above the working
                    directory, else the one this package was imported from)
  REPRO_GIT_COMMIT  the commit records name, for a copy of the tree without .git
  REPRO_MEMORY_LIMIT_BYTES, REPRO_DISTRIBUTED: see repro.models.lm_data and
                    repro.models.sharding (a shared machine's memory; multi-host detection)

errors: one line `repro: error: ...` naming the file, key or argument; --debug shows the
traceback instead.

exit status: 0 done, 1 a cell, notebook or check failed (or another error), 2 bad input
(nothing written), 130 interrupted (record: finished cells are kept, rerun the same command
to resume; notebook: the committed figures, verdicts and metrics are unchanged); SIGTERM and
SIGHUP stop it alike, with 143 and 129"""


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage block and then the error; we want exactly one line.
    def error(self, message):
        raise UsageError(message)


def _one_line(msg: Any) -> str:
    return " ".join(str(msg).split())


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path)


def _profile(arg: str | None) -> str:
    """``--profile`` or params.yaml's ``profile``, ``auto`` resolved; params.yaml checked."""
    from repro import config

    params = config.load_params()
    if arg is None:
        return config.resolve_profile(params.get("profile", "smoke"))
    try:
        return config.resolve_profile(arg)
    except ConfigError as e:
        raise UsageError(f"--profile: {e}") from None


# ------------------------------------------------------------------------------- record


def _plan(args, profile: str) -> list[tuple[str, Any, Any]]:
    """(experiment, study, params) of every experiment to run, all validated (params,
    command-line inputs, selection): nothing is written before this returns."""
    from repro import config, studies
    from repro.studies import runner

    every = args.experiment == "all"
    check_label(args)
    if every and (args.only or args.recipe):
        raise UsageError("--only and --recipe select cells of one experiment; they do not "
                         "apply to `repro record all`")
    raw, out = config.load_params(), []
    inputs = {"purejaxrl": args.purejaxrl} if args.purejaxrl else {}
    for name in studies.EXPERIMENTS if every else [args.experiment]:
        studies.check_params(name, raw)
        s, p = studies.study(name), studies.params(name, profile, raw)
        mine = {k: v for k, v in inputs.items() if not every or hasattr(p, k)}
        if every and (missing := [r for r in s.requires if r not in mine]):
            print(f"repro: skipping {name}: it needs --{missing[0]}", file=sys.stderr)
            continue
        p = studies.with_inputs(name, p, mine)
        try:
            runner.plan(s, p, args.only, split(args.recipe))
        except ValueError as e:  # say which experiment, where the message does not
            if every and not str(e).startswith(name):
                raise type(e)(f"{name}: {e}") from None
            raise
        out.append((name, s, p))
    return out


def _check_numerics(profile: str) -> None:
    """Full-profile records are evidence: refuse to write them on a device where a rounding
    the experiments rely on is skipped (``repro.precision.check``; a one-line error)."""
    if profile == "full":
        from repro.precision import check as numerics

        numerics.require()


def _run(args, study, params, root: Path, budget: float | None):
    from repro import studies

    return studies.run(study, params, root, force=args.force, only=args.only,
                       recipes=split(args.recipe), time_budget_s=budget,
                       hardware=args.hardware, note=args.note)


def _report(name: str, profile: str, out, root: Path) -> str:
    for path in out.written:
        print(path)
    return (f"{name} [{profile}]: wrote {len(out.written)} cell(s) under {root}"
            + (f", {len(out.skipped)} already recorded (--force redoes them)" if out.skipped
               else "") + (f"; stopped: {out.stopped}" if out.stopped else ""))


def cmd_record(args) -> int:
    from repro import results, studies

    if args.stale and args.ledger:
        raise UsageError("--stale and --ledger choose the cells each: give one of them")
    if args.ledger:
        return record_ledger(args)
    if args.stale:
        return record_stale(args)
    if args.experiment is None:
        raise UsageError("repro record: the argument EXPERIMENT is required (or --stale, "
                         "--ledger)")
    if args.claim or args.plan or args.quality:
        raise UsageError("--claim, --plan and --quality go with --stale or --ledger")
    if args.experiment != "all":
        _check_experiment(args.experiment)
    profile = _profile(args.profile)
    check_cpu_full(args, profile, list(studies.EXPERIMENTS) if args.experiment == "all"
                   else [args.experiment])
    plan = _plan(args, profile)
    _check_numerics(profile)
    root = results.record_root(profile)
    if args.experiment == "all":
        return record_all(args, plan, profile, root)
    (name, study, params), = plan
    print(_report(name, profile, _run(args, study, params, root, args.time_budget), root))
    return 0


def record_stale(args) -> int:
    """``repro record --stale``: the stale cells of this hardware (:mod:`repro.refresh`),
    printed as a plan with its estimated device time, then recorded in that order, each
    experiment with ``--only`` its cells, until ``--time-budget`` is spent."""
    from repro import evidence, hardware, refresh, results, studies

    if args.only or args.recipe or args.force:
        raise UsageError("--stale chooses the cells itself: leave out --only, --recipe, "
                         "--force")
    if args.experiment not in (None, "all"):
        _check_experiment(args.experiment)
    check_label(args)
    profile = _profile(args.profile)
    if profile != "full":
        raise UsageError("repro record --stale refreshes the committed full-profile records: "
                         "use --profile full (or leave it to params.yaml's full/auto)")
    slug = results.slug(args.hardware) if args.hardware else hardware.detect().slug
    steps = refresh.plan(evidence.stale_cells(), hardware=slug,
                         experiment=None if args.experiment in (None, "all") else
                         args.experiment, claims=split(args.claim) or ())
    if not steps:
        print(f"no stale cells on {slug} to record again")
        return 0
    print(f"repro record --stale on {slug}:", file=sys.stderr)
    for line in refresh.describe(steps):
        print(f"  {line}", file=sys.stderr)
    if args.plan:
        return 0
    todo = [c for c in steps if c["recordable"]]
    if todo:
        check_cpu_full(argparse.Namespace(**{**vars(args), "experiment": "--stale"}), profile,
                       [todo[0]["folder"]])
    _check_numerics(profile)
    root, start, lines = results.record_root(profile), time.monotonic(), []
    for name in dict.fromkeys(c["folder"] for c in todo):
        left = None if args.time_budget is None else \
            args.time_budget - (time.monotonic() - start)
        if left is not None and left <= 0:
            lines.append(f"time budget spent before {name}")
            break
        only = [c["cell"] for c in todo if c["folder"] == name]
        s, p = studies.study(name), studies.params(name, profile)
        if missing := [r for r in s.requires if getattr(p, r, None) is None]:
            lines.append(f"{name}: {len(only)} stale cell(s) left: it needs --"
                         f"{missing[0].replace('_', '-')} (repro record {name} --"
                         f"{missing[0].replace('_', '-')} DIR records them)")
            continue
        out = runner_run(s, p, root, only, left, args)
        lines.append(_report(name, profile, out, root))
    print("\n".join(lines))
    return 0


def record_ledger(args) -> int:
    """``repro record --ledger``: the ledger set of this hardware (:mod:`repro.claims.
    ledger_set`: the cells the verdicts read), printed as a plan with each cell's estimated
    device time, then its missing and stale cells recorded, the verdicts that need the fewest
    cells first, until ``--time-budget`` is spent (``--force``: every cell of the set)."""
    from repro import hardware, refresh, results, studies
    from repro.claims import ledger

    if args.only or args.recipe:
        raise UsageError("--ledger chooses the cells itself: leave out --only and --recipe")
    if args.experiment not in (None, "all"):
        raise UsageError("--ledger records every experiment of the set: leave out EXPERIMENT "
                         "(--claim C keeps one claim's cells)")
    profile = _profile(args.profile or "full")  # the ledger is full-profile evidence
    if profile != "full":
        raise UsageError("repro record --ledger records full-profile evidence: leave out "
                         "--profile (or give full)")
    slug = results.slug(args.hardware) if args.hardware else hardware.detect().slug
    claims = split(args.claim) or ()
    if bad := [c for c in claims if c not in ledger.claims()]:
        raise UsageError(f"unknown claim {bad[0]!r}; claims: {', '.join(ledger.claims())}")
    rows = refresh.ledger_plan(slug, claims, quality=True if args.quality else None)
    if not rows:
        print(f"no ledger cells on {slug}" + (" (--quality adds the quality cells any "
                                              "hardware records)" if not args.quality else ""))
        return 0
    print(f"repro record --ledger on {slug}:", file=sys.stderr)
    for line in refresh.describe_ledger(rows, slug):
        print(f"  {line}", file=sys.stderr)
    if args.plan:
        return 0
    todo = [c for c in rows if c["recordable"] and (args.force or c["status"] != "fresh")]
    if skipped := [c for c in rows if not c["recordable"] and c["status"] != "fresh"]:
        print(f"repro: {len(skipped)} ledger cell(s) are not recorded by `repro record` "
              f"(docs/RECORDING.md says how): {', '.join(c['experiment'] + '/' + c['cell'] for c in skipped[:6])}",
              file=sys.stderr)
    if not todo:
        print(f"the ledger set on {slug} is recorded: nothing to do (--force records it again)")
        return 0
    check_cpu_full(argparse.Namespace(**{**vars(args), "experiment": "--ledger"}), profile,
                   [todo[0]["experiment"]])
    _check_numerics(profile)
    root, start, lines = results.record_root(profile), time.monotonic(), []
    for name in dict.fromkeys(c["experiment"] for c in todo):
        left = None if args.time_budget is None else \
            args.time_budget - (time.monotonic() - start)
        if left is not None and left <= 0:
            lines.append(f"time budget spent before {name}")
            break
        only = [c["cell"] for c in todo if c["experiment"] == name]
        s, p = studies.study(name), studies.params(name, profile)
        if missing := [r for r in s.requires if getattr(p, r, None) is None]:
            lines.append(f"{name}: {len(only)} ledger cell(s) left: it needs --"
                         f"{missing[0].replace('_', '-')}")
            continue
        out = runner_run(s, p, root, only, left, args, force=args.force)
        lines.append(_report(name, profile, out, root))
    print("\n".join(lines))
    return 0


def runner_run(study, params, root: Path, only: list[str], budget: float | None, args,
               force: bool = False):
    from repro import studies
    from repro.studies import runner

    known = {c.name for c in study.cells(params)}
    missing = [c for c in only if c not in known]
    if missing:
        print(f"repro: {study.experiment}: {len(missing)} stale cell(s) are not among its "
              f"cells in params.yaml now (left as they are): {', '.join(missing[:6])}",
              file=sys.stderr)
    only = [c for c in only if c in known]
    if not only:
        return runner.Outcome()
    return studies.run(study, params, root, only=only, time_budget_s=budget,
                       hardware=args.hardware, note=args.note, force=force)


def _check_experiment(name: str) -> None:
    from repro import studies

    if name not in studies.EXPERIMENTS:
        hint = " (it is traced: repro trace)" if name in studies.TRACES else ""
        raise UsageError(f"unknown experiment {name!r}{hint}; valid experiments: "
                         f"{', '.join(studies.EXPERIMENTS)} (or all)")


@contextmanager
def _log_file(path: Path):
    """A logger that appends to ``path`` (the history of resumed runs) while in use."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("repro.record")
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    try:
        yield log
    finally:
        log.removeHandler(handler)
        handler.close()


def record_all(args, plan, profile: str, root: Path) -> int:
    """``repro record all``: every experiment in turn, resumably; one that fails is logged
    (traceback in ``build/logs/record.log``) and the next one runs; exit 1 if any failed."""
    from repro import hardware, results

    slug = results.slug(args.hardware) if args.hardware else hardware.detect().slug
    log_path = repo_root() / "build" / "logs" / "record.log"
    print(f"repro record all [{profile}] on {slug}: {len(plan)} experiment(s) -> {root} "
          f"(log {_rel(log_path)})", file=sys.stderr)
    lines, failed, start = [], [], time.monotonic()
    with _log_file(log_path) as log:
        log.info("record all: profile=%s hardware=%s root=%s force=%s experiments=%s", profile,
                 slug, root, args.force, ",".join(n for n, _, _ in plan))
        for name, study, params in plan:
            left = None if args.time_budget is None else \
                args.time_budget - (time.monotonic() - start)
            log.info("%s: start", name)
            try:
                out = _run(args, study, params, root, left)
            except KeyboardInterrupt:
                log.warning("%s: interrupted; finished cells are kept, rerun to resume", name)
                raise
            except Exception as e:  # noqa: BLE001 - one experiment must not stop the others
                log.exception("%s: failed", name)
                failed.append(name)
                print(f"repro: {name} failed: {_one_line(e)[:300]} (traceback in "
                      f"{_rel(log_path)})", file=sys.stderr)
                continue
            lines.append(_report(name, profile, out, root))
            log.info("%s", lines[-1])
    print("\n".join(lines + ([f"FAILED: {', '.join(failed)}"] if failed else [])))
    return 1 if failed else 0


# -------------------------------------------------------------------------------- trace


def cmd_trace(args) -> int:
    from repro import results, studies
    from repro.experiments.kernel_times import measure as K
    from repro.studies import runner

    profile = _profile(args.profile or "full")
    check_label(args)
    shapes = K.parse_shapes(args.shapes) if args.shapes else K.MLP_GEMMS
    p = K.Params(profile=profile, workload=args.workload, steps=args.steps, shapes=shapes,
                 recipes=tuple(split(args.recipes, "--recipes")
                               or K.default_recipes(args.workload)),
                 width=args.width, depth=args.depth, num_envs=args.num_envs, batch=args.batch,
                 size=args.size, config=args.config, phase=args.phase)
    runner.plan(K.STUDY, p)
    root = results.record_root(profile)
    out = studies.run(K.STUDY, p, root, force=args.force, hardware=args.hardware,
                      note=args.note)
    print(_report(K.EXPERIMENT, profile, out, root))
    return 0


# ------------------------------------------------------------------------ other commands


def cmd_check(args) -> int:
    import jax

    from repro.precision import check as numerics

    rows = numerics.checks()
    dev = jax.devices()[0]
    print(f"numerics check on {dev.platform}:{dev.device_kind} (jax {jax.__version__})")
    for r in rows:
        flag = "ok  " if r["ok"] else ("FAIL" if r["required"] else "note")
        print(f"  [{flag}] {r['check']}")
    return 1 if any(r["required"] and not r["ok"] for r in rows) else 0


def cmd_notebook(args) -> int:
    from repro import run_notebook

    params = parse_params(args.param)
    profile = _profile(notebook_profile(args.profile, params.pop("profile", None)))
    try:
        return run_notebook.run(args.name, profile, params)
    except run_notebook.NotebookError as e:
        raise UsageError(str(e)) from None


def cmd_claims(args) -> int:
    import json

    from repro.claims import ledger as claims

    rows = claims.ledger()
    if args.write:
        path, changed = claims.write_page()
        print(f"{_rel(path)}: ledger {'written' if changed else 'already up to date'} "
              f"({len(rows)} claims)", file=sys.stderr)
        if not (args.json or args.markdown):
            return 0
    if args.json:
        from repro.claims import registration

        loaded: dict = {}  # each experiment's records loaded once for every claim
        checks = registration.table(records_of=lambda studies: _records_used(studies, loaded))
        for r in rows:
            r.update(checks.get(r["claim"], {}))
        print(json.dumps(rows, indent=1))
    else:
        from repro import tables

        print(claims.markdown_table(rows) if args.markdown else tables.ledger(rows))
    return 0


def _records_used(studies: list[str], loaded: dict | None = None):
    """The committed full-profile records of ``studies`` a verdict may use (stale speed
    records left out, as the notebooks leave them out); ``loaded`` keeps each study's
    records for the next claim that reads them."""
    import pandas as pd

    from repro import evidence, results
    from repro.claims import staleness

    loaded = {} if loaded is None else loaded
    parts = []
    for s in studies:
        if s not in loaded:
            df = evidence.load_records(s, roots=results.results_dir())
            loaded[s] = staleness.split(df[df["profile"] == "full"])[0] if len(df) else df
        if len(loaded[s]):
            parts.append(loaded[s])
    return pd.concat(parts, ignore_index=True) if parts else None


def cmd_site(args) -> int:
    from repro import site
    root = repo_root()
    out = inside_repository(f"--out {args.out}", args.out, root) if args.out else \
        root / "build" / "site"
    index = site.build_site(root, out)
    print(f"wrote {_rel(index)} ({len(site.notebook_pages(root / 'build' / 'notebooks'))} "
          f"notebook page(s))", file=sys.stderr)
    return 0


def _verdicts_of(folder: str, claims: set[str]) -> dict[str, bool]:
    """{claim: whether its verdict says it rests on stale records} for the verdicts that
    cite records of ``folder`` (their ``source``) or serve one of ``claims``."""
    import json

    from repro.claims.ledger import verdicts_dir

    out = {}
    for path in sorted(verdicts_dir().glob("*.json")):
        v = json.loads(path.read_text())
        cited = re.search(rf"\b{re.escape(folder)}\b", str(v.get("source", "")))
        # a verdict that names its records (``source``) is touched by those experiments only;
        # one that names none, by the records that serve its claim
        names_records = re.search(r"results/", str(v.get("source", "")))
        if cited or (not names_records and path.stem in claims):
            # says so: names this experiment's stale cells or records (repro.claims.staleness
            # .describe), or rests on no records at all; another experiment's stale note, or
            # the word "stale" elsewhere, does not count
            said = " ".join(str(v.get(k, "")) for k in ("key_number", "note", "stale_note"))
            out[path.stem] = v.get("verdict") == "not yet measured" or bool(re.search(
                rf"\b\d+ {re.escape(folder)} (cell|record)\(s\)", said))
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], int(kv[0][1:] or 0))))


def stale_report(cells: list[dict[str, Any]], defective: list[dict[str, Any]] = ()
                 ) -> list[dict[str, Any]]:
    """The stale cells grouped by experiment folder and hardware, with the reasons (each
    with its cells) and the verdicts they touch; and the ``defective`` records of each group
    (:func:`repro.evidence.scan_cells`: cell, record, metric, recipe, problem)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}

    def group(c: dict[str, Any]) -> dict[str, Any]:
        return groups.setdefault((c["folder"], c["hardware"]), {
            "experiment": c["folder"], "hardware": c["hardware"], "cells": 0, "records": 0,
            "claims": set(), "reasons": {}, "defective": []})

    for d in defective:
        group(d)["defective"].append({k: d[k] for k in ("cell", "record", "metric", "recipe",
                                                        "problem")})
    for c in cells:
        g = group(c)
        g["cells"] += 1
        g["records"] += c["stale"]
        g["claims"] |= set(c["claims"])
        r = g["reasons"].setdefault(c["summary"], {"reason": c["summary"], "cells": [],
                                                     "commits": set(), "since": set()})
        r["cells"].append(c["cell"])
        r["commits"].update(c["commits"])
        r["since"].update([c["since"]] if c["since"] else [])
    out = []
    for g in groups.values():
        g["verdicts"] = _verdicts_of(g["experiment"], g.pop("claims"))
        g["reasons"] = [{**r, "commits": sorted(r["commits"]), "since": sorted(r["since"])}
                        for r in g["reasons"].values()]
        out.append(g)
    return out


def cmd_status(args) -> int:
    import json

    from repro import evidence, results

    if args.write_index:
        from repro import refresh

        path, traced = evidence.write_index()
        print(f"wrote {_rel(path)} ({traced} program(s) traced)")
        cells = evidence.stale_cells()
        path = refresh.write_stale_set(repo_root(), cells)
        print(f"wrote {_rel(path)} ({len(cells)} stale cell(s))")
        return 0
    cells, defective = evidence.scan_cells()
    report = stale_report(cells, defective)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    where = _rel(results.results_dir())
    if defective:
        print(f"{len(defective)} defective record(s) under {where}, left out of every verdict "
              "(restore the file from git, or record the cell again):")
        for d in defective:
            what = ", ".join(str(d[k]) for k in ("metric", "recipe") if d[k])
            print(f"  {_rel(Path(d['path']))}: record {d['record']} ({what}): {d['problem']}")
        print()
    if not cells:
        print(f"no stale records under {where}")
        return 0
    print(f"{sum(g['records'] for g in report)} stale record(s) in {len(cells)} cell(s) under "
          f"{where}; `repro record --stale` records them again")
    for g in report:
        if not g["cells"]:
            continue
        said = [f"{c}" + ("" if ok else " (does not say so)") for c, ok in g["verdicts"].items()]
        print(f"\n{g['experiment']} on {g['hardware']}: {g['cells']} cell(s), "
              f"{g['records']} record(s); verdicts: {', '.join(said) or 'none'}")
        for r in g["reasons"]:
            names = r["cells"][:8] + ([f"... {len(r['cells']) - 8} more"]
                                      if len(r["cells"]) > 8 else [])
            commits = r["commits"][:6] + (["..."] if len(r["commits"]) > 6 else [])
            print(f"  {r['reason']}\n    recorded at {', '.join(commits)}: {', '.join(names)}")
    from repro import refresh

    print("\nrefreshing all of it (`repro record --stale` on each hardware; estimated from "
          "the records' own times):")
    for line in refresh.describe(refresh.plan(cells)):
        print(f"  {line}")
    return 0


def cmd_pipeline(args) -> int:
    from repro import pipeline
    path = repo_root() / "dvc.yaml"
    if args.check:
        if path.exists() and path.read_text() == pipeline.render():
            return 0
        print(f"repro: {_rel(path)} is out of date: run `repro pipeline`", file=sys.stderr)
        return 1
    changed = pipeline.write(path)
    print(f"{_rel(path)}: {'written' if changed else 'already up to date'} "
          f"({len(pipeline.stages())} stages)", file=sys.stderr)
    return 0


def cmd_hardware(args) -> int:
    from repro import tables

    print(tables.hardware())
    return 0


def cmd_recipes(args) -> int:
    from repro import tables

    print(tables.recipes())
    return 0


# -------------------------------------------------------------------------------- parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"repro {version('repro')}"
    except PackageNotFoundError:
        return "repro (not installed: run from a checkout)"


def _recording_options(r: argparse.ArgumentParser) -> None:
    r.add_argument("--profile", help="smoke | full | auto (default: params.yaml's profile)")
    r.add_argument("--force", action="store_true", help="redo cells already recorded")
    r.add_argument("--hardware", metavar="SLUG", type=text,
                   help="record under this name instead of the detected one (a machine the "
                   "registry lacks; a registry name must match the detected device)")
    r.add_argument("--note", metavar="TEXT", type=text,
                   help="a run_note for every record (e.g. what ran beside this job)")


def _add_trace(sub) -> None:
    t = sub.add_parser("trace", help="kernel times of traced training steps (GPU)")
    t.add_argument("workload", metavar="WORKLOAD", help="mlp, lm, gemm, ppo or inference")
    _recording_options(t)
    t.add_argument("--recipes", action="append", metavar="R",
                   help="recipes (gemm: dtypes; inference: formats); default bf16,fp8-delayed "
                        "(gemm: bf16,fp8; inference: bf16,fp8-w)")
    t.add_argument("--shapes", help="gemm: MxKxN,... one cell each (default: mlp_step's GEMMs)")
    size = number(int, 0, "expected a positive integer")
    t.add_argument("--width", type=size, default=256, help="mlp, ppo: width")
    t.add_argument("--depth", type=size, default=3, help="mlp: depth")
    t.add_argument("--num-envs", type=size, default=2048, help="ppo: the cell's envs")
    t.add_argument("--batch", type=size, help="mlp: rows (65536); lm: sequences (64); "
                   "inference: sequences (prefill: the config's; decode: 1)")
    t.add_argument("--size", default="20m", help="lm: model preset")
    t.add_argument("--config", default="wide", help="inference: a speed config of params.yaml")
    t.add_argument("--phase", default="decode", help="inference: prefill or decode")
    t.add_argument("--steps", type=size, default=5, help="steps traced per recipe")
    t.set_defaults(func=cmd_trace)


def build_parser() -> argparse.ArgumentParser:
    from repro import studies

    p = _Parser(prog="repro", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Record measurements and regenerate the notebooks.")
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of an error instead of its one line")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("record", help="run an experiment and write its records")
    r.add_argument("experiment", metavar="EXPERIMENT", nargs="?",
                   help="one of: " + ", ".join(studies.EXPERIMENTS) + ", or all (with "
                   "--stale: only its stale cells)")
    r.add_argument("--stale", action="store_true",
                   help="record again every stale cell of this hardware, cells behind a "
                   "verdict first, within --time-budget (repro status lists them)")
    r.add_argument("--ledger", action="store_true",
                   help="record this hardware's ledger set: the cells the verdicts read "
                   "(repro/data/claims.yaml), its missing and stale cells, the verdicts that "
                   "need the fewest cells first, within --time-budget")
    r.add_argument("--quality", action="store_true",
                   help="--ledger: add the quality cells any hardware may record (a CPU "
                   "records only those small enough for it)")
    r.add_argument("--claim", action="append", metavar="C",
                   help="--stale, --ledger: only cells serving these claims (repeat or "
                   "comma-separate)")
    r.add_argument("--plan", action="store_true",
                   help="--stale, --ledger: print the plan and its estimated device time, run "
                   "nothing")
    _recording_options(r)
    r.add_argument("--only", action="append", metavar="GLOB",
                   help="only the cells whose name matches (repeatable), e.g. 'mlp_w4096_*'")
    r.add_argument("--recipe", action="append", metavar="R",
                   help="only these recipes (repeat or comma-separate)")
    r.add_argument("--time-budget", type=number(float, 0, "expected seconds > 0"), metavar="S",
                   help="start no cell after S seconds (a checkpointing cell stops at S)")
    r.add_argument("--yes", action="store_true",
                   help="run a full-profile study on a CPU (refused without it: it is sized "
                   "for a GPU and would take days)")
    r.add_argument("--purejaxrl", metavar="DIR",
                   help="rl_purejaxrl: a checkout of github.com/luchris429/purejaxrl")
    r.set_defaults(func=cmd_record)

    _add_trace(sub)
    sub.add_parser("check", help="check that every rounding the experiments rely on happens "
                   "on this device").set_defaults(func=cmd_check)

    n = sub.add_parser("notebook", help="convert (jupytext) and execute (papermill) a notebook")
    n.add_argument("name", metavar="NAME", help="notebooks/NAME.py")
    n.add_argument("--profile", help="smoke | full | auto (default: params.yaml's profile)")
    n.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                   help="a parameter of the notebook's parameters cell (value parsed as YAML)")
    n.set_defaults(func=cmd_notebook)

    st = sub.add_parser("status", help="stale records (made by other code or versions than "
                        "this checkout's) and the verdicts they touch")
    st.add_argument("--json", action="store_true", help="a JSON list, one object per "
                    "experiment and hardware")
    st.add_argument("--write-index", action="store_true",
                    help="write results/programs/index.json, HEAD's program of every recorded "
                    "cell, so that checking them needs no tracing until their code changes "
                    "again, and results/programs/stale.json, the stale cells and why (commit "
                    "both: a change that stales a cell shows in the diff)")
    st.set_defaults(func=cmd_status)

    pl = sub.add_parser("pipeline", help="write dvc.yaml: each notebook stage's deps from "
                        "its imports")
    pl.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when dvc.yaml is out of date")
    pl.set_defaults(func=cmd_pipeline)

    sub.add_parser("hardware", help="the detected hardware and the datasheet registry"
                   ).set_defaults(func=cmd_hardware)
    sub.add_parser("recipes", help="the precision registry").set_defaults(func=cmd_recipes)

    c = sub.add_parser("claims", help="the claims ledger: verdict, key number, hardware, record")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="a JSON list, one object per claim")
    fmt.add_argument("--markdown", action="store_true", help="the ledger's markdown table")
    c.add_argument("--write", action="store_true",
                   help="write the ledger's page, docs/ledger.md (the README links it)")
    c.set_defaults(func=cmd_claims)

    s = sub.add_parser("site", help="build the static HTML documentation site")
    s.add_argument("--out", metavar="DIR", type=text, help="output directory (default "
                   "build/site; an existing one only if a build made it)")
    s.set_defaults(func=cmd_site)
    return p


# The signals that end a run as Ctrl-C does: Ctrl-C, what `timeout`, `docker stop` and batch
# schedulers send, and a closed terminal. The exit status is 128 + the signal's number.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP (:data:`STOP_SIGNALS`) as ``KeyboardInterrupt``, raised
    again every ``every`` seconds until :meth:`handled`: Python swallows an exception raised
    inside a garbage-collection callback or a ``__del__`` ("Exception ignored in ..."), and a
    Ctrl-C often lands in JAX's collection callback, so one interrupt alone may be lost. A
    Python handler runs only between bytecodes, so none runs while the main thread waits in a
    long XLA compilation or device call: if the interrupt is still not handled ``grace``
    seconds after the first signal, the process says so and exits at once with 128 + the
    signal's number (finished cells are on disk, the record file being written, if any, is
    removed: the interrupted cell is discarded). A signal the process was started ignoring
    (SIGHUP under ``nohup``) stays ignored. ``signum``: the first signal received."""

    def __init__(self, every: float = 1.0, grace: float = 5.0):
        self.every, self.grace, self.done, self.pending = every, grace, threading.Event(), False
        self.command: str | None = None
        self.signum: int | None = None

    def install(self) -> Interrupts:
        for sig in STOP_SIGNALS:
            if sig == signal.SIGINT or signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, self._handler)
        return self

    def handled(self) -> None:
        self.done.set()

    @property
    def status(self) -> int:
        """The exit status: 128 + the signal's number (130 for Ctrl-C)."""
        return 128 + (self.signum or signal.SIGINT)

    def _handler(self, signum, frame):
        if not self.pending:
            self.pending, self.signum = True, signum
            threading.Thread(target=self._again, daemon=True).start()
        raise KeyboardInterrupt

    def _again(self) -> None:
        start = time.monotonic()
        while not self.done.wait(self.every):
            if time.monotonic() - start >= self.grace:
                self._exit()
            os.kill(os.getpid(), self.signum or signal.SIGINT)

    def _exit(self) -> None:
        from repro import results

        for tmp in list(results.IN_FLIGHT):
            with suppress(OSError):
                os.unlink(tmp)
        with suppress(OSError, ValueError):
            what = "Ctrl-C" if self.status == 130 else signal.Signals(self.signum).name
            print(f"{interrupted_message(self.command, self.signum)} (exited {self.grace:g} s "
                  f"after {what}: the main thread was busy in a compiled call)",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
        os._exit(self.status)


_interrupts: Interrupts | None = None


def _plain_output() -> None:
    """What the ``repro`` command writes survives a terminal that is not UTF-8: a character
    it cannot show is written as an escape (``\\u2014``), not a crash; a warning (a stray
    file beside the records...) is one line, ``repro: warning: ...``."""
    import warnings

    for stream in (sys.stdout, sys.stderr):
        with suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    warnings.showwarning = lambda message, category, *a, **k: print(
        f"repro: warning: {_one_line(message)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status (see the epilog). As the ``repro`` command (no
    ``argv``), an interrupt (Ctrl-C, SIGTERM, SIGHUP) ends the process at once with 128 + the
    signal's number (130 for Ctrl-C) after flushing its output: every
    finished cell is on disk by then (writes are atomic), and the interpreter's shutdown with
    XLA's threads still running can crash (exit 139); a Ctrl-C is raised again until it is
    handled (:class:`Interrupts`)."""
    global _interrupts
    if argv is None:
        _plain_output()
    if argv is None and threading.current_thread() is threading.main_thread():
        _interrupts = Interrupts().install()
    status = _main(sys.argv[1:] if argv is None else list(argv))
    if argv is None and (status == 130 or _interrupts is not None and _interrupts.pending):
        with suppress(OSError, ValueError):
            sys.stdout.flush(), sys.stderr.flush()
        os._exit(status)
    return status


def interrupted_message(command: str | None, signum: int | None = None) -> str:
    """What an interrupt leaves: a study resumes from its finished cells; a notebook starts
    again from its first cell and left the committed outputs as they were. ``signum``: the
    signal that stopped the run (None or SIGINT: Ctrl-C)."""
    how = "interrupted" if signum in (None, signal.SIGINT) else \
        f"stopped by {signal.Signals(signum).name}"
    if command == "notebook":
        return (f"repro: {how}; the notebook's committed figures, verdicts and metrics "
                "are unchanged (a notebook does not resume: the same command runs it again "
                "from the start)")
    if command in ("record", "trace"):
        return f"repro: {how}; finished cells are kept: rerun the same command to resume"
    return f"repro: {how}"


def _main(argv: list[str]) -> int:
    from repro.results import Busy, WriteError
    from repro.studies.runner import CellsFailed, WriteFailed

    debug, parser, args = "--debug" in argv, build_parser(), None
    try:
        args = parser.parse_args(argv)
        if _interrupts is not None:
            _interrupts.command = args.command
        if args.command is None:
            parser.print_help()
            return 0
        return args.func(args)
    except BrokenPipeError:  # `repro claims --json | head`: not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:
        signum = None
        if _interrupts is not None:
            _interrupts.handled()
            signum = _interrupts.signum
        if debug:
            raise
        print(interrupted_message(getattr(args, "command", None), signum), file=sys.stderr)
        return 128 + (signum or signal.SIGINT)
    except Exception as e:  # noqa: BLE001 - every error reaching here is one line
        if debug:
            raise
        usage = isinstance(e, (UsageError, ConfigError, ValueError))
        line = _one_line(e) if usage or isinstance(
            e, (CellsFailed, WriteFailed, WriteError, Busy)) else \
            f"{type(e).__name__}: {_one_line(e)} (--debug shows the traceback)"
        print(f"repro: error: {line}", file=sys.stderr)
        return 2 if usage else 1


if __name__ == "__main__":
    sys.exit(main())
