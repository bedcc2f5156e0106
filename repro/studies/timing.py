from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

FP8_GEMM_TARGET = "__cublas$lt$matmul$f8"


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


def fp8_lowering(hlo_text: str, platform: str | None = None) -> str:
    """How a compiled program's f8 products run: :func:`repro.studies.lowering.fp8_lowering`
    (read there, outside the measuring kit)."""
    from repro.studies import lowering

    return lowering.fp8_lowering(hlo_text, platform)

_NOT_KERNELS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})


def entry_ops(hlo_text: str) -> dict[str, int]:
    """Opcode counts of the ENTRY computation of an optimized HLO module, leaving out those
    that launch nothing (parameters, constants, tuples, bitcasts). On a GPU each remaining op
    (``fusion``, ``custom-call`` to cuBLAS, ``copy``...) is about one kernel; loops (``while``)
    count once, whatever their bodies launch."""
    start = hlo_text.find("ENTRY")
    if start < 0:
        return {}
    end = hlo_text.find("\n}", start)
    body = hlo_text[start:end if end > 0 else None]
    counts: dict[str, int] = {}
    for op in re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*?[\]})] ([a-z][\w\-]*)\(", body,
                         re.M):
        if op not in _NOT_KERNELS:
            counts[op] = counts.get(op, 0) + 1
    return counts


def compiled_facts(compiled) -> dict[str, Any]:
    """What a compiled program says about itself: how many cuBLASLt FP8 GEMM calls it makes,
    how its f8 products lower (:func:`fp8_lowering`), its buffer bytes (arguments + outputs
    + temporaries - aliased, from XLA's ``memory_analysis``), and XLA's own static cost
    estimate: ``hlo_bytes_accessed`` and ``hlo_flops`` (``cost_analysis``) and ``hlo_kernels``
    (launching ops of the ENTRY computation, :func:`entry_ops`). None where not implemented.
    The step-time model (``repro.perfmodel``) can read a program's traffic and kernel count
    from these instead of assuming them."""
    text = compiled.as_text() or ""
    ops = entry_ops(text)
    facts: dict[str, Any] = {"fp8_gemm_calls": text.count(FP8_GEMM_TARGET),
                             "fp8_lowering": fp8_lowering(text), "memory_bytes": None,
                             "hlo_kernels": sum(ops.values()) if ops else None,
                             "hlo_bytes_accessed": None, "hlo_flops": None}
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        facts["hlo_bytes_accessed"] = float(cost["bytes accessed"])
        facts["hlo_flops"] = float(cost["flops"])
    except Exception:  # not every backend implements it
        pass
    try:
        m = compiled.memory_analysis()
        facts["memory_bytes"] = int(m.argument_size_in_bytes + m.output_size_in_bytes
                                    + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # not every backend implements it
        pass
    return facts


def recipe_emulated(recipe, lowering, hardware=None) -> bool:
    """Whether a timing of ``recipe`` measures emulation rather than its format:
    :func:`repro.studies.lowering.recipe_emulated`."""
    from repro.studies import lowering as L

    return L.recipe_emulated(recipe, lowering, hardware)


def compiled_gemm_info(fn: Callable, *args) -> dict[str, Any]:
    """What the compiled GEMM is: ``hlo_fp8_gemm`` (the HLO calls ``__cublas$lt$matmul$f8``),
    ``fp8_lowering`` (see :func:`fp8_lowering`) and the custom-call targets it names."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    return {"hlo_fp8_gemm": FP8_GEMM_TARGET in text, "fp8_lowering": fp8_lowering(text),
            "custom_calls": targets}
