"""The ``repro`` command: record measurements, run notebooks, show the hardware.

    repro record EXPERIMENT [--profile smoke|full|auto] [--force] [--hardware SLUG] [--recipe R]
    repro record all [--profile P] [--force] [--hardware SLUG]
    repro bench gemm ...                  (alias of ``repro record gemm``)
    repro notebook NAME [--profile P] [-p key=value ...]
    repro hardware
    repro claims [--json | --markdown] [--update-readme]
    repro site [--out DIR]

``record`` looks EXPERIMENT up in :data:`EXPERIMENTS` ("module:function"), and calls
``function(profile, root, force)``; records go to ``results/`` (full profile, committed) or
``build/results/`` (smoke, scratch). ``record all`` runs every experiment of :data:`EXPERIMENTS`
in order, resumably (each experiment skips the cells it already recorded), with a progress bar
and a log in ``build/logs/record.log``. ``notebook`` converts ``notebooks/NAME.py`` (Jupytext
py:percent) to ``build/notebooks/NAME.ipynb`` and executes it with papermill into
``build/notebooks/NAME.out.ipynb``, with the repository root as working directory and the
kernel's output in ``build/logs/NAME.log``; this is the command every DVC stage runs.
``claims`` prints the claims ledger (``repro.claims.ledger``) and regenerates the README's table;
``site`` builds the static documentation site (``repro.site``) in ``build/site/``.

Bad input (an unknown experiment, recipe, profile or notebook, a malformed ``params.yaml``)
prints one line ``repro: error: ...`` on stderr and exits 2 before anything is written.
``REPRO_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

from repro.config import ConfigError

# experiment -> "module:function"; the function is record(profile, root, force).
EXPERIMENTS: dict[str, str] = {
    "gemm": "repro.studies.gemm:record_gemm",
    "mlp_step": "repro.studies.mlp_step:record",
    "lm_step": "repro.studies.lm_step:record",
    "rl_throughput": "repro.studies.rl_throughput:record_throughput",
    "rl_quality": "repro.studies.rl_throughput:record_quality",
    "lm": "repro.studies.lm_quality:record",
    "multigpu": "repro.studies.multigpu:record",
    "legged": "repro.studies.legged:record",
}
BENCH_ALIASES = ("gemm",)
ALL = "all"  # repro record all: every experiment above, in order
KERNEL = "python3"


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage block and then the error; we want exactly one line.
    def error(self, message):
        raise UsageError(message)


# ------------------------------------------------------------------------------- helpers


def _one_line(msg: Any) -> str:
    return " ".join(str(msg).split())


def _profile(arg: str | None) -> str:
    """The resolved profile: ``--profile`` or params.yaml's ``profile``; ``auto`` resolved."""
    from repro import config

    params = config.load_params()  # validates params.yaml (ConfigError on malformed YAML)
    return config.resolve_profile(arg if arg is not None else params.get("profile", "smoke"))


def _split_list(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v for item in values for v in item.split(",") if v]


def resolve_experiment(name: str) -> Callable:
    """The record function of ``name``, or a one-line error if it does not exist (yet)."""
    if name not in EXPERIMENTS:
        raise UsageError(f"unknown experiment {name!r}; valid experiments: "
                         f"{', '.join(EXPERIMENTS)} (or {ALL})")
    module, func = EXPERIMENTS[name].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise UsageError(f"experiment {name!r} is not available yet: module {module} "
                             "does not exist in this checkout") from None
        raise UsageError(f"experiment {name!r}: importing {module} failed: {e}") from None
    fn = getattr(mod, func, None)
    if fn is None:
        raise UsageError(f"experiment {name!r}: {module} has no function {func}")
    return fn


def valid_recipes(experiment: str) -> list[str]:
    if experiment == "gemm":
        from repro.studies.gemm import GEMM_DTYPES

        return list(GEMM_DTYPES)
    from repro.precision.recipes import names as recipe_names

    return recipe_names()


def _recipe_ok(experiment: str, name: str, valid: list[str]) -> bool:
    """A name of the precision registry, or a variant 'base:field=value' of one."""
    if name in valid:
        return True
    if experiment == "gemm":
        return False
    from repro.precision import resolve

    try:
        resolve(name)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------ commands


def _use_hardware(slug: str | None) -> None:
    if slug:
        os.environ["REPRO_HARDWARE"] = slug
        from repro import hardware

        hardware.detect.cache_clear()


def _check_numerics(profile: str) -> None:
    """Full-profile records are evidence: refuse to write them on a device where a rounding
    the experiments rely on is skipped (``repro.precision.check``; raises a one-line error)."""
    if profile == "full":
        from repro.precision import check as numerics_check

        numerics_check.require()


def cmd_record(args) -> int:
    from repro import config, results

    if args.command == "bench" and args.experiment not in BENCH_ALIASES:
        raise UsageError(f"repro bench knows {', '.join(BENCH_ALIASES)}; "
                         f"use repro record {args.experiment}")
    if args.experiment == ALL:
        return record_all(args)
    if args.experiment not in EXPERIMENTS:
        resolve_experiment(args.experiment)  # raises the one-line error
    _use_hardware(args.hardware)
    # Validate everything before the first write: profile, params.yaml, recipes, module.
    profile = _profile(args.profile)
    config.stage_params(args.experiment, profile)
    recipes = _split_list(args.recipe)
    if recipes is not None:
        valid = valid_recipes(args.experiment)
        bad = [r for r in recipes if not _recipe_ok(args.experiment, r, valid)]
        if bad:
            raise UsageError(f"unknown recipe(s) {', '.join(bad)} for {args.experiment}; "
                             f"valid recipes: {', '.join(valid)}")
    fn = resolve_experiment(args.experiment)
    _check_numerics(profile)
    kwargs: dict[str, Any] = {}
    if recipes is not None:
        if "recipes" not in inspect.signature(fn).parameters:
            raise UsageError(f"experiment {args.experiment!r} does not take --recipe")
        kwargs["recipes"] = recipes
    root = results.record_root(profile)
    written = fn(profile, root, args.force, **kwargs) or []
    for path in written:
        print(path)
    print(f"{args.experiment} [{profile}]: wrote {len(written)} cell(s) under {root}"
          + ("" if written else " (all cells already recorded; --force redoes them)"))
    return 0


def record_all(args) -> int:
    """``repro record all``: every experiment of :data:`EXPERIMENTS`, in order.

    Resumable: each experiment skips the cells it has already recorded for this hardware, so
    rerunning after an interruption (Ctrl-C, a lost machine) continues where it stopped. An
    experiment that fails is logged (traceback in ``build/logs/record.log``) and the next one
    runs; the exit status is 1 if any failed. An experiment whose module is missing from this
    checkout is skipped with a note.
    """
    from tqdm import tqdm  # not tqdm.auto: that wants ipywidgets inside notebooks

    from repro import config, results

    if args.recipe:
        raise UsageError("--recipe selects recipes of one experiment; it does not apply to "
                         "`repro record all`")
    _use_hardware(args.hardware)
    # Validate everything before the first write: profile, every experiment's params section.
    profile = _profile(args.profile)
    params = config.load_params()
    plan, unavailable = [], []
    for name in EXPERIMENTS:
        config.stage_params(name, profile, params)
        try:
            plan.append((name, resolve_experiment(name)))
        except UsageError as e:
            unavailable.append((name, str(e)))
    root = results.record_root(profile)
    _check_numerics(profile)

    from repro import hardware

    slug = hardware.detect().slug
    log_path = results.repo_root() / "build" / "logs" / "record.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("repro.record")
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.FileHandler(log_path, mode="a")  # append: the history of resumed runs
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    print(f"repro record all [{profile}] on {slug}: {len(plan)} experiment(s) -> {root} "
          f"(log {_rel(log_path)})", file=sys.stderr)
    log.info("record all: profile=%s hardware=%s root=%s force=%s experiments=%s", profile,
             slug, root, args.force, ",".join(n for n, _ in plan))
    for name, why in unavailable:
        log.warning("%s: skipped: %s", name, why)
        print(f"repro: skipping {name}: {why}", file=sys.stderr)

    done: dict[str, int] = {}
    failed: list[str] = []
    try:
        bar = tqdm(plan, desc=f"record all [{profile}]", unit="experiment", file=sys.stderr)
        for name, fn in bar:
            bar.set_postfix_str(name)
            log.info("%s: start", name)
            t0 = time.perf_counter()
            try:
                written = fn(profile, root, args.force) or []
            except KeyboardInterrupt:
                log.warning("%s: interrupted after %.1f s; finished cells are kept, rerun to "
                            "resume", name, time.perf_counter() - t0)
                raise
            except Exception as e:  # noqa: BLE001 - one experiment must not stop the others
                log.exception("%s: failed after %.1f s", name, time.perf_counter() - t0)
                failed.append(name)
                tqdm.write(f"repro: {name} failed: {type(e).__name__}: {_one_line(e)[:300]} "
                           f"(traceback in {_rel(log_path)})", file=sys.stderr)
                continue
            for path in written:
                log.info("%s: wrote %s", name, path)
                print(path)
            done[name] = len(written)
            log.info("%s: wrote %d cell(s) in %.1f s%s", name, len(written),
                     time.perf_counter() - t0, "" if written else " (all already recorded)")
        bar.close()
    finally:
        log.removeHandler(handler)
        handler.close()
    summary = ", ".join(f"{n} {c}" for n, c in done.items()) or "nothing"
    print(f"record all [{profile}] on {slug}: cells written: {summary}"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + (f"; skipped (not in this checkout): {', '.join(n for n, _ in unavailable)}"
             if unavailable else "")
          + f" (under {root})")
    return 1 if failed else 0


def _rel(path: Path) -> str:
    from repro.results import repo_root

    try:
        return str(Path(path).resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path)


def _parse_params(pairs: list[str] | None) -> dict[str, Any]:
    import yaml

    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-p expects key=value with a Python identifier as key, got {pair!r}")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def notebook_names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "notebooks").glob("[0-9]*.py"))


def _atomic_replace(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)


def cmd_notebook(args) -> int:
    from repro.results import repo_root

    root = repo_root().resolve()
    name = Path(args.name).name
    name = name[:-3] if name.endswith(".py") else name
    source = root / "notebooks" / f"{name}.py"
    if not source.is_file():
        have = notebook_names(root)
        raise UsageError(f"no notebook {name!r} (looked for {source.relative_to(root)}); "
                         f"available: {', '.join(have) or 'none'}")
    params = _parse_params(args.param)
    params["profile"] = _profile(args.profile if args.profile is not None
                                 else params.get("profile"))

    import jupytext
    import papermill
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        raise UsageError(f"no Jupyter kernel {KERNEL!r}: run `python -m ipykernel install "
                         f"--sys-prefix --name {KERNEL}` (bash .ci/install does)") from None

    nb_dir, log_dir = root / "build" / "notebooks", root / "build" / "logs"
    nb_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    ipynb, out = nb_dir / f"{name}.ipynb", nb_dir / f"{name}.out.ipynb"
    failed, log_path = nb_dir / f"{name}.failed.ipynb", log_dir / f"{name}.log"

    nb = jupytext.read(source)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata.setdefault("jupytext", {})["source"] = str(source.relative_to(root))
    tmp = nb_dir / f".{name}.tmp.ipynb"
    jupytext.write(nb, tmp, fmt="ipynb")
    _atomic_replace(tmp, ipynb)

    # The kernel must import this very `repro`, whichever directory it runs in.
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

    if params["profile"] == "smoke" and "REPRO_SCRATCH_RESULTS" not in os.environ:
        # Smoke records are scratch: each run starts from an empty folder of its own, so a
        # figure never mixes in records that older code wrote (resuming is for full runs).
        scratch = root / "build" / "results" / name
        shutil.rmtree(scratch, ignore_errors=True)
        os.environ["REPRO_SCRATCH_RESULTS"] = str(scratch)

    tmp_out = nb_dir / f".{name}.running.ipynb"
    print(f"repro notebook {name}: {source.relative_to(root)} -> {out.relative_to(root)} "
          f"(profile={params['profile']}, log {log_path.relative_to(root)})", file=sys.stderr)
    handler = logging.FileHandler(log_path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    pm_log = logging.getLogger("papermill")
    pm_log.addHandler(handler)
    pm_log.setLevel(logging.INFO)
    try:
        with open(log_path, "a") as log:
            papermill.execute_notebook(
                str(ipynb), str(tmp_out), parameters=params, kernel_name=KERNEL,
                cwd=str(root), log_output=False, stdout_file=log, stderr_file=log,
                progress_bar=sys.stderr.isatty())
        _atomic_replace(tmp_out, out)  # only a complete run replaces the previous output
    except papermill.PapermillExecutionError as e:
        if tmp_out.exists():
            _atomic_replace(tmp_out, failed)
        print(f"repro: error: notebook {name} failed in cell {e.exec_count}: {e.ename}: "
              f"{_one_line(e.evalue)[:300]} (see {failed.relative_to(root)} and "
              f"{log_path.relative_to(root)})", file=sys.stderr)
        return 1
    finally:
        pm_log.removeHandler(handler)
        handler.close()
        tmp_out.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    print(f"wrote {out.relative_to(root)}", file=sys.stderr)
    return 0


def format_ledger(rows: list[dict[str, Any]], width: int | None = None) -> str:
    """The ledger for a terminal: one block per claim (verdict, hardware, key number, record)."""
    from collections import Counter

    width = width or min(shutil.get_terminal_size((100, 24)).columns, 120)
    counts = Counter(r["verdict"] for r in rows)
    from repro.claims.ledger import VERDICTS

    head = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])
    out = [f"claims ledger: {len(rows)} claims ({head})", ""]
    vw = max(len(v) for v in VERDICTS)

    def wrap(label: str, text: str) -> list[str]:
        return textwrap.wrap(f"{label}{text}", width=width, initial_indent="     ",
                             subsequent_indent="       ")

    for r in rows:
        hw = f"  on {r['hardware']}" if r["hardware"] else ""
        emu = "  (emulated)" if r.get("emulated") else ""
        out.append(f"{r['claim']:<4} {r['verdict']:<{vw}}{hw}{emu}")
        out += wrap("", r["statement"])
        if r["key_number"]:
            out += wrap("key number: ", r["key_number"])
        if r["source"]:
            out += wrap("record: ", r["source"])
        out += wrap("notebook: ", f"notebooks/{r['notebook']}.py" if r["notebook"]
                    else "none (not tested in this repository)")
    return "\n".join(out)


def cmd_claims(args) -> int:
    from repro.claims import ledger as claims
    from repro.results import repo_root

    rows = claims.ledger()
    if args.update_readme:
        readme = repo_root() / "README.md"
        if not readme.is_file():
            raise UsageError(f"no README.md at {readme}")
        changed = claims.update_readme(readme)
        print(f"{_rel(readme)}: claims table {'updated' if changed else 'already up to date'} "
              f"({len(rows)} claims)", file=sys.stderr)
        if not (args.json or args.markdown):
            return 0
    if args.json:
        print(json.dumps(rows, indent=1))
    elif args.markdown:
        print(claims.markdown_table(rows))
    else:
        print(format_ledger(rows))
    return 0


def cmd_site(args) -> int:
    from repro import site
    from repro.results import repo_root

    root = repo_root()
    out = Path(args.out) if args.out else root / "build" / "site"
    index = site.build_site(root, out)
    print(f"wrote {_rel(index)} ({len(site.notebook_pages(root / 'build' / 'notebooks'))} "
          f"notebook page(s))", file=sys.stderr)
    return 0


def cmd_hardware(args) -> int:
    from repro import hardware

    info = hardware.detect()
    print(f"detected: {info.slug} ({info.name}), backend {info.backend}, compute capability "
          f"{info.compute_capability or '-'}, native FP8 {'yes' if info.has_fp8 else 'no'}, "
          f"native FP4 {'yes' if info.has_fp4 else 'no'}")
    if os.environ.get("REPRO_HARDWARE"):
        print(f"  (slug overridden by REPRO_HARDWARE={os.environ['REPRO_HARDWARE']})")
    kinds = ["fp4", "fp8", "bf16", "fp16", "tf32", "fp32"]
    print("\nregistry (repro/data/hardware.yaml): datasheet dense TFLOP/s, TB/s")
    print(f"{'slug':<10} {'cc':>5} " + " ".join(f"{k:>7}" for k in kinds) + f" {'TB/s':>6}  name")
    for slug in hardware.registry():
        e = hardware.lookup(slug)

        def fmt(v):
            return "-" if v is None else f"{v:g}"
        print(f"{slug:<10} {e.compute_capability or '-':>5} "
              + " ".join(f"{fmt(e.peak_tflops.get(k)):>7}" for k in kinds)
              + f" {fmt(e.memory_bandwidth_tbs):>6}  {e.name}")
    return 0


# -------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="repro", description="Record measurements and regenerate the notebooks.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_record(name, help_):
        r = sub.add_parser(name, help=help_)
        r.add_argument("experiment", metavar="EXPERIMENT",
                       help="one of: " + (", ".join([*EXPERIMENTS, ALL]) if name == "record"
                                          else ", ".join(BENCH_ALIASES)))
        r.add_argument("--profile", help="smoke | full | auto (default: params.yaml's profile)")
        r.add_argument("--force", action="store_true", help="redo cells already recorded")
        r.add_argument("--hardware", metavar="SLUG",
                       help="record under this hardware name (sets REPRO_HARDWARE)")
        r.add_argument("--recipe", action="append", metavar="R",
                       help="only these recipes (repeat or comma-separate)")
        r.set_defaults(func=cmd_record)

    add_record("record", "run an experiment and write its records")
    add_record("bench", "alias: repro bench gemm == repro record gemm")

    n = sub.add_parser("notebook", help="convert (jupytext) and execute (papermill) a notebook")
    n.add_argument("name", metavar="NAME", help="notebooks/NAME.py")
    n.add_argument("--profile", help="smoke | full | auto (default: params.yaml's profile)")
    n.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                   help="extra notebook parameter (value parsed as YAML)")
    n.set_defaults(func=cmd_notebook)

    h = sub.add_parser("hardware", help="the detected hardware and the datasheet registry")
    h.set_defaults(func=cmd_hardware)

    c = sub.add_parser("claims", help="the claims ledger: verdict, key number, hardware, record")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="a JSON list, one object per claim")
    fmt.add_argument("--markdown", action="store_true", help="the README's markdown table")
    c.add_argument("--update-readme", action="store_true",
                   help="rewrite README.md's table between the claims markers")
    c.set_defaults(func=cmd_claims)

    s = sub.add_parser("site", help="build the static HTML documentation site")
    s.add_argument("--out", metavar="DIR", help="output directory (default build/site)")
    s.set_defaults(func=cmd_site)
    return p


def main(argv: list[str] | None = None) -> int:
    debug = bool(os.environ.get("REPRO_DEBUG"))
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (UsageError, ConfigError, ValueError) as e:
        if debug:
            raise
        print(f"repro: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `repro claims --json | head`: not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:
        if debug:
            raise
        print("repro: interrupted; finished cells are kept: rerun the same command to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
