"""Probe: where ours and PureJaxRL's ``ppo.py`` spend GPU time on its CartPole-v1 config.

For each seed count, compiles PureJaxRL's program and ours (the defaults and each ``--unroll``),
times them round-robin in this process (seconds per whole run, median of ``--repeats``; the
ratio is PureJaxRL's time over ours), then at the largest seed count traces one run of
PureJaxRL's and of our defaults with ``jax.profiler`` and prints, per program, the number of
kernels, their summed time against the run's wall time (kernel-bound or not), the time per
kernel class (``repro.analysis.traces``) and the largest kernels. ``--select-skip`` replaces
``optax.apply_if_finite`` (a ``lax.cond`` per optimizer step) in our optimizer by an
elementwise select of the same result, a lever for launch-bound runs. Nothing is recorded.
Needs a checkout of github.com/luchris429/purejaxrl and gymnax:

    PYTHONPATH=. python3 scripts/probe_purejaxrl_kernels.py --purejaxrl DIR \\
        --seeds 1 1024 --timesteps 500000 65536 --unroll 1 4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from repro.analysis import traces
from repro.models import ppo
from repro.precision import optim
from repro.studies import kernel_times
from repro.studies import purejaxrl as P


def select_skip(inner, max_consecutive: int = 2 ** 30):
    """``optax.apply_if_finite``'s result and state without ``lax.cond``: both computed,
    selected elementwise (a non-finite step gives a zero update and keeps the state)."""
    def init(params):
        return optax.ApplyIfFiniteState(jnp.zeros([], jnp.int32), jnp.array(True),
                                        jnp.zeros([], jnp.int32), inner.init(params))

    def update(updates, state, params=None):
        ok = optim.all_finite(updates)
        new_u, new_inner = inner.update(updates, state.inner_state, params)
        new_u = jax.tree.map(lambda u: jnp.where(ok, u, jnp.zeros_like(u)), new_u)
        kept = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_inner, state.inner_state)
        return new_u, optax.ApplyIfFiniteState(
            jnp.where(ok, 0, state.notfinite_count + 1), ok,
            state.total_notfinite + jnp.logical_not(ok).astype(jnp.int32), kept)
    return optax.GradientTransformation(init, update)


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--purejaxrl", required=True, help="a checkout of PureJaxRL")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 1024])
    ap.add_argument("--timesteps", type=int, nargs="+", default=[500000, 65536],
                    help="TOTAL_TIMESTEPS per seed count")
    ap.add_argument("--unroll", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--select-skip", action="store_true")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    if a.select_skip:
        optim.skip_nonfinite = select_skip
    module, _ = P.load(a.purejaxrl)
    for seeds, total in zip(a.seeds, a.timesteps):
        cfg = {**P.CARTPOLE, "TOTAL_TIMESTEPS": total}
        theirs, keys, _ = P.compile_theirs(module, cfg, seeds)
        runs = {"purejaxrl": (theirs, keys)}
        for options in [{}, *({"unroll": u} for u in a.unroll)]:
            k = P._keys(seeds)
            fn = jax.jit(jax.vmap(ppo.make_train(P.ours_config(cfg, "tf32", options))))
            fn = fn.lower(k).compile()
            jax.block_until_ready(fn(k))
            runs[P.label(options)] = (fn, k)
        times = {n: [] for n in runs}
        for _ in range(a.repeats):
            for n, (fn, k) in runs.items():
                t0 = time.perf_counter()
                jax.block_until_ready(fn(k))
                times[n].append(time.perf_counter() - t0)
        base = np.median(times["purejaxrl"])
        for n, t in times.items():
            print(f"seeds {seeds}: {n:22s} {np.median(t):.3f} s per run, "
                  f"PureJaxRL / this {base / np.median(t):.3f}x")
        if seeds == max(a.seeds):
            for n in ("purejaxrl", "repro"):
                kernel_summary(*runs[n], f"{n} ({seeds} seeds)", a.top)


if __name__ == "__main__":
    main()
