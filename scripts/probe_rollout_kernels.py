"""Probe: how much one PPO rollout step launches (compile-only unless ``--time``).

For ours on PureJaxRL's CartPole-v1 config (``repro.experiments.rl_purejaxrl.measure``) at each
``--unroll``, compiles the whole run and prints one JSON line: the optimized HLO's size, the
number of fusions in each of the four largest while-loop bodies (the minibatch step, the
update, the rollout step -- each unrolled env step repeats its part --, the epoch; on a GPU a
fusion is about one kernel launch) and the compile seconds (three compilations, sorted);
``--time N`` also runs the compiled program N times (seconds per whole run, sorted). Run it on
two checkouts to compare them:

    PYTHONPATH=. python3 scripts/probe_rollout_kernels.py --unroll 1 2 4 8
    PYTHONPATH=. python3 scripts/probe_rollout_kernels.py --seeds 1024 --unroll 1
    PYTHONPATH=. python3 scripts/probe_rollout_kernels.py --unroll 1 --time 3  # and run it
"""

from __future__ import annotations

import argparse
import json
import re
import time

import jax
import jax.numpy as jnp

from repro.experiments.rl_purejaxrl import measure as purejaxrl
from repro.models import ppo


def probe(unroll: int, seeds: int, repeats: int = 3, runs: int = 0) -> dict:
    options = {"unroll": unroll}
    train = ppo.make_train(purejaxrl.ours_config(purejaxrl.CARTPOLE, "tf32", options))
    fn = jax.jit(jax.vmap(train)) if seeds > 1 else jax.jit(train)
    keys = (jax.vmap(jax.random.key)(jnp.arange(seeds)) if seeds > 1 else jax.random.key(0))
    times = []
    for _ in range(repeats):
        jax.clear_caches()
        lowered = fn.lower(keys)
        t0 = time.perf_counter()
        compiled = lowered.compile()
        times.append(time.perf_counter() - t0)
    run_s = []
    for _ in range(runs):  # the whole run, after compiling (the same program each time)
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(keys))
        run_s.append(time.perf_counter() - t0)
    text = compiled.as_text()
    comps = {m.group(1): m.group(0)
             for m in re.finditer(r"(?ms)^(?:ENTRY )?%?([\w.\-]+) .*?^}", text)}
    bodies = dict.fromkeys(re.findall(r"body=%?([\w.\-]+)", text))
    fusions = sorted((comps.get(b, "").count(" fusion(") for b in bodies), reverse=True)
    return {"module": ppo.__file__, "backend": jax.default_backend(), "unroll": unroll,
            "seeds": seeds, "hlo_lines": text.count("\n"),
            "compile_s": sorted(round(t, 2) for t in times), "body_fusions": fusions[:4],
            "run_s": sorted(round(t, 3) for t in run_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unroll", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time", type=int, default=0, metavar="RUNS",
                    help="also run the compiled program this many times (run_s, sorted)")
    a = ap.parse_args()
    for u in a.unroll:
        print(json.dumps(probe(u, a.seeds, a.repeats, a.time)), flush=True)


if __name__ == "__main__":
    main()
