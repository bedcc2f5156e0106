"""GEMM micro-benchmarks: the physical ceiling every FP8/NVFP4 speed claim sits under.

``time_fn`` times an (already jitted) function: warm-up calls (compilation) first, then
``repeats`` timed calls, each ended by ``jax.block_until_ready``; median and interquartile
range. ``gemm_sweep`` times ``A[M,K] x B[N,K]^T`` (the TN layout cuBLASLt wants for FP8: both
operands contract their last axis) in six dtypes:

========  ============================================================================
fp32      float32 operands, ``Precision.HIGHEST`` (real FP32, not TF32)
tf32      float32 operands, ``Precision.DEFAULT`` (TF32 tensor cores on an NVIDIA GPU)
bf16      bfloat16 operands and output, FP32 accumulation
fp16      float16 operands and output, FP32 accumulation
fp8       E4M3 x E4M3 operands that are ALREADY FP8, straight into ``dot_general`` with
          ``preferred_element_type=bfloat16``; the two per-tensor scales multiply the output
int8      symmetric INT8 x INT8 operands (per-tensor scales ``amax / 127``, already INT8),
          ``preferred_element_type=int32`` (the ``s8 x s8 -> s32`` product of INT8 tensor
          cores and of a TPU's matrix units), the scales multiplied into the float32 result,
          written as bfloat16
========  ============================================================================

The fp8 form matters: with current JAX, XLA no longer rewrites "convert f8 -> bf16, multiply by
scale, dot" into an FP8 GEMM (it runs at BF16 speed), whereas f8 operands fed straight into
``dot_general`` lower to cuBLASLt's FP8 GEMM (``__cublas$lt$matmul$f8`` in the compiled HLO;
every record says whether it is there: ``extra.hlo_fp8_gemm``). For small GEMMs XLA prefers its
own Triton GEMM, which keeps the f8 operands (``extra.fp8_lowering == "fused-f8-dot"``): also
FP8 tensor-core math. On a GPU the sweep asserts one of the two; on a CPU the f8 product is
computed by upcasting, so fp8 records there carry ``emulated=True``. int8 records carry
``extra.int8_lowering`` (``repro.studies.lowering``): ``s8-gemm`` where the product ran
``s8 x s8 -> s32``; they are ``emulated`` on a device without INT8 matrix arithmetic (a CPU).

Each record goes through :func:`repro.results.make_record` (experiment ``gemm``, claims A2, B2),
one resumable cell per shape (:data:`STUDY`: ``repro record gemm``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro.config import ConfigError, Section, from_cli, positive
from repro.precision import formats
from repro.program import Program
from repro.studies import lowering as L
from repro.studies.runner import Cell, Study
from repro.studies.lowering import FP8_GEMM_TARGET, compiled_gemm_info
from repro.studies.timing import time_fn

GEMM_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")

CLAIMS = ("A2", "B2")


# Contract the last axis of both operands, no batch axes: A[M,K] . B[N,K] -> C[M,N].
TN = (((1,), (1,)), ((), ()))


# The shape on which the accuracy of each dtype is measured against float64.
ERROR_SHAPE = (256, 256, 256)


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
    """The un-jitted GEMM of one dtype. fp8 and int8 take ``(a_q, b_q, a_scale, b_scale)``."""
    if dtype == "int8":
        def int8_gemm(a_q, b_q, a_scale, b_scale):
            c = jax.lax.dot_general(a_q, b_q, TN, preferred_element_type=jnp.int32)
            return (c.astype(jnp.float32) * (a_scale * b_scale)).astype(jnp.bfloat16)
        return int8_gemm
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
    operands are E4M3 arrays and the scales float32 scalars. int8: the same with
    ``amax / 127`` and symmetric INT8 (``repro.precision.int8``).
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
    if dtype == "int8":
        from repro.precision import int8

        sa, sb = (int8.int8_scale(jnp.max(jnp.abs(x))) for x in (a, b))
        return int8.int8_quantize(a, sa), int8.int8_quantize(b, sb), sa, sb
    _check_dtypes([dtype])
    raise AssertionError("unreachable")


def dequantized_operands(dtype: str, ops: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The exact values the GEMM multiplies, as float64 (for a reference product)."""
    if dtype == "fp8":
        a_q, b_q, sa, sb = ops
        return (np.asarray(a_q, np.float64) * float(sa), np.asarray(b_q, np.float64) * float(sb))
    return np.asarray(ops[0], np.float64), np.asarray(ops[1], np.float64)


def int8_operands(ops: tuple) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dequantized_operands` of int8's ``(a_q, b_q, a_scale, b_scale)``: the INT8
    values times their scales, as float64."""
    a_q, b_q, sa, sb = ops
    return (np.asarray(a_q, np.float64) * float(sa), np.asarray(b_q, np.float64) * float(sb))


def _operands64(dtype: str, ops: tuple) -> tuple[np.ndarray, np.ndarray]:
    return int8_operands(ops) if dtype == "int8" else dequantized_operands(dtype, ops)


def _random_inputs(key, m: int, k: int, n: int) -> tuple[jax.Array, jax.Array]:
    ka, kb = jax.random.split(key)
    # Random normal, never zeros: a GEMM of zeros can be faster than real data on some chips.
    return (jax.random.normal(ka, (m, k), jnp.float32), jax.random.normal(kb, (n, k), jnp.float32))


def relative_error(c: jax.Array, ref: np.ndarray) -> float:
    """Frobenius-norm relative error ``||c - ref|| / ||ref||``."""
    c = np.asarray(c, np.float64)
    return float(np.linalg.norm(c - ref) / np.linalg.norm(ref))


def _emulated(dtype: str, info: dict[str, Any], hardware) -> bool:
    # An fp8 product that did not run as an FP8 GEMM was computed by upcasting the operands;
    # an int8 product is native only as s8 x s8 -> s32 on INT8 matrix units.
    if dtype == "int8":
        return L.recipe_emulated("int8", info["int8_lowering"], hardware)
    return dtype == "fp8" and (hardware.backend != "gpu" or info["fp8_lowering"] == "upcast")


def _gemm_info(dtype: str, fn, args) -> dict[str, Any]:
    """:func:`repro.studies.lowering.compiled_gemm_info`, and for int8 how its product ran
    (``int8_lowering``), read outside the measuring kit."""
    info = compiled_gemm_info(fn, *args)
    if dtype == "int8":
        info["int8_lowering"] = L.int8_lowering(jax.jit(fn).lower(*args).compile().as_text())
    return info


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
            lowering = _gemm_info(dtype, fn, sets[0])
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
                          repeats=repeats, emulated=_emulated(dtype, lowering, info),
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
        lowering = _gemm_info(dtype, fn, ops)
        c = jax.jit(fn)(*ops)
        da, db = _operands64(dtype, ops)
        records.append(make_record(
            "gemm", "rel_error", relative_error(c, ref), "1", claims=CLAIMS, recipe=dtype,
            sizes={"M": m, "K": k, "N": n}, emulated=_emulated(dtype, lowering, info),
            profile=profile, hardware=info,
            extra={"reference": "float64 product of the float32 inputs",
                   "rel_error_same_operands": relative_error(c, da @ db.T),
                   **lowering, "layout": "TN"}))
    return records


def program(dtype: str, m: int, k: int, n: int, error: bool = False, seed: int = 0) -> Program:
    """What a record of ``dtype`` measures. Throughput (``tflops``, ``time_ms``): the GEMM of
    :func:`gemm_fn` on the operands :func:`gemm_operands` casts from float32 ``A[M,K]``,
    ``B[N,K]`` (the cast makes the operands the timed GEMM reads; only the GEMM is timed), with
    the timing kit; ``m``, ``k``, ``n``: the shape. ``error`` (``rel_error``): the same cast and
    GEMM on the inputs
    :func:`gemm_error` draws (``seed``), and the error kit."""
    fn_of, cast = gemm_fn(dtype), gemm_operands
    if error:
        def gemm_of_inputs():
            a, b = _random_inputs(jax.random.key(seed + 1), m, k, n)
            return fn_of(*cast(dtype, a, b))

        kit = (relative_error, dequantized_operands, compiled_gemm_info)
        return Program(gemm_of_inputs, (), kit=kit + ((int8_operands,) if dtype == "int8" else ()))

    def gemm_of_operands(a, b):
        return fn_of(*cast(dtype, a, b))

    a = jax.ShapeDtypeStruct((m, k), jnp.float32)
    b = jax.ShapeDtypeStruct((n, k), jnp.float32)
    return Program(gemm_of_operands, (a, b),
                   kit=(time_fn, _random_inputs, compiled_gemm_info))


def program_settings(rec: dict) -> dict | None:
    """:func:`program`'s settings of a record: its dtype (``recipe``), shape, and whether it
    is the error cell's."""
    sizes = rec.get("sizes") or {}
    if rec.get("recipe") not in GEMM_DTYPES or not all(k in sizes for k in "MKN"):
        return None
    return {"dtype": rec["recipe"], "m": int(sizes["M"]), "k": int(sizes["K"]),
            "n": int(sizes["N"]), "error": rec.get("metric") == "rel_error"}


def shape_cell(shape, dtypes, all_dtypes=GEMM_DTYPES) -> str:
    m, k, n = shape
    cell = f"{m}x{k}x{n}"
    return cell if list(dtypes) == list(all_dtypes) else cell + "_" + "-".join(dtypes)


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``gemm`` section. ``selected``: ``--recipe``, a subset of ``dtypes``
    recorded in cells of its own (``<shape>_bf16-fp8``), so it never masks the full sweep."""

    dtypes: tuple[str, ...] = GEMM_DTYPES
    shapes: tuple[tuple[int, int, int], ...] = positive()
    repeats: int = positive(10)
    input_sets: int = positive(2)
    error_shape: tuple[int, int, int] = positive(ERROR_SHAPE)
    selected: tuple[str, ...] | None = from_cli()


def check(p: Params) -> None:
    _check_dtypes(p.dtypes)
    _check_dtypes(p.selected or ())
    _check_shapes([*p.shapes, p.error_shape])


def narrow(p: Params, recipes) -> Params:
    return replace(p, selected=tuple(_check_dtypes(recipes)))


def cells(p: Params) -> list[Cell]:
    """One cell per shape (every dtype timed in it), then the error cell."""
    dtypes = list(p.selected or p.dtypes)

    def sweep(shape):
        return lambda _budget: gemm_sweep([shape], dtypes, p.repeats, input_sets=p.input_sets,
                                          profile=p.profile)

    def programs(shape, error=False):
        return lambda: {d: program(d, *shape, error=error) for d in dtypes}

    out = [Cell(shape_cell(s, dtypes, p.dtypes), sweep(tuple(s)), tuple(dtypes),
                programs=programs(tuple(s))) for s in p.shapes]
    out.append(Cell("rel_error_" + shape_cell(p.error_shape, dtypes, p.dtypes),
                    lambda _budget: gemm_error(dtypes, p.error_shape, profile=p.profile),
                    tuple(dtypes), programs=programs(tuple(p.error_shape), error=True)))
    return out


STUDY = Study("gemm", CLAIMS, cells, check, about="GEMM throughput and error per dtype",
              params=Params, narrow=narrow)
