"""Probe: the optimized HLO a device compiles for INT8 training, and how it is read.

Compiles, on the default device, the training step of ``repro.experiments.mlp_step``'s MLP
(width, batch and depth from the arguments) under ``int8``, ``bf16`` and ``fp8-delayed``,
writes each program's optimized HLO to ``OUT/<device>_<recipe>_mlp_step.hlo`` and prints how
``repro.studies.lowering`` reads it (the f8 and INT8 lowerings, the products' operand types,
and the record labels ``emulated`` and ``weight_storage``). The texts are the test data of
``tests/test_lowering.py`` (``tests/data/hlo``) for a device whose programs the tests have not
seen yet: copy the new ones there and add their expected readings.

    python3 scripts/probe_int8_hlo.py --out build/hlo          # on a TPU: about a minute
    python3 scripts/probe_int8_hlo.py --cpu --width 64 --batch 64 --out build/hlo

Nothing here is a record.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--out", default=os.environ.get("OUT", "build/hlo"), help="folder for the HLO")
ap.add_argument("--width", type=int, default=1024)
ap.add_argument("--batch", type=int, default=4096)
ap.add_argument("--depth", type=int, default=3)
ap.add_argument("--recipes", default="int8,bf16,fp8-delayed")
ap.add_argument("--cpu", action="store_true", help="run on the CPU")
args = ap.parse_args()
if args.cpu:
    os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from repro import hardware  # noqa: E402
from repro.experiments.mlp_step import measure as M  # noqa: E402
from repro.precision.recipes import resolve  # noqa: E402
from repro.studies import lowering as L  # noqa: E402

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
kind = jax.devices()[0].device_kind
tag = hardware.detect().slug
print(f"device {kind} ({tag}), jax {jax.__version__}; MLP width {args.width}, batch "
      f"{args.batch}, depth {args.depth}")
for recipe in args.recipes.split(","):
    step, variables, opt_state, x, y = M._setup(resolve(recipe), args.width, args.batch,
                                                args.depth)
    text = step.lower(variables, opt_state, x, y).compile().as_text() or ""
    path = out / f"{tag}_{recipe}_mlp_step.hlo"
    path.write_text(text)
    facts = {"fp8_lowering": L.fp8_lowering(text), "int8_lowering": L.int8_lowering(text)}
    prods = collections.Counter(f"{a} x {b} -> {o} ({op})" for op, o, a, b in L.products(text))
    print(f"{recipe}: {path} ({len(text) / 1e3:.0f} kB); fp8_lowering {facts['fp8_lowering']}, "
          f"int8_lowering {facts['int8_lowering']}, emulated "
          f"{L.recipe_emulated(recipe, facts)}, weight_storage {L.weight_storage(text)}")
    for p, n in sorted(prods.items()):
        print(f"    {n} x {p}")
