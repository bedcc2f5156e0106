"""Check, on the machine at hand, that every rounding this repository relies on happens.

XLA's GPU compiler folds chains of float converts (``x.astype(bf16).astype(f32)`` -> ``x``;
``SimplifyFPConversions`` under ``xla_allow_excess_precision``, on by default), so a rounding
written as a cast round trip can vanish on the GPU while CPU tests pass. ``repro.precision.formats.cast``
rounds with ``lax.reduce_precision`` instead. This module runs each rounding jitted on the
default device and compares the bits with numpy/ml_dtypes on the host:

    repro check        # exit 1 if a rounding this repository uses is skipped

``repro record ... --profile full`` (:func:`require`) and ``scripts/gpu_record.sh`` run it
before recording anything. The first row, the plain round
trip, is informational: it shows whether this compiler folds (expected on the GPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax

from repro.precision import formats as F
from repro.precision import optim


def _sample(n: int = 4096, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp(rng.uniform(-12, 6, n))).astype(np.float32)


def storage_updates(storage: str, kahan: bool, steps: int = 20, lr: float = 2.5e-4):
    """``p -> p["w"]`` after ``steps`` updates with a constant gradient of ``storage``-stored
    weights (Kahan-compensated or naive): the mechanism of claim A7."""
    tx = optim.make_optimizer({"lr": lr, "master_weights": storage, "kahan": kahan})

    def run(p):
        s = tx.init(p)
        for _ in range(steps):
            u, s = tx.update({"w": jnp.ones_like(p["w"])}, s, p)
            p = optax.apply_updates(p, u)
        return p["w"]

    return run


def _kahan_differs() -> bool:
    """Kahan vs naive BF16-stored update, jitted on the device."""
    p0 = {"w": jnp.full((64,), 0.1, jnp.bfloat16)}
    k, n = (np.asarray(jax.jit(storage_updates("bf16", kahan))(p0), np.float32)
            for kahan in (True, False))
    return not np.array_equal(k, n)


def checks() -> list[dict]:
    """One row per check: name, ok, required (False: informational)."""
    x = _sample()
    rows = []
    folded = np.array_equal(
        np.asarray(jax.jit(lambda v: v.astype(jnp.bfloat16).astype(jnp.float32))(x)), x)
    rows.append({"check": "plain astype round trip rounds (False: this compiler folds it)",
                 "ok": not folded, "required": False})
    for dt in (jnp.bfloat16, jnp.float16, F.E4M3, F.E5M2, F.E2M1):
        fmax = float(ml_dtypes.finfo(dt).max)
        xc = np.clip(x, -fmax, fmax)
        ref = xc.astype(dt).astype(np.float32)
        got = np.asarray(jax.jit(lambda v, d=dt: F.cast(v, d).astype(jnp.float32))(xc))
        rows.append({"check": f"formats.cast to {jnp.dtype(dt).name} matches ml_dtypes",
                     "ok": bool(np.array_equal(got, ref)), "required": True})
    xm = x.reshape(64, 64)
    for fmt, kw in (("e4m3", {}), ("mxfp8", {}), ("nvfp4", {"block": (16, 16)})):
        y = np.asarray(jax.jit(lambda v: F.fake_quantize(v, fmt, **kw))(xm))
        rows.append({"check": f"fake_quantize {fmt} changes the values",
                     "ok": not np.array_equal(y, xm), "required": True})
    rows.append({"check": "Kahan and naive BF16-stored updates differ",
                 "ok": _kahan_differs(), "required": True})
    rows += _native_cast_rows()
    rows += _gemv_widen_rows()
    rows += _int8_rows()
    rows += _fp32_rows()
    return rows


FP32_TOLERANCE = 1e-5  # an FP32 GEMM's error against float64 (TF32 and BF16 passes: ~1e-3)


def _gemm_error(fn) -> float:
    """Relative Frobenius error of ``fn(a, b)`` (FP32 operands, jitted on the device) against
    the float64 product, on random 256x512 @ 512x256 operands."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    got = np.asarray(jax.jit(fn)(a, b), np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def _fp32_rows() -> list[dict]:
    """An FP32 baseline must be FP32 here: a GEMM at ``Precision.HIGHEST`` and the ``fp32``
    recipe's dense layer within :data:`FP32_TOLERANCE` of float64 (a TPU computes FP32 dots at
    JAX's default precision in bfloat16, a Hopper GPU in TF32: shown, not required)."""
    from repro.precision import layers

    highest = _gemm_error(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST))
    default = _gemm_error(lambda a, b: jnp.dot(a, b))
    layer = layers.dense(256, "fp32", use_bias=False)
    params = layer.init(jax.random.PRNGKey(0), jnp.zeros((1, 512), jnp.float32))

    def fp32_layer(a, b):  # the recipe's own layer with b as its kernel
        p = jax.tree_util.tree_map(lambda _: b, params)
        return layer.apply(p, a)

    recipe = _gemm_error(fp32_layer)
    return [{"check": f"an FP32 GEMM at Precision.HIGHEST is FP32 (error {highest:.1e} vs "
                      f"float64)", "ok": highest < FP32_TOLERANCE, "required": True},
            {"check": f"the fp32 recipe's dense layer is FP32 (error {recipe:.1e} vs float64)",
             "ok": recipe < FP32_TOLERANCE, "required": True},
            {"check": f"an FP32 GEMM at JAX's default precision is FP32 (error {default:.1e}; "
                      "False: this device rounds its operands)",
             "ok": default < FP32_TOLERANCE, "required": False}]


def _int8_rows() -> list[dict]:
    """INT8 training's quantizer (``repro.precision.int8.int8_quantize``) against numpy on
    every bfloat16 value at several scales (ties to even, saturation, NaN to 0), and an
    ``s8 x s8 -> s32`` product against numpy's exact integer product."""
    from repro.precision import int8

    xb = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)
    x = xb.astype(np.float32)
    ok = True
    for s in (1.0, 2.0 ** -7, 3.7e-3, 1e3):
        inv = np.float32(1) / np.float32(s)
        with np.errstate(all="ignore"):
            y = (x.astype(np.float64) * np.float64(inv)).astype(np.float32)
        ref = np.rint(np.clip(np.where(np.isnan(y), 0, y), -127, 127)).astype(np.int8)
        got = np.asarray(jax.jit(lambda v, s=s: int8.int8_quantize(v, s))(xb))
        ok &= bool(np.array_equal(got, ref))
    rng = np.random.default_rng(0)
    a = rng.integers(-127, 128, (256, 512), dtype=np.int8)
    b = rng.integers(-127, 128, (512, 128), dtype=np.int8)
    prod = np.asarray(jax.jit(lambda u, v: jax.lax.dot_general(
        u, v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32))(a, b))
    exact = a.astype(np.int64) @ b.astype(np.int64)
    return [{"check": "int8.int8_quantize matches numpy on every bfloat16 value", "ok": ok,
             "required": True},
            {"check": "an s8 x s8 -> s32 product is exact", "required": True,
             "ok": bool(prod.dtype == np.int32 and np.array_equal(prod, exact))}]


def _gemv_widen_rows() -> list[dict]:
    """The weight-only GEMV (``dequant_gemm.dot_gemv``; on a GPU its Triton kernel, with
    "prmt" its inline PTX) against numpy, every INT8 value at each of the four byte lanes
    of a 32-bit word: row ``r`` of ``x`` is one-hot at ``k = r``, so ``y[r, n] = q[n, r]``."""
    from repro.precision import dequant_gemm as D

    v = np.arange(-128, 128, dtype=np.int8)
    q = v[(np.arange(256)[:, None] + np.arange(256)[None, :]) % 256]  # q[n, k]
    x = np.eye(4, 256, dtype=np.float32).astype(ml_dtypes.bfloat16)
    want = q[:, :4].T.astype(np.float32)
    interpret = jax.default_backend() != "gpu"
    rows = []
    for how in D.WIDENINGS:
        got = np.asarray(D.dot_gemv(jnp.asarray(x), jnp.asarray(q), jnp.ones((256,), jnp.bfloat16),
                                    block_n=16, block_k=256, widen=how, interpret=interpret))
        rows.append({"check": f"dequant_gemm.dot_gemv widens every int8 exactly ({how})",
                     "ok": bool(np.array_equal(got.astype(np.float32), want)), "required": True})
    return rows


def _native_cast_rows() -> list[dict]:
    """``formats.fp8_cast`` (the hardware's convert, used for GEMM operands) against the
    host's ml_dtypes cast, on every bfloat16 value at several scales."""
    xb = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)
    keep = ~np.isnan(xb.astype(np.float32))
    rows = []
    for dt in (F.E4M3, F.E5M2):
        fmax = float(ml_dtypes.finfo(dt).max)
        ok = True
        for s in (1.0, 2.0 ** -7, 3.7e-3, 1e3):
            with np.errstate(all="ignore"):
                ref = np.clip(xb.astype(np.float32) * (np.float32(1) / np.float32(s)),
                              -fmax, fmax).astype(dt).view(np.uint8)
            got = np.asarray(jax.jit(lambda v, s=s, d=dt: F.fp8_cast(v, d, s))(xb)).view(np.uint8)
            ok &= bool(np.array_equal(got[keep], ref[keep]))
        rows.append({"check": f"formats.fp8_cast to {jnp.dtype(dt).name} matches ml_dtypes on "
                              "every bfloat16", "ok": ok, "required": True})
    return rows


class NumericsError(ValueError):
    """A rounding the experiments rely on does not happen on this device (one line)."""


def require() -> None:
    """Raise :class:`NumericsError` unless every required check passes here (``repro record
    --profile full`` calls this before recording anything)."""
    bad = [r["check"] for r in checks() if r["required"] and not r["ok"]]
    if bad:
        dev = jax.devices()[0]
        raise NumericsError(f"numerics check failed on {dev.platform}:{dev.device_kind}: "
                            f"{'; '.join(bad)}; nothing recorded (repro check)")
