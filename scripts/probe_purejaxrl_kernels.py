"""Probe: ours against PureJaxRL's ``ppo.py`` on its CartPole-v1 config, per option set.

For each seed count, compiles PureJaxRL's program and ours in each ``--options`` set (JSON
objects of :class:`repro.models.ppo.PPOConfig` fields and the optimizer keys of :func:`ours`;
``{}`` is the defaults; unlike the recorded study, fields other than the speed options may be
set, to price a feature), times
them round-robin in this process (seconds per whole run, median of ``--repeats``; the ratio is
PureJaxRL's time over ours), then at the largest seed count traces one run of each with
``jax.profiler`` and prints, per program, the number of kernels, their summed time against the
run's wall time, the time per kernel class (``repro.experiments.kernel_times.tables``) and, for
PureJaxRL and the first option set, the largest kernels. ``--compile-seeds N`` also compiles
each program for N seeds in a fresh process without compilation or autotune caches (as the
study's first result does) and prints the compile time. Nothing is recorded. Needs a checkout
of github.com/luchris429/purejaxrl and gymnax:

    PYTHONPATH=. python3 scripts/probe_purejaxrl_kernels.py --purejaxrl DIR \\
        --seeds 1024 --timesteps 131072 --options '{}' '{"update_unroll": 2}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from repro.experiments.kernel_times import measure as kernel_times
from repro.experiments.kernel_times import tables as traces
from repro.experiments.rl_purejaxrl import measure as P
from repro.models import ppo
from repro.precision import optim


def norm_skip(inner, max_consecutive: int = 2 ** 30):
    """``optax.apply_if_finite`` whose finiteness test is that of the gradients' global norm
    (the one the norm clip computes, so XLA can share the reduction) instead of an
    ``isfinite`` reduction per leaf."""
    def init(params):
        return optax.ApplyIfFiniteState(jnp.zeros([], jnp.int32), jnp.array(True),
                                        jnp.zeros([], jnp.int32), inner.init(params))

    def update(updates, state, params=None):
        ok = jnp.isfinite(optax.tree.norm(updates))
        count = jnp.where(ok, 0, state.notfinite_count + 1)
        new_u, new_inner = jax.lax.cond(
            jnp.logical_or(ok, count > max_consecutive),
            lambda: inner.update(updates, state.inner_state, params),
            lambda: (jax.tree.map(jnp.zeros_like, updates), state.inner_state))
        return new_u, optax.ApplyIfFiniteState(
            count, ok, state.total_notfinite + jnp.logical_not(ok).astype(jnp.int32), new_inner)
    return optax.GradientTransformation(init, update)


def ours(cfg, options):
    """Our ``make_train`` with ``options`` over PureJaxRL's config; the key ``skip_nonfinite``
    (an optimizer flag, not a PPOConfig field) sets the non-finite skip on or off, and
    ``skip_impl: "norm"`` replaces it by :func:`norm_skip`."""
    options = dict(options)
    skip = options.pop("skip_nonfinite", optim.OPTIMIZER_DEFAULTS["skip_nonfinite"])
    impl = {"norm": norm_skip}.get(options.pop("skip_impl", None))
    base = P.ours_config(cfg, "tf32")
    saved, saved_skip = dict(optim.OPTIMIZER_DEFAULTS), optim.skip_nonfinite
    optim.OPTIMIZER_DEFAULTS["skip_nonfinite"] = skip
    optim.skip_nonfinite = impl or saved_skip
    try:
        return ppo.make_train(ppo.validate({**dataclasses.asdict(base), **options}))
    finally:
        optim.OPTIMIZER_DEFAULTS.update(saved)
        optim.skip_nonfinite = saved_skip


def kernel_summary(fn, keys, name: str, top: int) -> None:
    logdir = Path(tempfile.mkdtemp())
    wall = kernel_times.trace_steps(lambda: fn(keys), 1, logdir)
    ev = traces.kernel_events(traces.load_trace(logdir))
    if not len(ev):
        print(f"== {name}: no device kernels in the trace ({jax.default_backend()})")
        return
    print(f"== {name}: {len(ev)} kernels, {ev.dur.sum() / 1e3:.1f} ms of kernels in a "
          f"{wall * 1e3:.0f} ms traced run; by class (ms): "
          f"{ev.groupby('class').dur.sum().div(1e3).round(1).to_dict()}")
    g = ev.groupby("name").dur.agg(["sum", "count"]).sort_values("sum", ascending=False)
    for n, r in g.head(top).iterrows():
        print(f"   {r['sum'] / 1e3:9.2f} ms {int(r['count']):8d}  {n[:100]}")


def fresh_compile(job: dict) -> None:
    """In a fresh process: compile one program, print its compile time as a JSON line."""
    cfg = P.CARTPOLE
    if job["impl"] == "purejaxrl":
        module, _ = P.load(job["purejaxrl"])
        fn, keys = jax.jit(jax.vmap(module.make_train(cfg))), jax.random.split(
            jax.random.PRNGKey(30), job["seeds"])
    else:
        fn, keys = jax.jit(jax.vmap(ours(cfg, job["options"]))), P._keys(job["seeds"])
    t0 = time.perf_counter()
    fn.lower(keys).compile()
    print(json.dumps({"compile_s": round(time.perf_counter() - t0, 2)}), flush=True)


def compile_time(job: dict) -> str:
    out = subprocess.run([sys.executable, __file__, "--fresh", json.dumps(job)],
                         capture_output=True, text=True, env=P.fresh_env())
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")), None)
    return f"{json.loads(line)['compile_s']:.2f} s" if line else f"failed: {out.stderr[-300:]}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--purejaxrl", help="a checkout of PureJaxRL (required)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1024])
    ap.add_argument("--timesteps", type=int, nargs="+", default=[131072],
                    help="TOTAL_TIMESTEPS per seed count")
    ap.add_argument("--options", nargs="+", default=["{}"], help="JSON option sets")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile-seeds", type=int, default=0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--fresh", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.fresh:
        return fresh_compile(json.loads(a.fresh))
    if not a.purejaxrl:
        ap.error("--purejaxrl DIR (a checkout of PureJaxRL) is required")
    option_sets = [json.loads(o) for o in a.options]
    if a.compile_seeds:
        job = {"seeds": a.compile_seeds, "purejaxrl": a.purejaxrl}
        print(f"compile, {a.compile_seeds} seeds, fresh process: purejaxrl "
              f"{compile_time({**job, 'impl': 'purejaxrl'})}", flush=True)
        for o in option_sets:
            print(f"compile, {a.compile_seeds} seeds, fresh process: {o} "
                  f"{compile_time({**job, 'impl': 'ours', 'options': o})}", flush=True)
    module, _ = P.load(a.purejaxrl)
    for seeds, total in zip(a.seeds, a.timesteps):
        cfg = {**P.CARTPOLE, "TOTAL_TIMESTEPS": total}
        theirs, keys, _ = P.compile_theirs(module, cfg, seeds)
        runs = {"purejaxrl": (theirs, keys)}
        for o in option_sets:
            k = P._keys(seeds)
            fn = jax.jit(jax.vmap(ours(cfg, o))).lower(k).compile()
            jax.block_until_ready(fn(k))
            runs[json.dumps(o)] = (fn, k)
        times = {n: [] for n in runs}
        for _ in range(a.repeats):
            for n, (fn, k) in runs.items():
                t0 = time.perf_counter()
                jax.block_until_ready(fn(k))
                times[n].append(time.perf_counter() - t0)
        base = np.median(times["purejaxrl"])
        for n, t in times.items():
            print(f"seeds {seeds}: {n:40s} {np.median(t):.3f} s per run "
                  f"({min(t):.3f}-{max(t):.3f}), PureJaxRL / this {base / np.median(t):.3f}x",
                  flush=True)
        if seeds == max(a.seeds):
            for i, (n, (fn, k)) in enumerate(runs.items()):
                kernel_summary(fn, k, f"{n} ({seeds} seeds)", a.top if i < 2 else 0)


if __name__ == "__main__":
    main()
