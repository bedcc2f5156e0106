"""The ``repro`` command: record measurements, run notebooks, show what is known.

    repro record EXPERIMENT|all [--profile P] [--force] [--only GLOB] [--recipe R] ...
    repro trace WORKLOAD [--recipes R,...] ...   kernel times of traced steps (GPU)
    repro check                                  the numerics check of this device
    repro notebook NAME [--profile P] [-p KEY=VALUE ...]
    repro status [--json]                        stale records and the verdicts they touch
    repro pipeline [--check]                     write dvc.yaml from the notebooks' imports
    repro registration [--write|--check]         when each claim's rule was fixed (git history)
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
import os
import signal
import sys
import threading
from contextlib import suppress

from repro.cli import device, outputs, record, status
from repro.cli.checks import UsageError, one_line
from repro.cli.interrupts import Interrupts, interrupted_message
from repro.config import ConfigError

__all__ = ["Interrupts", "build_parser", "interrupted_message", "main"]


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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"repro {version('repro')}"
    except PackageNotFoundError:
        return "repro (not installed: run from a checkout)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="repro", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Record measurements and regenerate the notebooks.")
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of an error instead of its one line")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    record.add(sub)  # record, trace
    device.add_check(sub)
    outputs.add_notebook(sub)
    status.add(sub)
    outputs.add_pipeline(sub)
    device.add(sub)  # hardware, recipes
    outputs.add(sub)  # claims, registration, site
    return p


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
        f"repro: warning: {one_line(message)}", file=sys.stderr)


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
        line = one_line(e) if usage or isinstance(
            e, (CellsFailed, WriteFailed, WriteError, Busy)) else \
            f"{type(e).__name__}: {one_line(e)} (--debug shows the traceback)"
        print(f"repro: error: {line}", file=sys.stderr)
        return 2 if usage else 1

