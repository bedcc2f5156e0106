"""Probe: decode (or prefill) tokens/s of the inference study's programs, per format, beside
BF16 in one run, for a speed config of params.yaml or a config changed on the command line.

It builds the same programs as ``repro.experiments.inference.speed`` (untrained weights
exported per format, the jitted KV-cache decode loop) and times them interleaved (A, B, A, B,
...), printing tokens/s, the ratio over BF16 with its per-round range, and the compile seconds.
XLA flags come from the environment, so two runs compare flag sets, e.g. command buffers
(CUDA graphs) for the decode loop's kernels:

    python3 scripts/probe_decode.py --config wide --formats fp8-w,int8-w --batch 1
    python3 scripts/probe_decode.py --config wide --set d_model=8192 --set d_ff=28672 \\
        --set n_heads=64 --formats fp8-w,int8-w          # a wider model, speed only
    python3 scripts/probe_decode.py --kernel xla      # the weight-only product in another form
    python3 scripts/probe_decode.py --gemv-tiles tiles.json  # GEMV tilings of a sweep
    XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE \\
        python3 scripts/probe_decode.py --config wide --formats fp8-w

Numbers from a probe are not records: a verdict reads only what ``repro record inference``
writes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="wide", help="a speed config of params.yaml's "
                    "inference.<profile>.speed.configs")
    ap.add_argument("--profile", default="full")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                    help="change an LMConfig field of the config (repeatable)")
    ap.add_argument("--formats", default="fp8-w,int8-w", help="formats beside bf16")
    ap.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--length", type=int, default=128,
                    help="prompt length (decode: the cached prefix)")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per call")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kernel", default=None,
                    help="the weight-only formats' product, a form of "
                         "repro.precision.dequant_gemm.IMPLS that their layout takes "
                         "(default: the formats' own)")
    ap.add_argument("--gemv-tiles", default=None, metavar="FILE",
                    help="GEMV tilings to use (probe_dequant_gemm.py --write-tiles' JSON) "
                         "in place of repro.precision.dequant_gemm.GEMV_TILES")
    return ap.parse_args()


def main() -> None:
    a = parse()
    from repro.experiments.inference import speed as S

    if a.kernel:
        import dataclasses

        from repro.precision import export

        for name, fmt in export.FORMATS.items():
            if fmt.kernel is not None:
                export.FORMATS[name] = dataclasses.replace(fmt, kernel=a.kernel)

    if a.gemv_tiles:
        import json

        from repro.precision import dequant_gemm as D

        for device, rows in json.loads(Path(a.gemv_tiles).read_text()).items():
            D.GEMV_TILES[device] = {**D.GEMV_TILES.get(device, {}), **{
                (r[0], r[1], r[2]): (D.Gemv(*r[3:]) if r[3] else None) for r in rows}}
            print(f"# GEMV tilings for {device}: {D.GEMV_TILES[device]}", flush=True)

    root = Path(__file__).resolve().parent.parent
    spec = yaml.safe_load((root / "params.yaml").read_text())["inference"][a.profile]
    configs = S.speed_configs(spec)
    if a.config not in configs:
        raise SystemExit(f"probe_decode: no speed config {a.config!r} in params.yaml's "
                         f"inference.{a.profile}; valid: {', '.join(configs)}")
    changes = {}
    for item in a.set:
        field, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"probe_decode: --set {item!r}: expected FIELD=INT")
        changes[field] = int(value)
    cfg = S.model_config(a.config, {**configs[a.config], **changes})
    import jax

    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    print(f"# {cfg}", flush=True)
    formats = ["bf16"] + [f for f in a.formats.split(",") if f and f != "bf16"]
    progs = {f: S._program(cfg, f, a.phase, a.batch, a.length, a.steps) for f in formats}
    runs = {f: (lambda c=c, args=args: c(*args)) for f, (c, args, _, _) in progs.items()}
    secs = S.interleaved(runs, a.repeats)
    tokens = progs["bf16"][2]
    for f in formats:
        _, _, _, facts = progs[f]
        ratio = secs["bf16"] / secs[f]
        print(f"{a.phase} b{a.batch} {f:>12}: {tokens / np.median(secs[f]):12.1f} tokens/s  "
              f"x{np.median(ratio):.3f} BF16 (rounds {ratio.min():.3f}-{ratio.max():.3f})  "
              f"compile {facts['compile_s']:.1f} s  lowering {facts['lowering']}", flush=True)


if __name__ == "__main__":
    main()
