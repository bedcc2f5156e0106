"""Ending a run on Ctrl-C, SIGTERM and SIGHUP: the interrupt raised again until it is handled,
and the process's exit when the main thread is busy in a compiled call."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import suppress


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
