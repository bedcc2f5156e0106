"""``repro record`` and ``repro trace``: run studies and write their records (one experiment,
``all``, the stale cells of this hardware, or its ledger set), each through
:func:`repro.studies.run` under the lock of its results folder."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from repro.checkout import repo_root
from repro.cli.checks import (UsageError, check_cpu_full, check_experiment, check_label,
                              check_numerics, number, one_line, rel, report, resolved_profile,
                              split, text)


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


def _run(args, study, params, root: Path, budget: float | None):
    from repro import studies

    return studies.run(study, params, root, force=args.force, only=args.only,
                       recipes=split(args.recipe), time_budget_s=budget,
                       hardware=args.hardware, note=args.note)


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
        check_experiment(args.experiment)
    profile = resolved_profile(args.profile)
    check_cpu_full(args, profile, list(studies.EXPERIMENTS) if args.experiment == "all"
                   else [args.experiment])
    plan = _plan(args, profile)
    check_numerics(profile)
    root = results.record_root(profile)
    if args.experiment == "all":
        return record_all(args, plan, profile, root)
    (name, study, params), = plan
    print(report(name, profile, _run(args, study, params, root, args.time_budget), root))
    return 0


def record_stale(args) -> int:
    """``repro record --stale``: the stale cells of this hardware (:mod:`repro.refresh`),
    printed as a plan with its estimated device time, then recorded in that order, each
    experiment with ``--only`` its cells, until ``--time-budget`` is spent."""
    from repro import evidence, hardware, refresh, results

    if args.only or args.recipe or args.force:
        raise UsageError("--stale chooses the cells itself: leave out --only, --recipe, "
                         "--force")
    if args.experiment not in (None, "all"):
        check_experiment(args.experiment)
    check_label(args)
    profile = resolved_profile(args.profile)
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
    todo = [(c["folder"], c["cell"]) for c in steps if c["recordable"]]
    return record_cells(args, profile, todo, "--stale", "stale")


def record_cells(args, profile: str, todo: list[tuple[str, str]], flag: str, what: str,
                 force: bool = False) -> int:
    """Record the cells ``todo`` ((experiment, cell), in order), each experiment's in one
    run, until ``--time-budget`` is spent; one line per experiment."""
    from repro import results, studies

    if todo:
        check_cpu_full(argparse.Namespace(**{**vars(args), "experiment": flag}), profile,
                       [todo[0][0]])
    check_numerics(profile)
    root, start, lines = results.record_root(profile), time.monotonic(), []
    for name in dict.fromkeys(exp for exp, _ in todo):
        left = None if args.time_budget is None else \
            args.time_budget - (time.monotonic() - start)
        if left is not None and left <= 0:
            lines.append(f"time budget spent before {name}")
            break
        only = [cell for exp, cell in todo if exp == name]
        s, p = studies.study(name), studies.params(name, profile)
        if missing := [r for r in s.requires if getattr(p, r, None) is None]:
            lines.append(f"{name}: {len(only)} {what} cell(s) left: it needs --"
                         f"{missing[0].replace('_', '-')} (repro record {name} --"
                         f"{missing[0].replace('_', '-')} DIR records them)")
            continue
        out = runner_run(s, p, root, only, left, args, force=force)
        lines.append(report(name, profile, out, root))
    print("\n".join(lines))
    return 0


def record_ledger(args) -> int:
    """``repro record --ledger``: the ledger set of this hardware (:mod:`repro.claims.
    ledger_set`: the cells the verdicts read), printed as a plan with each cell's estimated
    device time, then its missing and stale cells recorded, the verdicts that need the fewest
    cells first, until ``--time-budget`` is spent (``--force``: every cell of the set)."""
    from repro import hardware, refresh, results
    from repro.claims import ledger

    if args.only or args.recipe:
        raise UsageError("--ledger chooses the cells itself: leave out --only and --recipe")
    if args.experiment not in (None, "all"):
        raise UsageError("--ledger records every experiment of the set: leave out EXPERIMENT "
                         "(--claim C keeps one claim's cells)")
    profile = resolved_profile(args.profile or "full")  # the ledger is full-profile evidence
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
    todo = [c for c in rows if c["recordable"] and (
        args.force or not c["status"].startswith("fresh"))]
    if skipped := [c for c in rows if not c["recordable"] and
                   not c["status"].startswith("fresh")]:
        print(f"repro: {len(skipped)} ledger cell(s) are not recorded by `repro record` "
              f"(docs/RECORDING.md says how): {', '.join(c['experiment'] + '/' + c['cell'] for c in skipped[:6])}",
              file=sys.stderr)
    if not todo:
        print(f"the ledger set on {slug} is recorded: nothing to do (--force records it again)")
        return 0
    return record_cells(args, profile, [(c["experiment"], c["cell"]) for c in todo],
                        "--ledger", "ledger", force=args.force)


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
          f"(log {rel(log_path)})", file=sys.stderr)
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
                print(f"repro: {name} failed: {one_line(e)[:300]} (traceback in "
                      f"{rel(log_path)})", file=sys.stderr)
                continue
            lines.append(report(name, profile, out, root))
            log.info("%s", lines[-1])
    print("\n".join(lines + ([f"FAILED: {', '.join(failed)}"] if failed else [])))
    return 1 if failed else 0


def cmd_trace(args) -> int:
    from repro import results, studies
    from repro.experiments.kernel_times import measure as K
    from repro.studies import runner

    profile = resolved_profile(args.profile or "full")
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
    print(report(K.EXPERIMENT, profile, out, root))
    return 0


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


def add(sub) -> None:
    """The ``record`` and ``trace`` commands."""
    from repro import studies

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
