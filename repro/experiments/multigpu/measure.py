"""Multi-device scaling (claim B5): PPO and LM throughput on 1, 2, 4, 8 devices, BF16 and FP8.

    repro record multigpu --profile full      # on a machine with 2, 4 or 8 GPUs

For every device count ``n`` of ``params.yaml``'s ``device_counts`` that divides
``jax.device_count()`` (1, 2, 4, 8 on an 8-GPU machine), every workload and every recipe, one
resumable cell ``<workload>_<recipe>_n<n>`` on a sub-mesh of the first ``n`` devices:

* ``ppo``: the whole data-parallel PPO loop (``repro.models.ppo.make_train(config, mesh)``:
  rollouts, GAE, minibatch updates with the gradient all-reduce), ``envs_per_device * n``
  environments; metric ``env_steps_per_s``.
* ``lm_dp`` / ``lm_fsdp``: the decoder LM's training step (``repro.models.lm_train``), batch
  ``batch_per_device * n`` sequences; parameters replicated (``lm_dp``, mesh ``("data",)``)
  or split over all ``n`` devices (``lm_fsdp``, mesh ``("data", "fsdp") = (1, n)``); metric
  ``tokens_per_s``.

This is WEAK scaling (fixed work per device), so perfect scaling is ``throughput_n = n *
throughput_1``: the scaling efficiency is ``throughput_n / (n * throughput_1)``. A ``summary``
cell (rewritten on every call, from this hardware's cells) holds ``scaling_efficiency`` per
(workload, recipe, n) and ``fp8_speedup`` (FP8 over BF16 throughput) per (workload, n).

Every record carries ``emulated`` (``repro.studies.lowering.recipe_emulated``: no tensor cores
for the format, or an FP8 recipe on a GPU whose compiled program ran no FP8 GEMM) and
``extra.n_devices``, ``extra.mesh``, the collectives in the compiled program
(``extra.collectives``: all-reduce, all-gather, reduce-scatter, ...) and
``extra.simulated_devices``: True on the CPU backend, where the "devices"
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``) share one host's cores, so a CPU run
checks that the sharded programs run, never how they scale.

The study runs in ONE process on one machine (sub-meshes of its first ``n`` devices); the
pieces it times (``repro.models.sharding``, ``repro.models.ppo``, ``repro.models.lm_train``)
also run multi-host after ``repro.models.sharding.initialize_from_env()``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro import hardware, results
from repro.config import ConfigError, Section, positive, recipe_names
from repro.models import sharding as distributed
from repro.precision import resolve
from repro.program import Program
from repro.studies.runner import Cell, Study
from repro.studies.lowering import FP8_GEMM_TARGET, fp8_lowering, recipe_emulated

EXPERIMENT = "multigpu"

CLAIMS = ["B5"]

WORKLOADS = ("ppo", "lm_dp", "lm_fsdp")

METRIC = {"ppo": ("env_steps_per_s", "steps/s"), "lm_dp": ("tokens_per_s", "tokens/s"),
          "lm_fsdp": ("tokens_per_s", "tokens/s")}

BASELINE = "bf16"

EFFICIENCY_TARGET = 0.8  # B5 rule: weak-scaling efficiency at the largest count (notebook 08)

_COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|"
                         r"collective-permute)(?:-start)?\(")


def device_counts(requested: Sequence[int] = (1, 2, 4, 8), available: int | None = None
                  ) -> list[int]:
    """The requested counts that divide the number of devices (all of them by default)."""
    avail = jax.device_count() if available is None else int(available)
    return [int(n) for n in requested if 1 <= int(n) <= avail and avail % int(n) == 0]


def collectives(hlo_text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in _COLLECTIVE.finditer(hlo_text or ""):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def _emulated(recipe: str, hlo_text: str) -> bool:
    return recipe_emulated(recipe, fp8_lowering(hlo_text or ""))


def _time(fn, *args, repeats: int):
    from repro.studies.timing import time_fn

    return time_fn(fn, *args, repeats=repeats, warmup=1)


def ppo_cell(recipe: str, n: int, p: Params) -> dict[str, Any]:
    """Time the data-parallel PPO loop on the first ``n`` devices."""
    from repro.models import ppo

    q = dict(p.ppo)
    num_envs = int(q.pop("envs_per_device")) * n
    updates = int(q.pop("updates", 1))
    cfg = ppo.validate(dict(q, recipe=recipe, num_envs=num_envs,
                            total_timesteps=num_envs * int(q["num_steps"]) * updates,
                            anneal_lr=False))
    mesh = distributed.make_mesh(n)
    key = jax.random.key(0)
    t0 = time.perf_counter()
    compiled = jax.jit(ppo.make_train(cfg, mesh)).lower(key).compile()
    compile_s = time.perf_counter() - t0
    t = _time(compiled, key, repeats=p.repeats)
    work = cfg.num_updates * cfg.batch_size
    sizes = {"workload": "ppo", "n_devices": n, "env": cfg.env, "network": cfg.network,
             "width": cfg.width, "num_envs": num_envs, "envs_per_device": num_envs // n,
             "num_steps": cfg.num_steps, "batch": cfg.batch_size}
    return dict(sizes=sizes, work=work, timing=t, compile_s=compile_s,
                text=compiled.as_text() or "", mesh=dict(mesh.shape))


def lm_cell(workload: str, recipe: str, n: int, p: Params) -> dict[str, Any]:
    """Time ``steps`` LM training steps (per sample) on the first ``n`` devices."""
    from repro.models import lm as M
    from repro.models import lm_train as T

    q = p.lm
    fsdp = workload == "lm_fsdp"
    cfg = M.get_config(q["size"], **dict(q.get("model", {})))
    batch = int(q["batch_per_device"]) * n
    steps = int(q.get("steps", 5))
    tc = T.TrainConfig(steps=1000, batch_size=batch, warmup_steps=10)
    mesh = distributed.make_mesh(n, fsdp=fsdp)
    on_gpu = hardware.platform() == "gpu"
    init, step, _ = T._sharded_functions(cfg, resolve(recipe), T._static_key(tc),
                                         on_gpu, mesh, fsdp)
    variables, opt_state = init(jnp.int32(0), jnp.zeros((1, cfg.seq_len), jnp.int32))
    rng = np.random.default_rng(0)
    put = T._batch_putter(mesh)
    x = put(rng.integers(0, cfg.vocab_size, (batch, cfg.seq_len), dtype=np.int32))
    y = put(rng.integers(0, cfg.vocab_size, (batch, cfg.seq_len), dtype=np.int32))
    t0 = time.perf_counter()
    compiled = step.lower(variables, opt_state, x, y, jnp.int32(0), jnp.int32(0)).compile()
    compile_s = time.perf_counter() - t0
    state = [variables, opt_state, 0]

    def run():
        v, o, i = state
        loss = None
        for _ in range(steps):
            v, o, loss = compiled(v, o, x, y, jnp.int32(0), jnp.int32(i))
            i += 1
        state[:] = [v, o, i]
        return loss

    t = _time(run, repeats=p.repeats)
    sizes = {"workload": workload, "n_devices": n, "model": cfg.name,
             "params": M.param_count(cfg), "batch": batch,
             "batch_per_device": batch // n, "seq_len": cfg.seq_len, "steps_per_sample": steps}
    return dict(sizes=sizes, work=steps * batch * cfg.seq_len, timing=t, compile_s=compile_s,
                text=compiled.as_text() or "", mesh=dict(mesh.shape))


def run_cell(workload: str, recipe: str, n: int, p: Params) -> list[dict[str, Any]]:
    out = ppo_cell(recipe, n, p) if workload == "ppo" else lm_cell(workload, recipe, n, p)
    t = out["timing"]
    rates = out["work"] / np.asarray(t.samples)
    q1, q3 = np.percentile(rates, [25, 75])
    metric, unit = METRIC[workload]
    devs = jax.devices()[:n]
    extra = {"n_devices": n, "device_count_total": jax.device_count(),
             "process_count": jax.process_count(),
             "simulated_devices": distributed.is_simulated(devs),
             "device_kind": devs[0].device_kind, "mesh": out["mesh"],
             "collectives": collectives(out["text"]),
             "fp8_gemm_calls": out["text"].count(FP8_GEMM_TARGET),
             "compile_s": out["compile_s"], "time_s": t.median_s,
             "samples_s": list(t.samples), "work_per_sample": out["work"]}
    return [results.make_record(
        EXPERIMENT, metric, out["work"] / t.median_s, unit, claims=CLAIMS, recipe=recipe,
        sizes=out["sizes"], repeats=len(t.samples), spread=float(q3 - q1),
        emulated=_emulated(recipe, out["text"]), profile=p.profile, extra=extra)]


def program(workload: str, recipe: str, n: int, ppo: dict | None = None,
            lm: dict | None = None) -> Program:
    """What the record of cell ``<workload>_<recipe>_n<n>`` measures, traced on abstract
    arguments over an abstract mesh of ``n`` devices (``jax.sharding.AbstractMesh``, the axes
    and shape :func:`repro.models.sharding.make_mesh` gives ``n`` devices, no device needed):
    ``ppo`` (params.yaml's ``ppo`` settings): the data-parallel PPO loop ``ppo_cell`` times,
    on its PRNG key; ``lm_dp`` / ``lm_fsdp`` (``lm`` settings): the sharded LM training step
    ``lm_cell`` times, on abstract state, batch, seed and step; the kit: the timing loop
    (``_time``, and the cell's function that drives it)."""
    from jax.sharding import AbstractMesh, AxisType

    from repro.models import sharding as Sh
    from repro.studies.timing import time_fn

    fsdp = workload == "lm_fsdp"
    names = (Sh.DATA, Sh.FSDP) if fsdp else (Sh.DATA,)
    mesh = AbstractMesh((1, n) if fsdp else (n,), names,
                        axis_types=(AxisType.Auto,) * len(names))
    kit = (_time, time_fn)
    if workload == "ppo":
        from repro.models import ppo as PPO

        q = dict(ppo or {})
        num_envs = int(q.pop("envs_per_device")) * n
        updates = int(q.pop("updates", 1))
        cfg = PPO.validate(dict(q, recipe=recipe, num_envs=num_envs,
                                total_timesteps=num_envs * int(q["num_steps"]) * updates,
                                anneal_lr=False))
        key = jax.eval_shape(lambda: jax.random.key(0))
        return Program(PPO.make_train(cfg, mesh), (key,), kit=kit + (ppo_cell,))
    from repro.models import lm as M
    from repro.models import lm_train as T

    q = dict(lm or {})
    cfg = M.get_config(q["size"], **dict(q.get("model", {})))
    batch = int(q["batch_per_device"]) * n
    tc = T.TrainConfig(steps=1000, batch_size=batch, warmup_steps=10)
    init, step, _ = T._sharded_functions.__wrapped__(cfg, resolve(recipe), T._static_key(tc),
                                                     False, mesh, fsdp)
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    variables, opt_state = jax.eval_shape(init, i32,
                                          jax.ShapeDtypeStruct((1, cfg.seq_len), jnp.int32))
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq_len), jnp.int32)
    return Program(step, (variables, opt_state, tokens, tokens, i32, i32),
                   kit=kit + (lm_cell,))


def program_settings(rec: dict) -> dict | None:
    """:func:`program`'s settings of a record: workload, recipe and device count from the
    record; the workload's settings from params.yaml's ``multigpu`` section of the record's
    profile, where they agree with the record's sizes (None otherwise)."""
    from repro import studies

    sizes = rec.get("sizes") or {}
    workload, recipe, n = sizes.get("workload"), rec.get("recipe"), sizes.get("n_devices")
    if workload not in WORKLOADS or not recipe or not n:
        return None
    try:
        p = studies.params(EXPERIMENT, str(rec.get("profile") or "full"))
    except Exception:  # noqa: BLE001 - no such profile: not derivable
        return None
    n = int(n)
    if workload == "ppo":
        q = dict(p.ppo)
        want = {"env": q.get("env"), "network": q.get("network"), "width": q.get("width"),
                "num_steps": q.get("num_steps"), "envs_per_device": q.get("envs_per_device")}
        if any(k in sizes and sizes[k] != v for k, v in want.items()):
            return None
        return {"workload": workload, "recipe": recipe, "n": n, "ppo": q}
    q = dict(p.lm)
    if sizes.get("model") != q.get("size") or sizes.get("batch_per_device") != q.get(
            "batch_per_device"):
        return None
    return {"workload": workload, "recipe": recipe, "n": n, "lm": q}


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``multigpu`` section. ``ppo``: PPOConfig fields plus
    ``envs_per_device`` and ``updates``; ``lm``: ``size``, ``batch_per_device``, ``steps``
    (per timed sample) and optional ``model`` overrides."""

    workloads: tuple[str, ...]
    recipes: tuple[str, ...] = recipe_names()
    device_counts: tuple[int, ...] = positive((1, 2, 4, 8))
    ppo: dict[str, Any]
    lm: dict[str, Any]
    repeats: int = positive()


def check(p: Params) -> None:
    for w in p.workloads:
        if w not in WORKLOADS:
            raise ConfigError(f"params.yaml: multigpu.{p.profile}.workloads: unknown workload "
                              f"{w!r}; valid: {', '.join(WORKLOADS)}")


def cells(p: Params, n_available: int | None = None) -> list[Cell]:
    """One cell per (workload, recipe, n): device counts ascending, BF16 first within one."""
    def one(w, r, n):
        return lambda _budget: run_cell(w, r, n, p)

    def programs(w, r, n):
        return lambda: {r: program(w, r, n, dict(p.ppo), dict(p.lm))}

    return [Cell(f"{w}_{r}_n{n}", one(w, r, n), (r,), programs=programs(w, r, n))
            for n in device_counts(p.device_counts, n_available)
            for w in p.workloads for r in p.recipes]


STUDY = Study(EXPERIMENT, tuple(CLAIMS), cells, check,
              about="weak scaling of PPO and the LM over 1-8 devices", params=Params)
