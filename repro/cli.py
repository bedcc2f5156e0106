"""The ``repro`` command: record measurements, run notebooks, show the hardware.

    repro record EXPERIMENT [--profile smoke|full|auto] [--force] [--hardware SLUG] [--recipe R]
    repro bench gemm ...                  (alias of ``repro record gemm``)
    repro notebook NAME [--profile P] [-p key=value ...]
    repro hardware

``record`` looks EXPERIMENT up in :data:`EXPERIMENTS` ("module:function"), and calls
``function(profile, root, force)``; records go to ``results/`` (full profile, committed) or
``build/results/`` (smoke, scratch). ``notebook`` converts ``notebooks/NAME.py`` (Jupytext
py:percent) to ``build/notebooks/NAME.ipynb`` and executes it with papermill into
``build/notebooks/NAME.out.ipynb``, with the repository root as working directory and the
kernel's output in ``build/logs/NAME.log``; this is the command every DVC stage runs.

Bad input (an unknown experiment, recipe, profile or notebook, a malformed ``params.yaml``)
prints one line ``repro: error: ...`` on stderr and exits 2 before anything is written.
``REPRO_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

from repro.config import ConfigError

# experiment -> "module:function"; the function is record(profile, root, force).
EXPERIMENTS: dict[str, str] = {
    "gemm": "repro.bench:record_gemm",
    "mlp_step": "repro.mlpbench:record",
    "rl_throughput": "repro.rl.experiments:record_throughput",
    "rl_quality": "repro.rl.experiments:record_quality",
    "lm": "repro.lm.experiments:record",
}
BENCH_ALIASES = ("gemm",)
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
                         f"{', '.join(EXPERIMENTS)}")
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
        from repro.bench import GEMM_DTYPES

        return list(GEMM_DTYPES)
    from repro.recipes import recipe_names

    return recipe_names()


# ------------------------------------------------------------------------------ commands


def cmd_record(args) -> int:
    from repro import config, results

    if args.command == "bench" and args.experiment not in BENCH_ALIASES:
        raise UsageError(f"repro bench knows {', '.join(BENCH_ALIASES)}; "
                         f"use repro record {args.experiment}")
    if args.experiment not in EXPERIMENTS:
        resolve_experiment(args.experiment)  # raises the one-line error
    if args.hardware:
        os.environ["REPRO_HARDWARE"] = args.hardware
        from repro import hardware

        hardware.detect.cache_clear()
    # Validate everything before the first write: profile, params.yaml, recipes, module.
    profile = _profile(args.profile)
    config.stage_params(args.experiment, profile)
    recipes = _split_list(args.recipe)
    if recipes is not None:
        valid = valid_recipes(args.experiment)
        bad = [r for r in recipes if r not in valid]
        if bad:
            raise UsageError(f"unknown recipe(s) {', '.join(bad)} for {args.experiment}; "
                             f"valid recipes: {', '.join(valid)}")
    fn = resolve_experiment(args.experiment)
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
                       help=f"one of: {', '.join(EXPERIMENTS if name == 'record' else BENCH_ALIASES)}")
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


if __name__ == "__main__":
    sys.exit(main())
