"""Probe: the weight-only GEMM y = (x @ q) * scale on this device, beside BF16 x @ W.

For each weight shape [K, N] (the wide inference config's block GEMMs: d_model 4096, d_ff 11008)
and each number of rows of x (decode batches 1, 8, 64), times

    bf16          x @ W, W in BF16 (the baseline)
    fp8-w-xla     dequant_gemm.dot_xla: dot(x, convert(q)) * scale, q E4M3 (XLA fuses or not)
    fp8-w-reduce  dequant_gemm.dot_reduce: multiply and sum over K, no GEMM (a few rows)
    fp8-w-pallas  dequant_gemm.dot_pallas: the Pallas kernel
    fp8-w-splitk  dequant_gemm.dot_pallas with 128-column blocks and the contraction split
                  over programs (split-K, about two waves of programs on the GPU)
    fp8-w-qwix    qwix's order: dequantize q * scale to BF16, then the dot (qwix.dot_general
                  on a QArray where qwix is installed, else the same operations written out)
    int8-w-*      the same with INT8 weights
    *-t           the same with the weight stored transposed, q[N, K] (contraction axis minor)
    fp8-tensor    the fp8-tensor format's product (export.fp8_tensor_dot: E4M3 x E4M3, one
                  scale per tensor), weight stored [K, N]; fp8-tensor-t: stored [N, K]
                  (cuBLASLt's TN layout); where qwix is installed
    *-gemv-t      dequant_gemm.dot_gemv: a Pallas (Triton) GEMV without tensor cores on the
                  transposed weight: contiguous 1-byte loads of block_k, FP32 products
                  accumulated per lane, one sum at the end; --gemv-sweep times other
                  blocks, warps and contraction splits (for INT8 with each of
                  dequant_gemm.widen's integer widenings), and --write-tiles FILE writes the
                  fastest per weight (or none where reduce-t is faster) in the form of
                  dequant_gemm.GEMV_TILES
    *-mgpu-t      JAX's own Mosaic GPU mixed-type matmul for Hopper
                  (``jax.experimental.pallas.ops.gpu.hopper_mixed_type_matmul_mgpu``: TMA
                  loads of the 1-byte weight, a warp-specialized pipeline, the weight widened
                  to BF16 in registers, WGMMA) on y^T = q^T x^T, the batch padded to 16
                  columns (split-K as extra column blocks, see ``mgpu_dot``), the scales
                  applied to its [N, 16] output; GPU only. Its dtype gate
                  admits int8 x bf16; E4M3 runs the same kernel with the gate removed, as
                  E4M3 x FP16 (Hopper widens E4M3 to FP16, not to BF16).
                  --mgpu-sweep also times other tilings

and prints one line per case: milliseconds per GEMM, the ratio of BF16's time to it (> 1:
faster than BF16; the median of 3 timed calls), the relative error against the FP32 product
of x and the dequantized weight (WRONG above 2e-2; 1e-1 for fp8-tensor's E4M3 activations),
and where the optimized HLO widens the weight, as the inference study's records say it
(``repro.studies.lowering.dequant_lowering_gpu``): "fused" (the GEMM's kernel loads the
1-byte weight), "pallas" (the Pallas kernel does), "separate" (another kernel widens it
first), "none" (no narrow array: BF16).

Each timing runs the GEMM many times in one jitted loop over several copies of the weights
(more bytes than the L2 cache, as in a model whose layers are read one after the other) and
a fresh x each time (nothing loop-invariant to hoist), so launch overhead and caching stay out.
The run stops starting new cases after --budget seconds.

    python3 scripts/probe_dequant_gemm.py                 # GPU, < 2 minutes
    python3 scripts/probe_dequant_gemm.py --cpu           # tiny shapes on the CPU (debugging)
    python3 scripts/probe_dequant_gemm.py --sweep         # also Pallas tile sizes at 1 row
    python3 scripts/probe_dequant_gemm.py --batches 1 --variants int8-w-mgpu-t,fp8-w-mgpu-t,\
        int8-w-reduce-t,fp8-w-reduce-t --mgpu-sweep             # the Mosaic GPU kernel
    python3 scripts/probe_dequant_gemm.py --no-cublas-fallback   # also XLA with
                                          # xla_gpu_cublas_fallback=false (Triton GEMMs only)
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

WIDE = [(4096, 12288, "qkv"), (4096, 4096, "attn out"), (4096, 22016, "mlp wi"),
        (11008, 4096, "mlp wo")]
TINY = [(64, 192, "qkv"), (64, 64, "attn out"), (64, 384, "mlp wi"), (192, 64, "mlp wo")]


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--batches", default="1,8,64", help="rows of x, comma-separated")
    ap.add_argument("--shapes", default=None,
                    help="K:N pairs, comma-separated (default: the wide config's GEMMs)")
    ap.add_argument("--budget", type=float, default=100.0,
                    help="seconds after which no new case starts")
    ap.add_argument("--sweep", action="store_true",
                    help="also the Pallas kernel with other tile sizes at the first batch")
    ap.add_argument("--no-cublas-fallback", action="store_true",
                    help="also the XLA form compiled with xla_gpu_cublas_fallback=false")
    ap.add_argument("--mgpu-sweep", action="store_true",
                    help="also the Mosaic GPU kernel with other tilings (tile_m x tile_k, "
                         "pipeline stages)")
    ap.add_argument("--gemv-sweep", action="store_true",
                    help="also the Pallas GEMV (gemv-t) with other blocks and warps")
    ap.add_argument("--write-tiles", default=None, metavar="FILE",
                    help="with --gemv-sweep: write the fastest GEMV tiling per weight and "
                         "type at the first batch (JSON, dequant_gemm.GEMV_TILES' form)")
    ap.add_argument("--variants", default=None, help="only these variants (comma-separated)")
    return ap.parse_args()


ARGS = parse()
if ARGS.cpu:
    os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax
import jax.numpy as jnp
from jax import lax

from repro.precision import dequant_gemm as D
from repro.studies import timing
from repro.studies.lowering import dequant_lowering_gpu as dequant_lowering

try:
    import qwix
except ImportError:
    qwix = None

def variants(qtypes):
    out = {"bf16": ("bf16", None, None)}
    for name, qt in qtypes:
        out[f"{name}-xla"] = ("xla", qt, None)
        out[f"{name}-xla-t"] = ("xla-t", qt, None)
        out[f"{name}-reduce"] = ("reduce", qt, None)
        out[f"{name}-reduce-t"] = ("reduce-t", qt, None)
        out[f"{name}-pallas"] = ("pallas", qt, None)
        out[f"{name}-splitk"] = ("splitk", qt, None)
        out[f"{name}-qwix"] = ("qwix", qt, None)
        out[f"{name}-mgpu-t"] = ("mgpu-t", qt, None)
        out[f"{name}-gemv-t"] = ("gemv-t", qt, None)
        if ARGS.no_cublas_fallback and not ARGS.cpu:
            out[f"{name}-xla-nofb"] = ("xla", qt, {"xla_gpu_cublas_fallback": False})
    if qwix is not None:
        out["fp8-tensor"] = ("tensor", jnp.float8_e4m3fn, None)
        out["fp8-tensor-t"] = ("tensor-t", jnp.float8_e4m3fn, None)
    if ARGS.variants:
        keep = ARGS.variants.split(",")
        out = {k: v for k, v in out.items() if k in keep or k == "bf16"}
    return out


def gemm_fn(kind: str, interpret: bool, **blocks):
    if kind == "bf16":
        return lambda x, w, s: lax.dot_general(x, w, (((1,), (0,)), ((), ())))
    if kind == "xla":
        return D.dot_xla
    if kind == "reduce":
        return D.dot_reduce
    if kind in ("xla-t", "reduce-t"):
        f = D.dot_xla if kind == "xla-t" else D.dot_reduce
        return lambda x, q, s: f(x, q, s, transposed=True)
    if kind in ("tensor", "tensor-t"):  # the exported fp8-tensor format's own product
        from repro.precision import export as X

        cls = X._transposed_class() if kind == "tensor-t" else qwix.QArray
        one = jnp.ones((1, 1), jnp.bfloat16)  # the weight's scale: its values are the q's
        return lambda x, q, s: X.fp8_tensor_dot(x, cls(q, one, None, q.dtype),
                                                (((1,), (0,)), ((), ())))
    if kind == "pallas":
        return lambda x, q, s: D.dot_pallas(x, q, s, interpret=interpret, **blocks)
    if kind == "gemv-t":
        cfg = {**GEMV_DEFAULT, **blocks}
        return lambda x, qt, s: D.dot_gemv(x, qt, s, interpret=interpret, **cfg)
    if kind == "mgpu-t":
        cfg = {**MGPU_DEFAULT, **blocks}
        return lambda x, qt, s: mgpu_dot(x, qt, s, **cfg)
    if kind == "splitk":
        def f(x, q, s):
            k, n = q.shape
            return D.dot_pallas(x, q, s, interpret=interpret, block_n=128, block_k=256,
                                splits=split_k(k, n, 128))
        return f
    if qwix is not None:
        return lambda x, q, s: qwix.dot_general(x, qwix.QArray(q, s.reshape(1, -1)),
                                                (((1,), (0,)), ((), ())))
    return D.reference


MGPU_PAD = 16  # the kernel's narrowest N tile (a 32-byte swizzle of BF16 columns)
# splits 0: mgpu_splits picks them
MGPU_DEFAULT = {"tile_m": 64, "tile_k": 128, "stages": 4, "splits": 0}


@functools.cache
def _mgpu_module():
    """JAX's Hopper mixed-type matmul module and a copy of its kernel function without the
    dtype gate (it admits int8 x bf16 only, "unbenchmarked" otherwise)."""
    import inspect
    import textwrap

    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as H

    src = textwrap.dedent(inspect.getsource(H.mixed_matmul_kernel))
    start, end = src.index("  match (a.dtype, b.dtype):"), src.index("  m, k = a.shape")
    ns = dict(vars(H))
    exec(src[:start] + src[end:], ns)  # noqa: S102 - the installed JAX's own source
    return H, ns["mixed_matmul_kernel"]


def mgpu_splits(n: int, k: int, tile_m: int, tile_k: int) -> int:
    """The fewest contraction splits S (1, 2, 4, 8) with n * S / (2 tile_m) row tiles (the
    kernel's CTAs) filling the device's SMs and K / S a multiple of tile_k (else the most
    that divide)."""
    sms = getattr(jax.devices()[0], "core_count", 1)
    ok = [s for s in (1, 2, 4, 8) if k % (s * tile_k) == 0]
    return next((s for s in ok if n * s // (2 * tile_m) >= sms), ok[-1] if ok else 1)


def mgpu_dot(x, qt, s, tile_m: int, tile_k: int, stages: int, splits: int = 0):
    """y [B, N] = (x [B, K] @ dequant(qt [N, K])) * s [N] through the Mosaic GPU kernel.

    Split-K without a second kernel: the weight's rows are cut into S pieces of K / S (a
    free reshape to [N * S, K / S]), x's matching pieces go side by side as S blocks of
    columns, and the S diagonal blocks of the [N * S, S * 16] result are summed (the S - 1
    others cost only arithmetic, free in a product this memory-bound)."""
    H, ungated = _mgpu_module()
    b, k = x.shape
    n = qt.shape[0]
    splits = splits or mgpu_splits(n, k, tile_m, tile_k)
    cols = max(MGPU_PAD, -(-b // MGPU_PAD) * MGPU_PAD)
    kk = k // splits
    # Hopper widens E4M3 to FP16 only (not BF16): E4M3 x FP16, exact for both but x's range
    act = jnp.bfloat16 if qt.dtype == jnp.int8 else jnp.float16
    xt = jnp.zeros((splits, kk, cols), act).at[:, :, :b].set(
        x.T.astype(act).reshape(splits, kk, b))
    xt = xt.transpose(1, 0, 2).reshape(kk, splits * cols)
    cfg = H.TuningConfig(tile_m=tile_m, tile_n=splits * cols, tile_k=tile_k,
                         max_concurrent_steps=stages, epi_tile_n=splits * cols,
                         epi_tile_m=64, wg_dimension=H.MatmulDimension.M)
    fn = H.mixed_matmul_kernel if qt.dtype == jnp.int8 else ungated
    yt = fn(qt.reshape(n * splits, kk), xt, out_dtype=jnp.float32, config=cfg)
    yt = yt.reshape(n, splits, splits, cols)
    yt = jnp.einsum("nssc->nc", yt)  # the diagonal blocks, summed over the splits
    return (yt[:, :b] * s.astype(jnp.float32)[:, None]).T.astype(jnp.bfloat16)


GEMV_DEFAULT = {"block_n": 16, "block_k": 256, "num_warps": 4, "splits": 1}


def split_k(k: int, n: int, block_n: int, programs: int = 264) -> int:
    """The fewest contraction splits (K / splits a power of two >= 16) that give at least
    ``programs`` programs of ``block_n`` columns (1 if none does)."""
    for s in range(1, k // 16 + 1):
        c = k // s
        if k % s == 0 and c & (c - 1) == 0 and c >= 16 and (n // block_n) * s >= programs:
            return s
    return 1


def rel_error(f, x, w, scale, transposed: bool, arg_scale) -> float:
    """max |f(x, w, arg_scale) - y| / max |y|, y the FP32 product of x and the weight
    dequantized with ``scale`` (None: the weight as it is, as BF16's and fp8-tensor's
    products take it): a fast variant that computes something else shows here."""
    w32 = (w.T if transposed else w).astype(jnp.float32)
    if scale is not None and w.dtype != jnp.bfloat16:
        w32 = w32 * scale.astype(jnp.float32)[None, :]
    want = jnp.dot(x.astype(jnp.float32), w32, precision="highest")
    got = jax.jit(f)(x, w, arg_scale).astype(jnp.float32)
    return float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))


def timed_loop(f, n_copies: int, iters: int, n: int):
    """A jitted ``(xs[iters * n_copies, M, K], ws, s) -> ys``: ``f`` on each copy of the
    weight in turn, a fresh row block of ``xs`` each time."""
    def run(xs, ws, s):
        def body(i, ys):
            return tuple(f(lax.dynamic_index_in_dim(xs, i * n_copies + c, 0, False), w, s)
                         for c, w in enumerate(ws))
        m = xs.shape[1]
        y0 = tuple(jnp.zeros((m, n), jnp.bfloat16) for _ in ws)
        return lax.fori_loop(0, iters, body, y0)
    return jax.jit(run)


def main():
    dev = jax.devices()[0]
    print(f"# device {dev.device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
          f"qwix {qwix.__version__ if qwix else 'not installed: qwix-order ops'}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    cpu = jax.default_backend() != "gpu"
    shapes = TINY if cpu else WIDE
    if ARGS.shapes:
        shapes = [(int(a), int(b), f"{a}x{b}") for a, b in
                  (p.split(":") for p in ARGS.shapes.split(","))]
    batches = [int(b) for b in ARGS.batches.split(",")]
    qtypes = [("fp8-w", jnp.float8_e4m3fn), ("int8-w", jnp.int8)]
    vs = variants(qtypes)
    l2_bytes = 0 if cpu else 160 << 20  # keep several times the L2 (50 MB) in play
    gemms_per_run = 4 if cpu else 200
    t_start = time.perf_counter()
    totals: dict[tuple[int, str], tuple[float, int]] = {}
    weights: dict[tuple, list] = {}
    fastest: dict[tuple, tuple] = {}  # (dtype, K, N) -> (ms, GEMV tiles or None, bf16 ms)

    def copies(k, n, qt, n_copies, kind_t=False):
        """``n_copies`` different [k, n] weights (BF16, or quantized to ``qt``; ``kind_t``:
        stored transposed) and the column scales, made on the device once per shape, type
        and layout."""
        if (k, n, qt, kind_t) not in weights:
            w = jax.random.normal(jax.random.key(k * 7 + n), (k, n), jnp.float32) * 0.02
            scale = (jnp.max(jnp.abs(w), axis=0) / 127.0).astype(jnp.bfloat16)
            if qt is None:
                ws = [(w + 1e-3 * c).astype(jnp.bfloat16) for c in range(n_copies)]
            else:
                qf = jnp.round(jnp.clip(w / scale.astype(jnp.float32), -127, 127))
                ws = [jnp.roll(qf, c, axis=0).astype(qt) for c in range(n_copies)]
            if kind_t:
                ws = [jnp.asarray(w.T) for w in ws]
            weights[(k, n, qt, kind_t)] = (jax.block_until_ready(ws), scale)
        return weights[(k, n, qt, kind_t)]

    print(f"{'shape':>22} {'rows':>4} {'variant':>16} {'ms/gemm':>9} {'bf16/this':>9} "
          f"{'GB/s':>7} {'rel.err':>8}  hlo", flush=True)
    for m in batches:
        for k, n, label in shapes:
            sweep = [{}]
            if ARGS.sweep and m == batches[0]:
                sweep += [{"block_n": bn, "block_k": bk} for bn in (32, 64, 128)
                          for bk in (128, 256, 512) if (bn, bk) != (32, 256)]
            n_copies = max(2, -(-l2_bytes // (k * n)))
            iters = max(1, gemms_per_run // n_copies)
            xs = jax.random.normal(jax.random.key(m), (iters * n_copies, m, k), jnp.bfloat16)
            msweep = [{}]
            if ARGS.mgpu_sweep:
                msweep += [c for c in ({"tile_m": tm, "tile_k": tk, "stages": st, "splits": sp}
                                       for tm in (64, 128) for tk in (128, 256)
                                       for st in (4,) for sp in (1, 2, 4, 8))
                           if c != MGPU_DEFAULT and k % (c["splits"] * c["tile_k"]) == 0]
            gsweep = [{}]
            if ARGS.gemv_sweep:
                gsweep += [c for c in ({"block_n": bn, "block_k": bk, "num_warps": nw,
                                        "splits": sp}
                                       for bn in (8, 16, 32, 64) for bk in (256, 512)
                                       for nw in (8,) for sp in (1, 2, 4))
                           if c != GEMV_DEFAULT and k % (c["splits"] * c["block_k"]) == 0
                           and n % c["block_n"] == 0]
            # INT8: the 256-byte tilings and 4 warps with 128 or 256 bytes, each with the
            # integer widenings
            isweep = [{**c, "widen": w} for c in gsweep[1:] + [
                {"block_n": bn, "block_k": bk, "num_warps": 4, "splits": sp}
                for bn in (8, 16, 32) for bk in (128, 256) for sp in (1, 2, 4)
                if k % (sp * bk) == 0 and n % bn == 0] if c["block_k"] != 512
                for w in ("magic", "prmt")] if ARGS.gemv_sweep else []
            base = None
            for vname, (kind, qt, options) in vs.items():
                for blocks in (sweep if kind == "pallas" else msweep if kind == "mgpu-t"
                               else [{}] + isweep if kind == "gemv-t" and qt == jnp.int8
                               else gsweep if kind == "gemv-t" else [{}]):
                    name = vname + ("" if not blocks else
                                    f"[{'x'.join(str(v) for v in blocks.values())}]")
                    if kind == "mgpu-t" and cpu:
                        print(f"{label:>14} {k}x{n} {m:>4} {name:>16}  (GPU only)")
                        break
                    if time.perf_counter() - t_start > ARGS.budget:
                        print(f"{label:>14} {k}x{n} {m:>4} {name:>16}  skipped (time budget)",
                              flush=True)
                        continue
                    if kind in ("pallas", "splitk") and D.blocks(m, k, n) is None:
                        print(f"{label:>14} {k}x{n} {m:>4} {name:>16}  (no Pallas tiling)")
                        continue
                    ws, scale = copies(k, n, qt, n_copies, kind.endswith("-t"))
                    f = gemm_fn(kind, cpu, **blocks)
                    try:
                        lw = timed_loop(f, n_copies, iters, n).lower(xs, ws, scale)
                        prog = lw.compile(compiler_options=options) if options else lw.compile()
                        hlo = dequant_lowering(prog.as_text() or "")
                        tensor = kind.startswith("tensor")  # its weight scale is one
                        err = rel_error(f, xs[0], ws[0], None if tensor else scale,
                                        kind.endswith("-t"), scale)
                        best = timing.time_fn(prog, xs, ws, scale, repeats=3, warmup=1).median_s
                    except Exception as e:  # noqa: BLE001 - a failing variant ends only its line
                        msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
                        print(f"{label:>14} {k}x{n} {m:>4} {name:>16}  FAILED "
                              f"{type(e).__name__}: {msg}", flush=True)
                        continue
                    ms = 1e3 * best / (iters * n_copies)
                    if kind == "bf16":
                        base = ms
                    nbytes = k * n * (2 if qt is None else 1) + 2 * m * (k + n)
                    ratio = f"{base / ms:9.2f}" if base else f"{'-':>9}"
                    # E4M3 activations (fp8-tensor) add their own rounding
                    wrong = "  WRONG" if err > (1e-1 if kind.startswith("tensor") else 2e-2) \
                        else ""
                    print(f"{label:>14} {k}x{n} {m:>4} {name:>16} {ms:9.4f} {ratio} "
                          f"{nbytes / (ms * 1e-3) / 1e9:7.0f} {err:8.1e}  {hlo}{wrong}",
                          flush=True)
                    if not blocks:
                        t, c = totals.get((m, vname), (0.0, 0))
                        totals[(m, vname)] = (t + ms, c + 1)
                    if m == batches[0] and kind in ("gemv-t", "reduce-t"):
                        key = (jnp.dtype(qt).name, k, n)
                        tiles = None if kind == "reduce-t" else D.Gemv(
                            **{**GEMV_DEFAULT, **blocks})._asdict()
                        if key not in fastest or ms < fastest[key][0]:
                            fastest[key] = (ms, tiles, base)
    print(f"# per layer ({len(shapes)} shapes summed, where all ran), bf16 time / variant time:")
    for m in batches:
        b = totals.get((m, "bf16"), (None, 0))
        row = [f"{v}={b[0] / t:.2f}x" for (mm, v), (t, c) in totals.items()
               if mm == m and v != "bf16" and c == len(shapes) and b[1] == len(shapes)]
        print(f"# rows {m}: " + (" ".join(row) or "incomplete"))
    if fastest:
        print(f"# rows {batches[0]}, fastest of gemv-t's tilings and reduce-t per weight:")
        for (dt, k, n), (ms, tiles, b) in fastest.items():
            how = "reduce-t" if tiles is None else "gemv-t " + "x".join(map(str, tiles.values()))
            print(f"#   {dt:>14} {k}x{n}: {how} {ms:.4f} ms" + (f" {b / ms:.2f}x" if b else ""))
        for dt in sorted({key[0] for key in fastest}):
            mine = [v for key, v in fastest.items() if key[0] == dt]
            if len(mine) == len(shapes) and all(v[2] for v in mine):
                print(f"# rows {batches[0]} {dt}: per layer with the fastest per weight "
                      f"{sum(v[2] for v in mine) / sum(v[0] for v in mine):.2f}x")
    if ARGS.write_tiles:
        import json

        table = [[dt, k, n, *(tiles.values() if tiles else [None])]
                 for (dt, k, n), (_, tiles, _) in fastest.items()]
        Path(ARGS.write_tiles).write_text(json.dumps({dev.device_kind: table}, indent=1))
        print(f"# wrote {len(table)} tilings to {ARGS.write_tiles}")
    print(f"# done in {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
