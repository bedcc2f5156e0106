"""Probe: how INT8 weights are widened to FP32 in the one-row weight-only products.

An INT8 GEMV streams one byte per weight and widens each one before its multiply, so the
widening's instruction rate can bound it. This times, for each way of widening exact for all
256 values, ``repro.precision.dequant_gemm``'s two one-row forms on weights stored ``[N, K]``
(``dot_reduce``, XLA's fused reduction, and the Pallas GEMV ``dot_gemv`` at a few tilings),
beside BF16's ``x @ W``, at d_model 8192's block GEMMs:

    i2f   q.astype(float32): the int-to-float convert (dequant_gemm.widen's "convert")
    sext  bitcast_f32(int32(q) + 0x4B400000) - 1.5 * 2**23 (its "magic")
    xor   bitcast_f32(uint32(uint8(q) ^ 0x80) | 0x4B000000) - (2**23 + 128)
    f16   the same with FP16's bits (0x6400, 1024 + 128), then FP16 -> FP32
    prmt  xor's arithmetic in inline PTX, four bytes per instance: one XOR of the packed
          word, then per byte one PRMT (the byte under 0x4B0000) and one FP32 subtract, as
          FasterTransformer's CUDA does (its "prmt": PTX in the GEMV on a GPU, the
          integer form elsewhere)

Each variant replaces ``dequant_gemm.widen`` while it is traced. One line per case: ms per
GEMM, BF16's time over it, the relative error against the FP32 product; then, per variant,
the fastest form per weight and the per-layer ratio they give.

    python3 scripts/probe_int8_widen.py           # GPU, about 1 minute
    python3 scripts/probe_int8_widen.py --cpu     # tiny shapes, Pallas in interpret mode
    python3 scripts/probe_int8_widen.py --widen sext,prmt   # only these widenings

``scripts/probe_dequant_gemm.py --gemv-sweep`` sweeps the GEMV's tilings with each widening.

Numbers from a probe are not records.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU")
ap.add_argument("--widen", default=None, help="only these widenings (comma-separated)")
ARGS = ap.parse_args()
if ARGS.cpu:
    os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from repro.precision import dequant_gemm as D  # noqa: E402
from repro.studies import timing  # noqa: E402


def _from_bits(q, base, bias, bits_type, float_type):
    u = lax.bitcast_convert_type(q, jnp.uint8) ^ jnp.uint8(0x80)
    f = lax.bitcast_convert_type(u.astype(bits_type) | bits_type(base), float_type)
    return (f - float_type(bias)).astype(jnp.float32)


WIDEN_LIB = D.widen
WIDEN = {  # (q, asm) -> FP32
    "i2f": lambda q, asm: WIDEN_LIB(q, "convert"),
    "sext": lambda q, asm: WIDEN_LIB(q, "magic"),
    "xor": lambda q, asm: _from_bits(q, 0x4B000000, 2.0 ** 23 + 128, jnp.uint32, jnp.float32),
    "f16": lambda q, asm: _from_bits(q, 0x6400, 1024 + 128, jnp.uint16, jnp.float16),
    "prmt": lambda q, asm: WIDEN_LIB(q, "prmt", asm),
}
SHAPES = [(8192, 24576), (8192, 8192), (8192, 57344), (28672, 8192)]
TILES = [(32, 256, 8, 2), (16, 256, 4, 1), (8, 256, 8, 1)]  # block_n, block_k, warps, splits


def timed_loop(f, n_copies, iters, n):
    """Jitted: ``f`` on each of the weight copies in turn, a fresh row of x each time."""
    def run(xs, ws, s):
        def body(i, ys):
            return tuple(f(lax.dynamic_index_in_dim(xs, i * n_copies + c, 0, False), w, s)
                         for c, w in enumerate(ws))
        return lax.fori_loop(0, iters, body, tuple(jnp.zeros((1, n), jnp.bfloat16) for _ in ws))
    return jax.jit(run)


def main():
    cpu = jax.default_backend() != "gpu"
    shapes = [(256, 64), (512, 32)] if cpu else SHAPES
    tiles = [(16, 64, 4, 2)] if cpu else TILES
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    best: dict = {}
    for k, n in shapes:
        n_copies = 2 if cpu else max(2, -(-(160 << 20) // (k * n)))
        iters = 2 if cpu else max(1, 200 // n_copies)
        xs = jax.random.normal(jax.random.key(1), (iters * n_copies, 1, k), jnp.bfloat16)
        w = jax.random.normal(jax.random.key(2), (n, k), jnp.float32)
        qs = [jnp.roll(jnp.clip(jnp.round(w * 40), -128, 127), c, 0).astype(jnp.int8)
              for c in range(n_copies)]
        wb = [jnp.asarray((w * 0.02 + c).astype(jnp.bfloat16).T) for c in range(n_copies)]
        s = jnp.full((n,), 0.01, jnp.bfloat16)
        want = jnp.dot(xs[0].astype(jnp.float32), qs[0].astype(jnp.float32).T) * 0.01
        cases = [("bf16", "bf16", lambda x, v, s: jnp.dot(x, v), wb)]
        for name in (ARGS.widen.split(",") if ARGS.widen else WIDEN):
            if name != "prmt":  # inline PTX: inside the Pallas kernel on a GPU only
                cases.append((name, "reduce", functools.partial(D.dot_reduce,
                                                                transposed=True), qs))
            for bn, bk, nw, sp in tiles:
                cases.append((name, f"gemv-{bn}x{bk}x{nw}x{sp}", functools.partial(
                    D.dot_gemv, block_n=bn, block_k=bk, num_warps=nw, splits=sp,
                    interpret=cpu), qs))
        base = None
        for name, form, f, ws in cases:
            D.widen = functools.partial(lambda q, how="convert", asm=False, f=None: f(q, asm),
                                        f=WIDEN.get(name, WIDEN["i2f"]))
            jax.clear_caches()  # dot_gemv is jitted: trace it again with this widening
            try:
                prog = timed_loop(f, n_copies, iters, n).lower(xs, ws, s).compile()
                err = 0.0 if name == "bf16" else float(
                    jnp.max(jnp.abs(jax.jit(f)(xs[0], ws[0], s).astype(jnp.float32) - want))
                    / jnp.max(jnp.abs(want)))
                sec = timing.time_fn(prog, xs, ws, s, repeats=3, warmup=1).median_s
            except Exception as e:  # noqa: BLE001 - a failing case ends only its line
                print(f"{k}x{n} {name:>5} {form:>18}  FAILED {type(e).__name__}: "
                      f"{str(e).strip().splitlines()[0][:150] if str(e).strip() else ''}")
                continue
            ms = 1e3 * sec / (iters * n_copies)
            base = ms if name == "bf16" else base
            print(f"{k}x{n} {name:>5} {form:>18} {ms:9.4f} ms {base / ms:6.2f}x  err {err:.1e}",
                  flush=True)
            if name != "bf16":
                old = best.get((name, k, n))
                if old is None or ms < old[0]:
                    best[(name, k, n)] = (ms, form, base)
    D.widen = WIDEN_LIB
    for name in WIDEN:
        mine = [v for key, v in best.items() if key[0] == name]
        if mine and len(mine) == len(shapes):
            ratio = sum(b for _, _, b in mine) / sum(m for m, _, _ in mine)
            print(f"# {name}: per layer {ratio:.2f}x with " + ", ".join(f for _, f, _ in mine))


if __name__ == "__main__":
    main()
