"""Argument checks of the precision API: what a function cannot compute correctly is refused
with a one-line ``ValueError`` (``TypeError`` for a wrong kind of object) naming the function,
the argument and the valid values, before anything is traced.

Checks run on what is known while tracing: shapes, dtypes and the recipe. A *value* can only be
checked where it is concrete: a scale passed as a Python number or a concrete array is checked
here, a scale computed inside ``jax.jit`` (a tracer) cannot raise; the quantizers then return
what the arithmetic gives (NaN or +-max for a zero scale, flipped signs for a negative one).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def operand(x, what: str, name: str = "x", min_ndim: int = 1):
    """``x`` as an array: floating, at least ``min_ndim`` axes, no axis of size zero."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        try:
            x = jnp.asarray(x)
        except TypeError:
            raise TypeError(f"{what}: {name} must be an array, got {type(x).__name__}") from None
        dt = x.dtype
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"{what}: {name} must be floating, got dtype {dt}")
    shape = jnp.shape(x)
    if len(shape) < min_ndim:
        raise ValueError(f"{what}: {name} needs at least {min_ndim} "
                         f"{'axis' if min_ndim == 1 else 'axes'}, got shape {shape}")
    if 0 in shape:
        raise ValueError(f"{what}: {name} is empty (shape {shape}); every axis needs size >= 1")
    return x


def scale(s, what: str, name: str = "scale") -> None:
    """A concrete dequantize scale must be a positive finite number (every element); a tracer
    passes (its value is unknown while tracing)."""
    if isinstance(s, jax.core.Tracer):
        return
    try:
        v = np.asarray(s, np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: {name} must be a positive finite number, got "
                        f"{type(s).__name__} {s!r}") from None
    if v.size == 0 or not np.all(np.isfinite(v) & (v > 0)):
        shown = v.item() if v.size == 1 else f"an array with {_bad(v)}"
        raise ValueError(f"{what}: {name} must be a positive finite number (the dequantize "
                         f"multiplier, x ~= q * {name}), got {shown}")


def _bad(v: np.ndarray) -> str:
    if v.size == 0:
        return "no elements"
    bad = v[~(np.isfinite(v) & (v > 0))]
    return f"{bad.size} of {v.size} elements not positive finite (e.g. {bad.flat[0]})"


def fp8_dtype(dtype, what: str):
    """An 8-bit float dtype (``float8_e4m3fn``, ``float8_e5m2``...)."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or not dt.name.startswith("float8"):
        raise ValueError(f"{what}: dtype must be an FP8 dtype (jnp.float8_e4m3fn, "
                         f"jnp.float8_e5m2), got {dtype!r}")
    return dt


def key(k, what: str, name: str = "key") -> None:
    """A PRNG key: a typed key (``jax.random.key``) or raw key data (``jax.random.PRNGKey``,
    uint32 with a trailing axis of 2 or 4)."""
    dt = getattr(k, "dtype", None)
    if dt is not None and jnp.issubdtype(dt, jax.dtypes.prng_key):
        return
    shape = getattr(k, "shape", None)
    if dt == jnp.uint32 and shape and shape[-1] in (2, 4):
        return
    got = f"dtype {dt}, shape {shape}" if dt is not None else type(k).__name__
    raise TypeError(f"{what}: {name} must be a PRNG key (jax.random.key(seed)), got {got}")


def recipe_for(recipe, gemms: Sequence[str], what: str):
    """``recipe`` (a ``Recipe``: names are resolved where a model is configured), which must
    run on this repository's ops with one of ``gemms`` (a peer library's recipe, or a recipe
    of another format, would compute something else)."""
    from repro.precision.recipes import REGISTRY, Recipe

    if not isinstance(recipe, Recipe):
        raise TypeError(f"{what}: recipe must be a Recipe (resolve the name {recipe!r} "
                        f"first), got {type(recipe).__name__}")
    r = recipe
    if r.backend != "repro":
        raise ValueError(f"{what}: recipe {r.name!r} runs on the {r.backend!r} backend "
                         "(repro.precision.peers); build its layer with "
                         "repro.precision.layers.dense")
    if r.gemm not in gemms:
        fits = [n for n, e in REGISTRY.items() if e.backend == "repro" and e.gemm in gemms]
        raise ValueError(f"{what}: recipe {r.name!r} has gemm={r.gemm!r}, not "
                         f"{' or '.join(map(repr, gemms))}; valid recipes: {', '.join(fits)} "
                         "(repro.precision.ops.dot runs any recipe)")
    return r


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def axis(a, ndim: int, what: str, name: str = "axis") -> int:
    """An axis of an array of rank ``ndim``, in ``[-ndim, ndim)``; returned in ``[0, ndim)``.
    (Python arithmetic only: nothing is traced.)"""
    if not _is_int(a):
        raise TypeError(f"{what}: {name} must be an int, got {type(a).__name__} {a!r}")
    if not -ndim <= a < ndim:
        raise ValueError(f"{what}: {name}={int(a)} is out of range for an input of rank {ndim} "
                         f"(valid: {-ndim} to {ndim - 1})")
    return int(a) % ndim


def positive_int(v, what: str, name: str, hint: str = "") -> int:
    """``v`` as a Python int >= 1 (a float, a bool or a string is refused, not truncated)."""
    if not _is_int(v) or v < 1:
        raise ValueError(f"{what}: {name} must be a positive int{hint}, got {v!r}")
    return int(v)


def float_dtype(dtype, what: str, name: str = "dtype", max_bits: int = 32):
    """A floating dtype of at most ``max_bits`` bits. Wider ones are refused: the arithmetic
    here is float32 (and without ``jax_enable_x64`` a float64 array is silently float32)."""
    try:
        dt = jnp.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is None or not jnp.issubdtype(dt, jnp.floating) or dt.itemsize * 8 > max_bits:
        kinds = "an 8-bit or 4-bit float format (jnp.float8_e4m3fn, jnp.float8_e5m2, " \
                "jnp.float4_e2m1fn)" if max_bits == 8 else \
                f"a float dtype of at most {max_bits} bits (float32, bfloat16, float16, FP8, FP4)"
        raise ValueError(f"{what}: {name} must be {kinds}, got {_shown(dtype)}")
    return dt


def _shown(dtype) -> str:
    try:
        return jnp.dtype(dtype).name
    except (TypeError, ValueError):
        return repr(dtype)


def out_dtype(dtype, what: str, name: str = "dtype"):
    """The dtype of a dequantized result: floating; float64 only with ``jax_enable_x64`` (else
    JAX would silently return float32)."""
    try:
        dt = jnp.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is None or not jnp.issubdtype(dt, jnp.floating) or (
            dt.itemsize > 4 and not jax.config.jax_enable_x64):
        raise ValueError(f"{what}: {name} must be a float dtype (float32, bfloat16, float16; "
                         f"float64 only with jax_enable_x64), got {_shown(dtype)}")
    return dt


def int_value(v, what: str, name: str) -> None:
    """A concrete integer (a Python or NumPy int, or an integer array); a tracer passes."""
    if isinstance(v, jax.core.Tracer):
        return
    dt = getattr(v, "dtype", None)
    if _is_int(v) or (dt is not None and jnp.issubdtype(dt, jnp.integer)):
        return
    raise TypeError(f"{what}: {name} must be an int, got {type(v).__name__} {v!r}")
