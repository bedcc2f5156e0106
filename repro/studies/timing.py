"""Timing compiled calls: warm-up, then timed calls each ended by ``jax.block_until_ready``,
alone (:func:`time_fn`) or in rounds (:func:`time_interleaved`, :func:`time_rounds`) so that
two recipes' samples see the same machine state. What a compiled program says of itself (its
FP8 lowering, XLA's cost estimate) is read in :mod:`repro.studies.lowering`.

These functions are part of the measuring kit of the programs that use them: their source is
hashed into each record's kit fingerprint (:mod:`repro.program`): moving them is free, editing
them stales the records whose kit holds them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of the timed calls: median, interquartile range, all samples."""

    median_s: float
    iqr_s: float
    samples: tuple[float, ...]


def time_fn(fn: Callable, *args, repeats: int = 10, warmup: int = 2,
            input_sets: Sequence[Sequence[Any]] | None = None) -> Timing:
    """Time ``fn(*args)``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    ``fn`` should be jitted by the caller (outside this function), so the warm-up calls pay for
    compilation and the timed calls measure execution only. Each call is ended with
    ``jax.block_until_ready`` (JAX dispatches asynchronously). ``input_sets``: a list of
    argument tuples to rotate through, call after call, so that a small problem cannot be served
    from a cache warmed by the previous call; when given, ``args`` must be empty.
    """
    if repeats < 1:
        raise ValueError(f"time_fn: repeats must be >= 1, got {repeats}")
    if input_sets is not None:
        if args:
            raise ValueError("time_fn: pass either *args or input_sets, not both")
        sets = [tuple(s) for s in input_sets]
        if not sets:
            raise ValueError("time_fn: input_sets is empty")
    else:
        sets = [args]
    for i in range(max(warmup, 0)):
        jax.block_until_ready(fn(*sets[i % len(sets)]))
    samples = []
    for i in range(repeats):
        a = sets[i % len(sets)]
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*a))
        samples.append(time.perf_counter() - t0)
    q25, q50, q75 = np.percentile(samples, [25, 50, 75])
    return Timing(float(q50), float(q75 - q25), tuple(samples))


def stepper(step, variables, opt_state, *args):
    """A zero-argument function that runs one training step ``step(variables, opt_state,
    *args) -> (variables, opt_state, loss)`` on state it keeps, and returns the loss."""
    state = [variables, opt_state]

    def run():
        state[0], state[1], loss = step(state[0], state[1], *args)
        return loss

    return run


def time_interleaved(runners: dict[str, Any], repeats: int, steps_per_sample: int = 5,
                     where: str = "") -> dict[str, np.ndarray]:
    """Seconds per step of each runner (:func:`stepper`), timed in rounds (A, B, C, A, B, C,
    ...): a sample is ``steps_per_sample`` steps ended by ``jax.block_until_ready``, so every
    runner sees the same machine state over the run and a ratio of two medians compares like
    with like. A non-finite loss stops the run (``where`` says which cell)."""
    samples: dict[str, list[float]] = {r: [] for r in runners}
    for _ in range(repeats):
        for r, run in runners.items():
            t0 = time.perf_counter()
            for _ in range(steps_per_sample):
                loss = run()
            jax.block_until_ready(loss)
            samples[r].append((time.perf_counter() - t0) / steps_per_sample)
            if not np.isfinite(float(loss)):
                raise FloatingPointError(f"{r}: non-finite loss{where}")
    return {r: np.asarray(s) for r, s in samples.items()}


def time_rounds(calls: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1
                ) -> dict[str, np.ndarray]:
    """Seconds of each zero-argument call (compiled by the caller), timed in rounds (A, B, C,
    A, B, C, ...) after ``warmup`` untimed calls of each, every call ended by
    ``jax.block_until_ready``. Sample k of every call comes from round k, so two calls' k-th
    samples saw the same machine state: their ratio is a paired ratio, and its spread over the
    rounds is the ratio's own."""
    if rounds < 1:
        raise ValueError(f"time_rounds: rounds must be >= 1, got {rounds}")
    for _ in range(max(warmup, 0)):
        for fn in calls.values():
            jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            samples[k].append(time.perf_counter() - t0)
    return {k: np.asarray(v) for k, v in samples.items()}


def quartiles(samples: np.ndarray) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of the samples."""
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return float(q1), float(med), float(q3)
