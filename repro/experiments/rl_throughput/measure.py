"""RL throughput per precision recipe (claims A1, A2, A4, A9; C1 on a TPU).

    repro record rl_throughput --profile full     # one resumable cell per (network, width,
                                                  # recipe, num_envs)
    repro record rl_throughput --profile full --recipe bf16,fp8-delayed --only 'mlp_w4096_*'
    repro record rl_throughput --profile full --recipe int8,fp32 --only '*_paired*'
                                                  # mlp_w4096_e2048_paired_bf16-int8-fp32 ...

Sizes come from ``params.yaml`` (section ``rl_throughput``, :class:`Params`); ``--recipe`` and
``--only`` restrict a run to some cells, so a long study can be split into commands that each
fit a time limit, and a stopped run resumes at the first missing cell. Per cell:

* ``env_steps_per_s`` -- the whole PPO loop (``ppo.make_train``: rollouts, GAE, 4 epochs of
  minibatch updates) for ``updates`` updates, ONE seed (no ``vmap``: a vmapped FP8 GEMM is a
  batched GEMM, which is not what an RL user runs), median of ``repeats`` timed calls after a
  compiling warm-up (``repro.studies.timing.time_fn``).
* ``update_time_ms`` -- one PPO update alone (``ppo.make_update_step``) on a synthetic rollout
  of the same size: the part of the loop whose GEMMs FP8 can speed up.
* ``update_memory_bytes`` -- the compiled update's buffers (arguments + outputs + temporaries
  - aliased), from XLA's ``memory_analysis()`` (every backend). Where the device reports
  ``memory_stats()`` the process peak is kept in ``extra`` too (it is cumulative over the
  process, so it is not a per-recipe number).
* ``extra.fp8_gemm_calls`` / ``extra.fp8_lowering`` -- cuBLASLt FP8 GEMM calls in the compiled
  update and how its f8 products lowered (``repro.studies.lowering.fp8_lowering``: small GEMMs
  get XLA's Triton GEMM with f8 operands, also FP8 tensor-core math); an FP8 recipe on a GPU
  whose program ran no FP8 GEMM is marked ``emulated`` (``repro.studies.lowering.recipe_emulated``;
  an INT8 recipe's records carry ``extra.int8_lowering``, ``s8-gemm`` where its products ran
  ``s8 x s8 -> s32``, and ``extra.int8_products``, how many did and how many were widened).
* a ``stores`` cell: which stores are FP8 under each recipe / variant (claim A1), and the bytes
  per weight.

Cells of one (network, width, num_envs) are compared with each other: the runner notes when
a call would time some of them beside cells an earlier call recorded (a cross-call ratio,
which notebook 03 leaves out of A2/A9).

A *paired* cell (``paired_widths`` x ``num_envs``, the MLP, ``paired_recipes``) compiles every
recipe first and then times them in rounds (``repro.studies.timing.time_rounds``: each
recipe's whole loop, then each one's update, ``repeats`` rounds): its records carry the samples
in round order, one ``run_id`` and ``timing: "paired"``, so a ratio of two recipes is the median
of per-round ratios with its range (``repro.analysis.rl.paired_speedups``), not a ratio of
medians of separate runs. A *variant* cell (``mlp_w<W>_e<N>_variants``: ``variant_widths`` x
``variant_envs``) is a paired cell of ``variant_recipes`` (candidate recipes with the recipes
they are compared with), apart from the paired cells, so that a candidate is timed in rounds
beside its reference without redoing those.
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro import results
from repro.config import Section, from_cli, positive, recipe_names
from repro.models import ppo
from repro.precision import optim
from repro.precision.recipes import REGISTRY, resolve, value_formats
from repro.studies import lowering
from repro.studies.runner import Cell, Study
from repro.studies.lowering import compiled_facts, recipe_emulated
from repro.studies.timing import time_fn, time_rounds

THROUGHPUT = "rl_throughput"

A1_STORES = ("params (stored)", "activations (GEMM operand)", "gradients (GEMM operand)",
             "optimizer update arithmetic")


def stores_names(recipes: Sequence[str]) -> list[str]:
    """The study's recipes, then every registry entry that is an arm of claim A1 or of the RL
    quality claims (A5-A10), each once."""
    rl_claims = {"A1", "A5", "A6", "A7", "A8", "A10"}
    extra = [n for n, r in REGISTRY.items() if set(r.claims) & rl_claims]
    return list(dict.fromkeys([*recipes, *extra]))


def stores_records(profile: str, names: Sequence[str]) -> list[dict[str, Any]]:
    """One record per recipe: how many of A1's four stores are FP8 (from the registry)."""
    recs = []
    for name in names:
        r = resolve(name)
        pol = value_formats(r)
        n = sum(pol[k].startswith("fp8") for k in A1_STORES)
        recs.append(results.make_record(
            THROUGHPUT, "fp8_stores", n, f"of {len(A1_STORES)}", claims=["A1"],
            recipe=r.family, sizes={"variant": name}, profile=profile,
            extra={"variant": name, "policy": pol, "a1_stores": list(A1_STORES),
                   "bytes_per_weight_format": optim.storage_bytes(r.master_weights),
                   "bytes_per_weight_container": int(np.dtype(optim.container_dtype(
                       r.master_weights)).itemsize)}))
    return recs


def _time_fn(fn, *args, repeats: int, warmup: int = 1):
    """(median s, IQR s, samples) of ``repro.studies.timing.time_fn``."""
    t = time_fn(fn, *args, repeats=repeats, warmup=warmup)
    return t.median_s, t.iqr_s, list(t.samples)


def _device_peak_bytes() -> int | None:
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:
        return None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def synthetic_rollout(c: ppo.PPOConfig, env, env_params, key):
    """A rollout-shaped batch for timing the update alone: real reset observations, random
    actions, advantages and targets (the values do not change the update's cost)."""
    ko, ka, kv = jax.random.split(key, 3)
    obs, _ = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(ko, c.batch_size), env_params)
    obs = obs.reshape(c.num_steps, c.num_envs, *obs.shape[1:])
    n_act = env.action_space(env_params).n
    shape = (c.num_steps, c.num_envs)
    action = jax.random.randint(ka, shape, 0, n_act)
    kv1, kv2, kv3 = jax.random.split(kv, 3)
    traj = ppo.Transition(obs=obs, action=action,
                          log_prob=jnp.full(shape, -np.log(n_act), jnp.float32),
                          value=jax.random.normal(kv1, shape), reward=jnp.zeros(shape),
                          done=jnp.zeros(shape, bool))
    return traj, jax.random.normal(kv2, shape), jax.random.normal(kv3, shape)


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``rl_throughput`` section. ``networks``: network -> the gymnax env that
    drives it; ``widths`` apply to the MLP (CNNs have ``cnn_width``); ``updates`` PPO updates
    per timed call of the whole loop, median of ``repeats`` calls. ``paired_recipes`` are
    timed together in rounds in one cell per MLP width of ``paired_widths`` and ``num_envs``
    (``repeats`` rounds); ``variant_recipes`` likewise, in one cell per width of
    ``variant_widths`` and ``variant_envs`` (default: ``num_envs``). ``selected``:
    ``--recipe``, the recipes of the per-recipe cells; the paired cells of ``paired_recipes``
    where it names one of them, and where it names others, paired cells of its own recipes
    (bf16 first: ``mlp_w4096_e2048_paired_bf16-int8``), which never mask those of
    ``paired_recipes``."""

    recipes: tuple[str, ...] = recipe_names()
    networks: dict[str, str]
    widths: tuple[int, ...] = positive()
    num_envs: tuple[int, ...] = positive()
    num_steps: int = positive()
    updates: int = positive()
    repeats: int = positive()
    depth: int = positive(2)
    update_epochs: int = positive(4)
    num_minibatches: int = positive(4)
    cnn_width: int = 0
    paired_recipes: tuple[str, ...] = recipe_names(())
    paired_widths: tuple[int, ...] = ()
    variant_recipes: tuple[str, ...] = recipe_names(())
    variant_widths: tuple[int, ...] = ()
    variant_envs: tuple[int, ...] | None = positive(None)
    selected: tuple[str, ...] | None = from_cli()


def narrow(p: Params, recipes) -> Params:
    """``--recipe``: only the named recipes (each must resolve, and be one the PPO networks
    take: this repository's layers, not a peer library's); see :class:`Params`."""
    for r in recipes:
        backend = resolve(r).backend  # a one-line error naming the valid recipes
        if backend != "repro":
            raise ValueError(f"rl_throughput: --recipe {r} runs on the {backend} backend, "
                             "which the PPO networks do not take; recipes of its cells: "
                             f"{', '.join(p.recipes)}")
    return replace(p, selected=tuple(dict.fromkeys(recipes)))


def throughput_config(network: str, width: int, recipe: str, num_envs: int,
                      p: Params) -> ppo.PPOConfig:
    """The PPO configuration a throughput cell times (``recipe``: a registry name, an RL
    variant such as ``fp8-all-layers`` included)."""
    return ppo.validate(dict(
        recipe=recipe, env=p.networks[network], network=network, width=width, depth=p.depth,
        num_envs=num_envs, num_steps=p.num_steps,
        total_timesteps=num_envs * p.num_steps * p.updates,
        update_epochs=p.update_epochs, num_minibatches=p.num_minibatches, anneal_lr=False))


def update_step(c: ppo.PPOConfig) -> tuple[Any, tuple]:
    """PPO's update step alone for ``c``, jitted, and its arguments (a synthetic rollout)."""
    env, env_params = ppo.make_env(c.env)
    net = ppo.build_network(c, env, env_params)
    tx = ppo.make_optimizer(c)
    variables, opt_state = ppo.init_state(c, net, env, env_params, tx, jax.random.key(1))
    traj, adv, tgt = synthetic_rollout(c, env, env_params, jax.random.key(2))
    return (jax.jit(ppo.make_update_step(c, net, tx)),
            (variables, opt_state, traj, adv, tgt, jax.random.key(3)))


def update_program(c: ppo.PPOConfig) -> tuple[Any, tuple, float]:
    """:func:`update_step` compiled: (compiled, its arguments, compile seconds). What a
    throughput cell times and ``repro.experiments.kernel_times.measure ppo`` traces."""
    update, args = update_step(c)
    t0 = time.perf_counter()
    compiled = update.lower(*args).compile()
    return compiled, args, time.perf_counter() - t0


def _compiled(network: str, width: int, recipe: str, num_envs: int, p: Params):
    """A cell's two timed programs compiled: (config, whole loop, its key, update, its
    arguments, the compile seconds of each)."""
    c = throughput_config(network, width, recipe, num_envs, p)
    train = jax.jit(ppo.make_train(c))
    key = jax.random.key(0)
    t0 = time.perf_counter()
    compiled_train = train.lower(key).compile()
    compile_e2e = time.perf_counter() - t0
    compiled_update, args, compile_upd = update_program(c)
    return c, compiled_train, key, compiled_update, args, compile_e2e, compile_upd


def _records(c: ppo.PPOConfig, network: str, width: int, recipe: str, p: Params,
             compiled_update,
             samples: Sequence[float], usamples: Sequence[float], compile_e2e: float,
             compile_upd: float, more: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A cell's records of one recipe from its timed samples (seconds; the whole loop's and
    the update's), in the order they were taken."""
    from repro import hardware

    info = hardware.detect()
    steps = c.num_updates * c.batch_size
    med, (uq1, umed, uq3) = float(np.median(samples)), np.percentile(usamples, [25, 50, 75])
    r = c.resolved_recipe
    facts = compiled_facts(compiled_update)
    facts.update(lowering.int8_facts(r, compiled_update))
    fp8_calls, mem = facts["fp8_gemm_calls"], facts["memory_bytes"]
    # an FP8 CNN's backward convolutions are emulated through BF16 (repro.precision.ops.
    # fp8_conv): the cell's speed is not FP8's even where its GEMMs and forward convolutions
    # are native
    conv_emulated = network != "mlp" and r.gemm == "fp8"
    emulated = recipe_emulated(r, facts, info) or conv_emulated
    sizes = {"network": network, "width": width, "depth": c.depth, "num_envs": c.num_envs,
             "num_steps": c.num_steps, "env": c.env, "batch": c.batch_size,
             "minibatch": c.minibatch_size, "update_epochs": c.update_epochs}
    extra = {"fp8_gemm_calls": fp8_calls, "fp8_lowering": facts["fp8_lowering"],
             "compile_e2e_s": compile_e2e,
             "compile_update_s": compile_upd, "updates_per_call": c.num_updates,
             "scope": r.scope, "device_peak_bytes": _device_peak_bytes(),
             "device_peak_note": "cumulative over the process, not per recipe",
             "conv_backward": "bf16 emulation of FP8" if conv_emulated else None,
             **{k: facts[k] for k in ("int8_lowering", "int8_products") if k in facts},
             **(more or {})}
    common = dict(claims=["A2", "A9"], recipe=recipe, sizes=sizes, repeats=len(samples),
                  emulated=emulated, profile=p.profile)
    s = steps / np.asarray(samples)
    q1, q3 = np.percentile(s, [25, 75])
    recs = [
        results.make_record(THROUGHPUT, "env_steps_per_s", steps / med, "steps/s",
                            spread=float(q3 - q1),
                            extra={**extra, "samples_s": list(map(float, samples)),
                                   "time_s": med}, **common),
        results.make_record(THROUGHPUT, "update_time_ms", umed * 1e3, "ms",
                            spread=float(uq3 - uq1) * 1e3,
                            extra={**extra, "samples_ms": [x * 1e3 for x in usamples]},
                            **common),
    ]
    if mem is not None:
        recs.append(results.make_record(THROUGHPUT, "update_memory_bytes", mem, "bytes",
                                        extra=extra, **{**common, "claims": ["A1", "A4"]}))
    return recs


def throughput_cell(network: str, width: int, recipe: str, num_envs: int,
                    p: Params) -> list[dict[str, Any]]:
    """Time the whole PPO loop and the update alone for one configuration."""
    c, train, key, update, args, compile_e2e, compile_upd = _compiled(network, width, recipe,
                                                                      num_envs, p)
    _, _, samples = _time_fn(train, key, repeats=p.repeats)  # the whole loop, one seed
    _, _, usamples = _time_fn(update, *args, repeats=p.repeats)  # the update alone
    return _records(c, network, width, recipe, p, update, samples, usamples, compile_e2e,
                    compile_upd)


def paired_cell(network: str, width: int, recipes: Sequence[str], num_envs: int,
                p: Params) -> list[dict[str, Any]]:
    """Every recipe of ``recipes`` at one configuration, compiled first, then timed in
    ``p.repeats`` rounds (:func:`repro.studies.timing.time_rounds`; per round each recipe's
    whole loop, then each one's update): :func:`throughput_cell`'s records per recipe, with
    the samples in round order, ``timing: "paired"``, the recipes timed together and the
    cell's ``run_id``."""
    built = {r: _compiled(network, width, r, num_envs, p) for r in recipes}
    calls = {f"{r}/loop": functools.partial(b[1], b[2]) for r, b in built.items()}
    calls.update({f"{r}/update": functools.partial(b[3], *b[4]) for r, b in built.items()})
    samples = time_rounds(calls, p.repeats)
    more = {"timing": "paired", "run_id": uuid.uuid4().hex[:12], "paired_with": list(recipes)}
    recs = []
    for r, (c, _, _, update, _, compile_e2e, compile_upd) in built.items():
        recs += _records(c, network, width, r, p, update, samples[f"{r}/loop"],
                         samples[f"{r}/update"], compile_e2e, compile_upd, more)
    return recs


def program(network: str | None = None, width: int = 0, recipe: str | None = None,
            num_envs: int = 0, env: str = "", num_steps: int = 0, updates: int = 0,
            depth: int = 2, update_epochs: int = 4, num_minibatches: int = 4,
            stores: str | None = None, variants: Sequence[str] = (), paired: bool = False):
    """What a cell's records measure (:mod:`repro.program`), from the cell's settings alone.

    A throughput cell (``network``, ``width``, ``recipe``, ``num_envs`` and the loop's sizes):
    its two timed programs traced together, the whole PPO loop (``ppo.make_train``, one seed;
    ``env_steps_per_s``) and the update alone on a rollout-shaped batch
    (``ppo.make_update_step``; ``update_time_ms`` and ``update_memory_bytes``), on abstract
    arguments of the cell's shapes. ``stores`` (a recipe family): the ``stores`` cell's records
    of that family are no computation but registry facts, so their program is a constant: the
    facts each record is made of (value formats, bytes per weight) for every registry entry of
    the family and ``variants``, computed while it is traced; ``stores_records`` is the kit.
    ``paired``: the same programs timed in rounds beside other recipes (a paired cell's kit)."""
    import json

    from repro.program import Program

    if stores is not None:
        def facts():
            resolved = {**REGISTRY, **{v: resolve(v) for v in variants}}
            of = {n: r for n, r in resolved.items() if r.family == stores}
            rows = []
            for name, r in sorted(of.items()):
                rows.append([name, r.family, value_formats(r),
                             optim.storage_bytes(r.master_weights),
                             int(np.dtype(optim.container_dtype(r.master_weights)).itemsize)])
            data = json.dumps([list(A1_STORES), rows], sort_keys=True).encode()
            return jnp.asarray(np.frombuffer(data, np.uint8))

        return Program(facts, (), kit=(stores_records,))

    c, update = update_step_program(network, width, recipe, num_envs, env, num_steps,
                                    updates, depth, update_epochs, num_minibatches)

    def measured(train_key, *update_args):
        loop = ppo.make_train(c)(train_key)  # env_steps_per_s
        return loop, update.fn(*update_args)  # update_time_ms, memory

    kit = (time_rounds, compiled_facts) if paired else (time_fn, _time_fn, compiled_facts)
    return Program(measured, (update.args[-1], *update.args), kit=kit)


def update_step_program(network: str, width: int, recipe: str, num_envs: int, env: str,
                        num_steps: int, updates: int, depth: int, update_epochs: int,
                        num_minibatches: int):
    """A throughput cell's PPO config and its update step alone (``ppo.make_update_step``)
    as a :class:`repro.program.Program` on abstract arguments of the cell's shapes: the
    variables, optimizer state, a rollout-shaped batch (:func:`synthetic_rollout`) and a key."""
    import types

    from repro.program import Program

    p = types.SimpleNamespace(networks={network: env}, depth=depth, num_steps=num_steps,
                              updates=updates, update_epochs=update_epochs,
                              num_minibatches=num_minibatches)
    c = throughput_config(network, width, recipe, num_envs, p)
    env_, env_params = ppo.make_env(c.env)
    net = ppo.build_network(c, env_, env_params)
    tx = ppo.make_optimizer(c)
    key = jax.eval_shape(lambda: jax.random.key(0))
    variables, opt_state = jax.eval_shape(
        lambda k: ppo.init_state(c, net, env_, env_params, tx, k), key)
    traj, adv, tgt = jax.eval_shape(lambda k: synthetic_rollout(c, env_, env_params, k), key)
    return c, Program(ppo.make_update_step(c, net, tx),
                      (variables, opt_state, traj, adv, tgt, key))


def program_settings(rec: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`program`'s settings for a record of this study (None: not derivable)."""
    sizes, extra = rec.get("sizes") or {}, rec.get("extra") or {}
    try:
        if rec.get("metric") == "fp8_stores":
            return {"stores": rec["recipe"], "variants": (sizes.get("variant") or
                                                          extra["variant"],)}
        return {"network": sizes["network"], "width": int(sizes["width"]),
                "recipe": rec["recipe"], "num_envs": int(sizes["num_envs"]),
                "env": sizes["env"], "num_steps": int(sizes["num_steps"]),
                "updates": int(extra["updates_per_call"]), "depth": int(sizes["depth"]),
                "update_epochs": int(sizes["update_epochs"]),
                "num_minibatches": int(sizes["batch"]) // int(sizes["minibatch"]),
                **({"paired": True} if extra.get("timing") == "paired" else {})}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def check(p: Params) -> None:
    for network, env in p.networks.items():
        ppo.validate(dict(env=env, network=network))


def cells(p: Params) -> list[Cell]:
    """The ``stores`` cell, the paired cells, the variant cells, then one per (network, width,
    recipe, num_envs) in params order; cells of one (network, width, num_envs) are compared with each other (a
    ``group``; a paired cell is a group of its own)."""
    names = stores_names(p.recipes)

    def stores_programs():
        family = {n: resolve(n).family for n in names}
        return {f: program(stores=f, variants=tuple(n for n in names if family[n] == f))
                for f in dict.fromkeys(family.values())}

    out = [Cell("stores", lambda _budget: stores_records(p.profile, names),
                programs=stores_programs)]

    def one(network, width, recipe, n):
        return lambda _budget: throughput_cell(network, width, recipe, n, p)

    def programs(network, width, recipe, n):
        return lambda: {recipe: program(
            network=network, width=width, recipe=recipe, num_envs=n, env=p.networks[network],
            num_steps=p.num_steps, updates=p.updates, depth=p.depth,
            update_epochs=p.update_epochs, num_minibatches=p.num_minibatches)}

    pairs = [p.paired_recipes] if p.paired_recipes else []
    if p.selected:
        own = tuple(dict.fromkeys(["bf16", *p.selected]))
        pairs = [x for x in pairs if set(x) & set(p.selected)]
        pairs += [own] if set(p.selected) - set(p.paired_recipes) else []

    def paired(width, n, recipes, suffix=None):
        suffix = suffix or ("paired" if recipes == p.paired_recipes
                            else "paired_" + "-".join(recipes))
        return Cell(f"mlp_w{width}_e{n}_{suffix}",
                    lambda _budget: paired_cell("mlp", width, recipes, n, p), recipes,
                    group=f"mlp_w{width}_e{n}_{suffix}",
                    programs=lambda: {r: program(
                        network="mlp", width=width, recipe=r, num_envs=n,
                        env=p.networks["mlp"], num_steps=p.num_steps, updates=p.updates,
                        depth=p.depth, update_epochs=p.update_epochs,
                        num_minibatches=p.num_minibatches, paired=True) for r in recipes})

    if "mlp" in p.networks:  # first: the cells A2 (and C1) are judged from
        out += [paired(w, n, x) for x in pairs for w in p.paired_widths for n in p.num_envs]
    if p.variant_recipes and "mlp" in p.networks and not p.selected:
        out += [paired(w, n, p.variant_recipes, "variants") for w in p.variant_widths
                for n in (p.variant_envs or p.num_envs)]
    for network in p.networks:
        for width in (p.widths if network == "mlp" else [p.cnn_width]):
            for recipe in p.selected or p.recipes:
                out += [Cell(f"{network}_w{width}_{recipe}_e{n}", one(network, width, recipe, n),
                             (recipe,), group=f"{network}_w{width}_e{n}",
                             programs=programs(network, width, recipe, n))
                        for n in p.num_envs]
    return out


STUDY = Study(THROUGHPUT, ("A1", "A2", "A4", "A9", "C1"), cells, check,
              about="PPO env-steps/s and update time per recipe", params=Params, narrow=narrow)
