"""GEMM micro-benchmarks: the physical ceiling every FP8/NVFP4 speed claim sits under.

``time_fn`` times an (already jitted) function: warm-up calls (compilation) first, then
``repeats`` timed calls, each ended by ``jax.block_until_ready``; median and interquartile
range. ``gemm_sweep`` times ``A[M,K] x B[N,K]^T`` (the TN layout cuBLASLt wants for FP8: both
operands contract their last axis) in five dtypes:

========  ============================================================================
fp32      float32 operands, ``Precision.HIGHEST`` (real FP32, not TF32)
tf32      float32 operands, ``Precision.DEFAULT`` (TF32 tensor cores on an NVIDIA GPU)
bf16      bfloat16 operands and output, FP32 accumulation
fp16      float16 operands and output, FP32 accumulation
fp8       E4M3 x E4M3 operands that are ALREADY FP8, straight into ``dot_general`` with
          ``preferred_element_type=bfloat16``; the two per-tensor scales multiply the output
========  ============================================================================

The fp8 form matters: with current JAX, XLA no longer rewrites "convert f8 -> bf16, multiply by
scale, dot" into an FP8 GEMM (it runs at BF16 speed), whereas f8 operands fed straight into
``dot_general`` lower to cuBLASLt's FP8 GEMM (``__cublas$lt$matmul$f8`` in the compiled HLO;
every record says whether it is there: ``extra.hlo_fp8_gemm``). For small GEMMs XLA prefers its
own Triton GEMM, which keeps the f8 operands (``extra.fp8_lowering == "fused-f8-dot"``): also
FP8 tensor-core math. On a GPU the sweep asserts one of the two; on a CPU the f8 product is
computed by upcasting, so fp8 records there carry ``emulated=True``.

Each record goes through :func:`repro.results.make_record` (experiment ``gemm``, claims A2, B2),
one resumable cell per shape (:func:`record_gemm`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro import formats
from repro.config import ConfigError

GEMM_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
CLAIMS = ("A2", "B2")
FP8_GEMM_TARGET = "__cublas$lt$matmul$f8"
# Contract the last axis of both operands, no batch axes: A[M,K] . B[N,K] -> C[M,N].
TN = (((1,), (1,)), ((), ()))
# The shape on which the accuracy of each dtype is measured against float64.
ERROR_SHAPE = (256, 256, 256)


# --------------------------------------------------------------------------------- timing


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


def quartiles(samples: np.ndarray) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of the samples."""
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return float(q1), float(med), float(q3)


# ---------------------------------------------------------------------------------- GEMMs


def _check_dtypes(dtypes: Sequence[str]) -> list[str]:
    bad = [d for d in dtypes if d not in GEMM_DTYPES]
    if bad:
        raise ConfigError(f"unknown GEMM recipe(s) {', '.join(map(str, bad))}; "
                          f"valid recipes: {', '.join(GEMM_DTYPES)}")
    return list(dtypes)


def _check_shapes(shapes) -> list[tuple[int, int, int]]:
    out = []
    for s in shapes:
        if (not isinstance(s, (list, tuple)) or len(s) != 3
                or not all(isinstance(v, int) and v > 0 for v in s)):
            raise ConfigError(f"GEMM shape {s!r} is not [M, K, N] of positive integers")
        out.append(tuple(int(v) for v in s))
    return out


def gemm_fn(dtype: str) -> Callable:
    """The un-jitted GEMM of one dtype. fp8 takes ``(a_q, b_q, a_scale, b_scale)``."""
    if dtype == "fp8":
        def fp8_gemm(a_q, b_q, a_scale, b_scale):
            c = jax.lax.dot_general(a_q, b_q, TN, preferred_element_type=jnp.bfloat16)
            return c * (a_scale * b_scale).astype(jnp.bfloat16)
        return fp8_gemm
    precision = {"fp32": jax.lax.Precision.HIGHEST}.get(dtype, jax.lax.Precision.DEFAULT)

    def gemm(a, b):
        return jax.lax.dot_general(a, b, TN, precision=precision)
    gemm.__name__ = f"{dtype}_gemm"
    return gemm


def gemm_operands(dtype: str, a: jax.Array, b: jax.Array) -> tuple:
    """Cast float32 operands for ``gemm_fn(dtype)``.

    fp8: per-tensor current scaling, ``scale = amax / 448`` (the dequantize multiplier), so the
    operands are E4M3 arrays and the scales float32 scalars.
    """
    if dtype in ("fp32", "tf32"):
        return a.astype(jnp.float32), b.astype(jnp.float32)
    if dtype in ("bf16", "fp16"):
        dt = jnp.bfloat16 if dtype == "bf16" else jnp.float16
        return a.astype(dt), b.astype(dt)
    if dtype == "fp8":
        fmax = formats.FP8_MAX[formats.E4M3]
        sa = formats.compute_scale(jnp.max(jnp.abs(a)), fmax)
        sb = formats.compute_scale(jnp.max(jnp.abs(b)), fmax)
        return (formats.fp8_quantize(a, formats.E4M3, sa),
                formats.fp8_quantize(b, formats.E4M3, sb), sa, sb)
    _check_dtypes([dtype])
    raise AssertionError("unreachable")


def dequantized_operands(dtype: str, ops: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The exact values the GEMM multiplies, as float64 (for a reference product)."""
    if dtype == "fp8":
        a_q, b_q, sa, sb = ops
        return (np.asarray(a_q, np.float64) * float(sa), np.asarray(b_q, np.float64) * float(sb))
    return np.asarray(ops[0], np.float64), np.asarray(ops[1], np.float64)


def _random_inputs(key, m: int, k: int, n: int) -> tuple[jax.Array, jax.Array]:
    ka, kb = jax.random.split(key)
    # Random normal, never zeros: a GEMM of zeros can be faster than real data on some chips.
    return (jax.random.normal(ka, (m, k), jnp.float32), jax.random.normal(kb, (n, k), jnp.float32))


def fp8_lowering(hlo_text: str) -> str:
    """How a compiled GEMM with f8 operands runs, read from its HLO.

    ``"cublaslt-f8"``: a call to cuBLASLt's FP8 GEMM. ``"fused-f8-dot"``: a ``dot`` whose two
    operands are f8 inside a fusion (XLA's Triton GEMM, which it prefers for small GEMMs: seen
    for 65536x256x256 and 2048x64x64 on an H200 with JAX 0.11.2): also FP8 tensor-core math.
    ``"upcast"``: the operands are converted to a wider type before the dot (CPU; or a GPU
    path that lost the FP8 GEMM). ``"no-f8"``: no f8 value anywhere (the other dtypes).
    """
    if "f8e" not in hlo_text:
        return "no-f8"
    if FP8_GEMM_TARGET in hlo_text:
        return "cublaslt-f8"
    for block in re.split(r"\n\s*\n", hlo_text):  # one computation per block
        types = dict(re.findall(r"%([\w.\-]+) = ([a-z0-9]+)\[", block))
        for a, b in re.findall(r" dot\(%([\w.\-]+), %([\w.\-]+)\)", block):
            if types.get(a, "").startswith("f8") and types.get(b, "").startswith("f8"):
                return "fused-f8-dot"
    return "upcast"


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


def recipe_emulated(recipe, lowering: str, hardware=None) -> bool:
    """Whether a timing of ``recipe`` measures emulation rather than its format.

    ``repro.ops.is_emulated`` (no tensor cores for the format on this hardware), and also an
    FP8 recipe whose compiled program on a GPU ran no FP8 GEMM at all (``lowering`` is neither
    cuBLASLt's FP8 call nor XLA's Triton GEMM with f8 operands, which small GEMMs get).
    """
    from repro import ops
    from repro.hardware import detect
    from repro.recipes import get_recipe

    r = get_recipe(recipe)
    hardware = hardware or detect()
    if ops.is_emulated(r, hardware):
        return True
    return r.gemm == "fp8" and lowering not in ("cublaslt-f8", "fused-f8-dot")


def compiled_gemm_info(fn: Callable, *args) -> dict[str, Any]:
    """What the compiled GEMM is: ``hlo_fp8_gemm`` (the HLO calls ``__cublas$lt$matmul$f8``),
    ``fp8_lowering`` (see :func:`fp8_lowering`) and the custom-call targets it names."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    return {"hlo_fp8_gemm": FP8_GEMM_TARGET in text, "fp8_lowering": fp8_lowering(text),
            "custom_calls": targets}


def relative_error(c: jax.Array, ref: np.ndarray) -> float:
    """Frobenius-norm relative error ``||c - ref|| / ||ref||``."""
    c = np.asarray(c, np.float64)
    return float(np.linalg.norm(c - ref) / np.linalg.norm(ref))


def _emulated(dtype: str, info: dict[str, Any], backend: str) -> bool:
    # An fp8 product that did not run as an FP8 GEMM was computed by upcasting the operands.
    return dtype == "fp8" and (backend != "gpu" or info["fp8_lowering"] == "upcast")


def gemm_sweep(shapes, dtypes=GEMM_DTYPES, repeats: int = 10, *, warmup: int = 2,
               input_sets: int = 2, seed: int = 0, profile: str | None = None,
               hardware=None) -> list[dict[str, Any]]:
    """Time ``A[M,K] x B[N,K]^T`` for every shape ``(M, K, N)`` and dtype.

    Returns records with metrics ``tflops`` (spread = IQR in TFLOP/s) and ``time_ms`` (spread =
    IQR in ms). ``input_sets`` independent random operand pairs are rotated through.
    """
    from repro import hardware as hw
    from repro.results import make_record

    shapes, dtypes = _check_shapes(shapes), _check_dtypes(dtypes)
    info = hardware or hw.detect()
    on_gpu = info.backend == "gpu"
    records = []
    key = jax.random.key(seed)
    for m, k, n in shapes:
        key, *keys = jax.random.split(key, max(input_sets, 1) + 1)
        inputs = [_random_inputs(kk, m, k, n) for kk in keys]
        flops = 2.0 * m * k * n
        for dtype in dtypes:
            fn = gemm_fn(dtype)
            sets = [gemm_operands(dtype, a, b) for a, b in inputs]
            lowering = compiled_gemm_info(fn, *sets[0])
            if dtype == "fp8" and on_gpu and info.has_fp8:
                # The FP8 GEMM must really be one: cuBLASLt's FP8 GEMM or a fused dot that
                # keeps f8 operands (Triton), never "upcast to bf16, then dot".
                assert lowering["fp8_lowering"] != "upcast", (
                    f"fp8 GEMM {m}x{k}x{n} did not lower to {FP8_GEMM_TARGET} nor to a fused "
                    f"f8 dot (custom calls: {lowering['custom_calls']}): it would run at BF16 "
                    "speed or slower")
            jitted = jax.jit(fn)
            t = time_fn(jitted, repeats=repeats, warmup=warmup, input_sets=sets)
            tflops = flops / np.asarray(t.samples) / 1e12
            q25, q75 = np.percentile(tflops, [25, 75])
            common = dict(claims=CLAIMS, recipe=dtype, sizes={"M": m, "K": k, "N": n},
                          repeats=repeats, emulated=_emulated(dtype, lowering, info.backend),
                          profile=profile, hardware=info)
            extra = {**lowering, "flops": flops, "layout": "TN", "input_sets": len(sets),
                     "warmup": warmup}
            records.append(make_record("gemm", "tflops", flops / t.median_s / 1e12, "TFLOP/s",
                                       spread=float(q75 - q25), extra=extra, **common))
            records.append(make_record("gemm", "time_ms", t.median_s * 1e3, "ms",
                                       spread=t.iqr_s * 1e3, extra=extra, **common))
            del sets
    return records


def gemm_error(dtypes=GEMM_DTYPES, shape=ERROR_SHAPE, *, seed: int = 0,
               profile: str | None = None, hardware=None) -> list[dict[str, Any]]:
    """Relative error of each dtype's GEMM against a float64 product (metric ``rel_error``).

    ``value``: against the float64 product of the original float32 operands (what a user loses
    by choosing the dtype: operand rounding plus accumulation and output rounding).
    ``extra.rel_error_same_operands``: against the float64 product of the operands exactly as
    rounded to the dtype (accumulation and output rounding only).
    """
    from repro import hardware as hw
    from repro.results import make_record

    dtypes = _check_dtypes(dtypes)
    (m, k, n), = _check_shapes([shape])
    info = hardware or hw.detect()
    a, b = _random_inputs(jax.random.key(seed + 1), m, k, n)
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
    records = []
    for dtype in dtypes:
        fn = gemm_fn(dtype)
        ops = gemm_operands(dtype, a, b)
        lowering = compiled_gemm_info(fn, *ops)
        c = jax.jit(fn)(*ops)
        da, db = dequantized_operands(dtype, ops)
        records.append(make_record(
            "gemm", "rel_error", relative_error(c, ref), "1", claims=CLAIMS, recipe=dtype,
            sizes={"M": m, "K": k, "N": n}, emulated=_emulated(dtype, lowering, info.backend),
            profile=profile, hardware=info,
            extra={"reference": "float64 product of the float32 inputs",
                   "rel_error_same_operands": relative_error(c, da @ db.T),
                   **lowering, "layout": "TN"}))
    return records


def shape_cell(shape, dtypes, all_dtypes=GEMM_DTYPES) -> str:
    m, k, n = shape
    cell = f"{m}x{k}x{n}"
    return cell if list(dtypes) == list(all_dtypes) else cell + "_" + "-".join(dtypes)


def record_gemm(profile: str, root: str | Path | None = None, force: bool = False,
                recipes: Sequence[str] | None = None) -> list[Path]:
    """Run the GEMM study of ``params.yaml`` (section ``gemm``) for ``profile``.

    One resumable cell per shape under ``root`` (default: ``record_root(profile)``); finished
    cells are skipped unless ``force``. ``recipes`` restricts the dtypes (a subset is recorded
    in its own cell, so it never masks the full sweep). Returns the paths written.
    """
    from tqdm import tqdm  # not tqdm.auto: that wants ipywidgets inside notebooks

    from repro import config
    from repro.results import have_cell, record_root, write_records

    p = config.stage_params("gemm", profile)
    profile = p["profile"]
    all_dtypes = _check_dtypes(p.get("dtypes", GEMM_DTYPES))
    dtypes = all_dtypes if recipes is None else _check_dtypes(recipes)
    shapes = _check_shapes(p.get("shapes", []))
    repeats = int(p.get("repeats", 10))
    input_sets = int(p.get("input_sets", 2))
    error_shape = p.get("error_shape", list(ERROR_SHAPE))
    _check_shapes([error_shape])
    root = Path(root) if root is not None else record_root(profile)

    cells = [(shape_cell(s, dtypes, all_dtypes), s) for s in shapes]
    cells.append(("rel_error_" + shape_cell(error_shape, dtypes, all_dtypes), None))
    written = []
    for cell, shape in tqdm(cells, desc=f"gemm [{profile}]", unit="cell"):
        if not force and have_cell("gemm", cell, root=root):
            continue
        if shape is None:
            recs = gemm_error(dtypes, error_shape, profile=profile)
        else:
            recs = gemm_sweep([shape], dtypes, repeats, input_sets=input_sets, profile=profile)
        written.append(write_records(recs, "gemm", cell, root=root))
    return written
