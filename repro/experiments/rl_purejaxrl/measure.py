"""This repository's PPO against PureJaxRL's ``ppo.py``: env-steps/s, same config, same device.

The performance target: on PureJaxRL's CartPole-v1 configuration, ``repro.models.ppo`` should
beat PureJaxRL's ``ppo.py`` in env-steps/s by >= 1.2x, for one seed and for 1024 seeds under
``vmap``. Both run in the same process, compiled first, then timed in alternation.

Ours runs in one or more option sets (``params.yaml``, ``rl_purejaxrl.ours``): values of the
speed options of :class:`repro.models.ppo.PPOConfig` (``unroll``, ``update_unroll``,
``epoch_unroll``, ``prng``; nothing else may differ from PureJaxRL's config). PureJaxRL is compiled once per seed count,
then each option set in turn, the two timed round-robin (:func:`compare`: repeat i of each,
back to back).
Each cell also times the FIRST result of both in a fresh process (``first_result``, on by
default): a new Python process per program that imports, compiles and runs one training run
with JAX's persistent compilation cache and XLA's autotune cache off, metric
``first_result_s`` (seconds from the start of compiling to the end of that first run; the
process's whole wall time, imports included, is in ``extra``). What a user waits for before
one run's numbers exist, where the round-robin timing measures the runs after it.
Every record also holds its run's final return (:func:`final_returns`: per seed, the
episode-weighted mean return over the last 10% of updates; mean, SD and count), so an option
set's learning can be checked against the defaults' and PureJaxRL's. :data:`STUDY` has one
cell per (seed count, option set), written as soon as it is timed: ``CartPole-v1_s1`` for the
defaults (the cells recorded before options existed: their records, without ``options``, mean
``{}``),
``CartPole-v1_s1_unroll-8`` and so on, each with PureJaxRL's record of the same process. Cells
already recorded are skipped, so a new option set is timed (with PureJaxRL) without redoing the
others; ``--force`` redoes them all. ``repro.analysis.rl.purejaxrl_speedups`` gives one row per
cell and flags the best ratio per seed count -- a choice made after timing, so a selection
among the rows; a confirming run of the chosen set is a cell of its own (``runs: 2`` in
``params.yaml``, selected with ``--only``).

Where a compile goes (``compile_stages: true``): one more cell per (seed count, option set),
``<cell>_stages``, compiles each program in a fresh process (as the first result does) through
``jax.stages`` and records how long tracing (Python), lowering (to StableHLO) and XLA's
compilation took (:func:`stage_times`; metric ``compile_stages_s``, their sum), for PureJaxRL's
program and ours, and for ours also those of two of its parts compiled alone, on abstract
arguments of their shapes under the same ``vmap`` over seeds: the update (the epoch and
minibatch scans, ``ppo.make_update_step``) and GAE (its scan); the rest of ours (the rollout
scan and the loop over updates) is the whole minus those. Nothing is run.

PureJaxRL is not a package and its code is not redistributed here: ``--purejaxrl DIR`` points at
a checkout of https://github.com/luchris429/purejaxrl, imported with three adapters that change
nothing it computes (:mod:`repro.experiments.rl_purejaxrl.peer`).

Ours runs with the ``tf32`` recipe: JAX's default matmul precision, as in ``ppo.py``. Ours also
evaluates the critic on the final observation of truncated episodes (bootstrapping through
truncation, which ``ppo.py`` does not do), so it does slightly more work per step.

    repro record rl_purejaxrl --purejaxrl ~/src/purejaxrl --profile full
    # one option set only (cell names: CartPole-v1_s<seeds>[_<option>-<value>...]):
    repro record rl_purejaxrl --purejaxrl DIR --profile full --only '*_unroll-32_update_unroll-4'
    # a confirming run of it, kept beside the first (with runs: 2 in params.yaml):
    repro record rl_purejaxrl --purejaxrl DIR --profile full --only '*_unroll-32_*_run2'
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from repro import results
from repro.config import Section, from_cli, positive, recipe_names
from repro.experiments.rl_purejaxrl.peer import (URL, FiveTupleStep, checkout_dir,
                                                 distrax_stand_in, load)
from repro.experiments.rl_purejaxrl.runs import (CARTPOLE, _keys, _summary, _warm, cell_name,
                                                 compare, compile_theirs, env_steps,
                                                 final_returns, label, ours_config,
                                                 returns_digest)
from repro.models import ppo
from repro.studies.runner import Cell, Study

EXPERIMENT = "rl_purejaxrl"


def fresh_env() -> dict[str, str]:
    """This process's environment without JAX's persistent compilation cache and XLA's
    autotune cache (a fresh process compiles and autotunes everything itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")
           and not k.startswith("JAX_PERSISTENT_CACHE")}
    flags = re.sub(r"--xla_gpu_per_fusion_autotune_cache_dir=\S*", "",
                   env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = flags
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    return env


def first_result(impl: str, cfg: dict[str, Any], seeds: int, recipe: str = "tf32",
                 options: Mapping[str, Any] | None = None, purejaxrl: str | None = None,
                 timeout: float = 900.0) -> dict[str, float]:
    """Compile and run ``impl`` ("purejaxrl" or ours with ``options``) once for ``seeds``
    vmapped seeds in a NEW Python process (:func:`fresh_env`); ``{"first_result_s",
    "compile_s", "process_s"}``: compile + first run, compile alone, and the process's whole
    wall time (imports included). A one-line RuntimeError if the process fails."""
    job = {"impl": impl, "cfg": cfg, "seeds": seeds, "recipe": recipe,
           "options": dict(options or {}), "purejaxrl": purejaxrl}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "repro.experiments.rl_purejaxrl.measure",
                          json.dumps(job)],
                         capture_output=True, text=True, env=fresh_env(), timeout=timeout)
    wall = time.perf_counter() - t0
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")), None)
    if out.returncode or line is None:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise RuntimeError(f"{EXPERIMENT}: the fresh process for {impl} failed "
                           f"(exit {out.returncode}): {tail}")
    return {**json.loads(line), "process_s": round(wall, 3)}


def _first_result_main(job: dict[str, Any]) -> dict[str, float]:
    """The fresh process of :func:`first_result`: compile, then one run, timed."""
    seeds, cfg = int(job["seeds"]), job["cfg"]
    if job["impl"] == "purejaxrl":
        module, _ = load(job["purejaxrl"])
        fn = jax.jit(jax.vmap(module.make_train(dict(cfg))))
        keys = jax.random.split(jax.random.PRNGKey(30), seeds)
    else:
        fn = jax.jit(jax.vmap(ppo.make_train(ours_config(cfg, job["recipe"], job["options"]))))
        keys = _keys(seeds)
    t0 = time.perf_counter()
    compiled = fn.lower(keys).compile()
    t1 = time.perf_counter()
    jax.block_until_ready(compiled(keys))
    t2 = time.perf_counter()
    return {"first_result_s": round(t2 - t0, 3), "compile_s": round(t1 - t0, 3)}


def stage_times(jitted, *args) -> dict[str, float]:
    """Seconds of each ``jax.stages`` step of compiling ``jitted`` (a ``jax.jit`` function)
    for ``args`` (arrays or ``jax.ShapeDtypeStruct``): ``trace_s`` (running the Python
    function to a jaxpr), ``lower_s`` (the jaxpr to StableHLO) and ``compile_s`` (XLA)."""
    t0 = time.perf_counter()
    traced = jitted.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    lowered.compile()
    t3 = time.perf_counter()
    return {"trace_s": round(t1 - t0, 3), "lower_s": round(t2 - t1, 3),
            "compile_s": round(t3 - t2, 3)}


def ours_parts(c: ppo.PPOConfig, seeds: int) -> dict[str, tuple[Any, tuple]]:
    """Two parts of our program for ``c``, each ``(jitted, abstract arguments)`` under a
    ``vmap`` over ``seeds``, as the whole program runs them: ``update`` (one PPO update: the
    epoch and minibatch scans, ``ppo.make_update_step``, on a rollout-shaped batch) and
    ``gae`` (the advantages' scan over a rollout, ``ppo.compute_gae``)."""
    env, env_params = ppo.make_env(c.env)
    net = ppo.build_network(c, env, env_params)
    tx = ppo.make_optimizer(c)
    key = jax.eval_shape(lambda: jax.random.key(0))
    variables, opt_state = jax.eval_shape(
        lambda k: ppo.init_state(c, net, env, env_params, tx, k), key)
    T, N = c.num_steps, c.num_envs
    f32 = jnp.float32

    def sd(shape, dtype=f32):
        return jax.ShapeDtypeStruct(shape, dtype)

    traj = ppo.Transition(obs=sd((T, N, *ppo.obs_shape(env, env_params))),
                          action=sd((T, N), jnp.int32), log_prob=sd((T, N)), value=sd((T, N)),
                          reward=sd((T, N)), done=sd((T, N), jnp.bool_))

    def seeded(tree):
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct((seeds, *a.shape), a.dtype), tree)

    update = jax.jit(jax.vmap(ppo.make_update_step(c, net, tx)))
    gae = jax.jit(jax.vmap(lambda r, v, d, last: ppo.compute_gae(r, v, d, last, c.gamma,
                                                                  c.gae_lambda)))
    return {"update": (update, seeded((variables, opt_state, traj, sd((T, N)), sd((T, N)),
                                       key))),
            "gae": (gae, seeded((sd((T, N)), sd((T, N)), sd((T, N), jnp.bool_), sd((N,)))))}


def compile_stages(impl: str, cfg: dict[str, Any], seeds: int, recipe: str = "tf32",
                   options: Mapping[str, Any] | None = None, purejaxrl: str | None = None,
                   timeout: float = 900.0) -> dict[str, dict[str, float]]:
    """Where the compile of ``impl`` ("purejaxrl" or ours with ``options``) for ``seeds``
    vmapped seeds goes, in a NEW Python process without compile caches (:func:`fresh_env`):
    ``{"whole": stage_times}`` of the whole program, and for ours also each of
    :func:`ours_parts`, compiled after the whole in the same process. A one-line
    RuntimeError if the process fails."""
    job = {"stages": True, "impl": impl, "cfg": cfg, "seeds": seeds, "recipe": recipe,
           "options": dict(options or {}), "purejaxrl": purejaxrl}
    out = subprocess.run([sys.executable, "-m", "repro.experiments.rl_purejaxrl.measure",
                          json.dumps(job)],
                         capture_output=True, text=True, env=fresh_env(), timeout=timeout)
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")), None)
    if out.returncode or line is None:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise RuntimeError(f"{EXPERIMENT}: the compile-stages process for {impl} failed "
                           f"(exit {out.returncode}): {tail}")
    return json.loads(line)


def _compile_stages_main(job: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The fresh process of :func:`compile_stages`: nothing runs, every program compiles."""
    seeds, cfg = int(job["seeds"]), job["cfg"]
    if job["impl"] == "purejaxrl":
        module, _ = load(job["purejaxrl"])
        keys = jax.random.split(jax.random.PRNGKey(30), seeds)
        return {"whole": stage_times(jax.jit(jax.vmap(module.make_train(dict(cfg)))), keys)}
    c = ours_config(cfg, job["recipe"], job["options"])
    out = {"whole": stage_times(jax.jit(jax.vmap(ppo.make_train(c))), _keys(seeds))}
    for name, (fn, args) in ours_parts(c, seeds).items():
        out[name] = stage_times(fn, *args)
    return out


def _stages_records(p: "Params", seeds: int, options: Mapping[str, Any],
                    stages: Mapping[str, Mapping[str, Mapping[str, float]]]
                    ) -> list[dict[str, Any]]:
    """One ``compile_stages_s`` record per program (``stages``: impl -> what
    :func:`compile_stages` returned): the whole program's trace + lower + compile seconds,
    the stages and (ours) the parts in ``extra``."""
    cfg, steps = _config(p), env_steps(_config(p), seeds)
    out = []
    for impl, st in stages.items():
        whole = st["whole"]
        out.append(results.make_record(
            EXPERIMENT, "compile_stages_s", round(sum(whole.values()), 3), "s", claims=["A2"],
            recipe=p.recipe, sizes={"seeds": seeds, "env_steps": steps}, repeats=1,
            profile=p.profile,
            extra={"impl": impl, "stages": dict(whole),
                   "parts": {k: dict(v) for k, v in st.items() if k != "whole"},
                   "fresh_process": True, "config": cfg, "options": dict(options)}))
    return out


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``rl_purejaxrl`` section. ``ours``: option sets of
    :data:`SPEED_OPTIONS`; ``runs``: timed runs per (seed count, option set), each a cell of
    its own (run k > 1: ``<cell>_run<k>``, a confirming run kept beside the first);
    ``first_result``: also time each program's first result in a fresh process
    (:func:`first_result`); ``compile_stages``: one more cell per (seed count, option set)
    that times where each program's compile goes (:func:`compile_stages`); ``purejaxrl``: the checkout (``repro record rl_purejaxrl
    --purejaxrl DIR``)."""

    total_timesteps: int = positive()
    seeds: tuple[int, ...] = positive()
    recipe: str = recipe_names("tf32")
    repeats: int = positive(3)
    ours: tuple[dict[str, Any] | None, ...] = ({},)
    runs: int = positive(1)
    first_result: bool = True
    compile_stages: bool = False
    purejaxrl: str | None = from_cli()


def _config(p: Params) -> dict[str, Any]:
    return {**CARTPOLE, "TOTAL_TIMESTEPS": p.total_timesteps}


def check(p: Params) -> None:
    """Every option set, then the checkout's ``purejaxrl/ppo.py``: before anything loads."""
    for o in p.ours:
        ours_config(_config(p), p.recipe, o)
    if p.purejaxrl is not None:
        checkout_dir(p.purejaxrl)


def _records(p: Params, notes: list[str], seeds: int, name: str, samples, facts,
             options: Mapping[str, Any], run: int,
             first: Mapping[str, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """PureJaxRL's record and ours, of one timed comparison, and where ``first`` holds them
    (``{impl: first_result(...)}``), each one's ``first_result_s`` record."""
    cfg, steps = _config(p), env_steps(_config(p), seeds)

    def rec(impl):
        s = samples[impl]
        q1, med, q3 = np.percentile(steps / np.asarray(s), [25, 50, 75])
        theirs = impl == "purejaxrl"
        extra = {"impl": impl, "run_s": [round(x, 5) for x in s], "config": cfg,
                 "adapters": notes if theirs else [], "timed_with": list(samples),
                 "source": URL if theirs else "repro.models.ppo",
                 "final_return": _summary(facts[impl].get("final_returns"))}
        if not theirs:
            extra["options"] = dict(options)
            extra["returns_digest"] = facts[impl].get("returns_digest")
        extra["run"] = run
        return results.make_record(
            EXPERIMENT, "env_steps_per_s", float(med), "steps/s", claims=["A2"],
            recipe=p.recipe, sizes={"seeds": seeds, "env_steps": steps}, repeats=len(s),
            spread=float(q3 - q1), profile=p.profile, extra=extra)

    out = [rec("purejaxrl"), rec(name)]
    for impl, fr in (first or {}).items():
        out.append(results.make_record(
            EXPERIMENT, "first_result_s", fr["first_result_s"], "s", claims=["A2"],
            recipe=p.recipe, sizes={"seeds": seeds, "env_steps": steps}, repeats=1,
            profile=p.profile,
            extra={"impl": impl, "compile_s": fr["compile_s"], "process_s": fr["process_s"],
                   "fresh_process": True, "config": cfg, "run": run,
                   **({} if impl == "purejaxrl" else {"options": dict(options)})}))
    return out


def program(seeds: int, total_timesteps: int, recipe: str = "tf32",
            options: Mapping[str, Any] | None = None, stages: bool = False):
    """What a cell's records measure (:mod:`repro.program`), from the cell's settings alone:
    OUR program of the cell, ``jax.vmap(ppo.make_train(...))`` over ``seeds`` keys for
    PureJaxRL's CartPole config (``total_timesteps``) in ``recipe`` with the option set
    ``options``. PureJaxRL's own program lives in its checkout and is not traced; its records
    (the same recipe, so the same key) carry this program too: the cell is re-recorded as a
    whole when ours changes. The kit: the timing and the statistics, and the adapters through
    which PureJaxRL's ``ppo.py`` runs here (:func:`load`, :class:`FiveTupleStep`,
    :func:`distrax_stand_in`): an edit to them changes what PureJaxRL's records measured.
    ``stages``: the program of a ``_stages`` cell, whose kit compiles it
    (:func:`compile_stages`) instead of timing it."""
    from repro.program import Program

    c = ours_config({**CARTPOLE, "TOTAL_TIMESTEPS": total_timesteps}, recipe, options)
    keys = jax.eval_shape(lambda: _keys(seeds))
    if stages:
        return Program(jax.vmap(ppo.make_train(c)), (keys,),
                       kit=(compile_stages, _compile_stages_main, stage_times, ours_parts,
                            _stages_records, fresh_env, load, FiveTupleStep, distrax_stand_in))
    return Program(jax.vmap(ppo.make_train(c)), (keys,),
                   kit=(compare, _warm, compile_theirs, env_steps, final_returns, returns_digest,
                        first_result, _first_result_main, fresh_env, load, FiveTupleStep,
                        distrax_stand_in))


_OPTION = re.compile(
    r"_(epoch_unroll|update_unroll|unroll|prng)-(unsafe_rbg|rbg|threefry|philox4x32|\d+)")


def _options_of(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The option set of a record's cell: its ``extra.options`` (ours), the one label of ours
    in ``extra.timed_with``, else its cell's name (``rec["program"]["cell"]``); None if none
    says it. Records made before option sets existed hold none: the defaults, ``{}``."""
    extra = rec.get("extra") or {}
    if isinstance(extra.get("options"), dict):
        return dict(extra["options"])
    ours = [t for t in extra.get("timed_with") or [] if t != "purejaxrl"]
    if len(ours) == 1:
        m = re.fullmatch(r"repro(?:\[(.*)\])?", ours[0])
        if m:
            pairs = [kv.split("=", 1) for kv in (m.group(1) or "").split(",") if kv]
            return {k: int(v) if v.isdigit() else v for k, v in pairs}
    cell = (rec.get("program") or {}).get("cell") if isinstance(rec.get("program"),
                                                                   dict) else None
    if isinstance(cell, str):
        rest = re.sub(r"_run\d+$", "", cell)
        m = re.fullmatch(r".+?_s\d+((?:_.+)?)", rest)
        if m:
            found = list(_OPTION.finditer(m.group(1)))
            if "".join(f.group(0) for f in found) == m.group(1):
                return {f.group(1): int(f.group(2)) if f.group(2).isdigit() else f.group(2)
                        for f in found}
    return None


def program_settings(rec: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`program`'s settings for a record of this study (None: not derivable): its seed
    count, recipe, PureJaxRL config (only CartPole's with another TOTAL_TIMESTEPS is ours to
    trace) and option set (:func:`_options_of`)."""
    sizes, extra = rec.get("sizes") or {}, rec.get("extra") or {}
    cfg = extra.get("config")
    if not isinstance(cfg, dict) or not isinstance(sizes.get("seeds"), int):
        return None
    if {k: v for k, v in cfg.items() if k != "TOTAL_TIMESTEPS"} != \
            {k: v for k, v in CARTPOLE.items() if k != "TOTAL_TIMESTEPS"}:
        return None
    options = _options_of(rec)
    if options is None:
        return None
    return {"seeds": sizes["seeds"], "total_timesteps": int(cfg["TOTAL_TIMESTEPS"]),
            "recipe": rec.get("recipe") or "tf32", "options": options,
            **({"stages": True} if rec.get("metric") == "compile_stages_s" else {})}


def cells(p: Params) -> list[Cell]:
    """One cell per (seed count, option set, run), seed counts in params order. PureJaxRL is
    loaded at the first cell and compiled once per seed count, then timed again beside
    every option set. With ``compile_stages``, then one ``_stages`` cell per (seed count,
    option set)."""
    cache: dict[str, Any] = {}

    def theirs(seeds: int):
        if "module" not in cache:
            cache["module"], cache["notes"] = load(p.purejaxrl)
            if jax.default_backend() == "cpu" and max(p.seeds) > 1:
                print(f"{EXPERIMENT}: warning: on XLA:CPU (jax 0.10.2) PureJaxRL's program "
                      "with 2 or more vmapped seeds has hung in its second or third run (idle "
                      "in block_until_ready); time several seeds on a GPU", file=sys.stderr)
        if cache.get("seeds") != seeds:  # one seed count's program at a time
            cache.pop("theirs", None)
            cache["theirs"] = compile_theirs(cache["module"], _config(p), seeds)
            cache["seeds"] = seeds
        return cache["theirs"]

    def one(seeds, o, run):
        def go(_budget):
            name, samples, facts = compare(theirs(seeds), _config(p), seeds, p.repeats,
                                           p.recipe, o)
            first = None
            if p.first_result:
                first = {"purejaxrl": first_result("purejaxrl", _config(p), seeds, p.recipe,
                                                   purejaxrl=p.purejaxrl),
                         name: first_result(name, _config(p), seeds, p.recipe, o)}
            return _records(p, cache["notes"], seeds, name, samples, facts, o, run, first)
        return go

    def programs(seeds, o, stages=False):
        return lambda: {"": program(seeds, p.total_timesteps, p.recipe, o, stages)}

    def stages(seeds, o):
        def go(_budget):
            st = {"purejaxrl": compile_stages("purejaxrl", _config(p), seeds, p.recipe,
                                              purejaxrl=p.purejaxrl),
                  label(o): compile_stages(label(o), _config(p), seeds, p.recipe, o)}
            return _stages_records(p, seeds, o, st)
        return go

    sets = [dict(o or {}) for o in p.ours]
    out = [Cell(cell_name(_config(p), seeds, o) + (f"_run{k}" if k > 1 else ""),
                one(seeds, o, k), (p.recipe,), programs=programs(seeds, o))
           for seeds in p.seeds for o in sets for k in range(1, p.runs + 1)]
    if p.compile_stages:  # after every timed cell: where each program's compile goes
        out += [Cell(cell_name(_config(p), seeds, o) + "_stages", stages(seeds, o),
                     (p.recipe,), programs=programs(seeds, o, True))
                for seeds in p.seeds for o in sets]
    return out


STUDY = Study(EXPERIMENT, ("A2",), cells, check, about="our PPO against PureJaxRL's ppo.py",
              params=Params, requires=("purejaxrl",))


if __name__ == "__main__":  # the fresh process of first_result() or compile_stages()
    _job = json.loads(sys.argv[1])
    _main = _compile_stages_main if _job.get("stages") else _first_result_main
    print(json.dumps(_main(_job)), flush=True)
