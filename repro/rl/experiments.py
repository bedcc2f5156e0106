"""The two RL studies: throughput per precision recipe (A1, A2, A4, A9) and quality (A5-A8, A10).

    repro record rl_throughput --profile full     # one resumable cell per (network, width,
                                                  # recipe, num_envs)
    repro record rl_quality --profile full        # one resumable cell per (env, variant)

Both read their sizes from ``params.yaml`` (sections ``rl_throughput`` and ``rl_quality``) and
write tidy records with ``repro.results``; ``--recipe R`` restricts a run to some recipes (for
the quality study: the variants built on those recipes), so a long study can be split into
commands that each fit a time limit, and a stopped run resumes at the first missing cell.

Throughput (experiment ``rl_throughput``). Per cell:

* ``env_steps_per_s`` -- the whole PPO loop (``ppo.make_train``: rollouts, GAE, 4 epochs of
  minibatch updates) for ``updates`` updates, ONE seed (no ``vmap``: a vmapped FP8 GEMM is a
  batched GEMM, which is not what an RL user runs), median of ``repeats`` timed calls after a
  compiling warm-up (``repro.bench.time_fn``).
* ``update_time_ms`` -- one PPO update alone (``ppo.make_update_step``) on a synthetic rollout
  of the same size: the part of the loop whose GEMMs FP8 can speed up.
* ``update_memory_bytes`` -- the compiled update's buffers (arguments + outputs + temporaries
  - aliased), from XLA's ``memory_analysis()`` (every backend). Where the device reports
  ``memory_stats()`` the process peak is kept in ``extra`` too (it is cumulative over the
  process, so it is not a per-recipe number).
* ``extra.fp8_gemm_calls`` / ``extra.fp8_lowering`` -- cuBLASLt FP8 GEMM calls in the compiled
  update and how its f8 products lowered (``repro.bench.fp8_lowering``: small GEMMs get XLA's
  Triton GEMM with f8 operands, also FP8 tensor-core math); an FP8 recipe on a GPU whose
  program ran no FP8 GEMM is marked ``emulated`` (``repro.bench.recipe_emulated``).
* a ``stores`` cell: which stores are FP8 under each recipe / variant (claim A1), and the bytes
  per weight.

Quality (experiment ``rl_quality``). Per (env, variant): ``final_return`` per seed (mean return
of the episodes completed over the last ``last_fraction`` of updates; NaN if the parameters went
non-finite), seeds under ``jax.vmap``; the learning curve and skip counts in ``extra``. Per env
also ``random_return`` (uniform random policy, for normalisation) and a determinism check
(``same_seed_identical``: one variant run twice with the same seeds; ``different_seeds_differ``).
Variants (:data:`VARIANTS`) are a recipe plus optimizer/network flags: the ablations of the
FP8 recipe (no scaling, no Kahan, no gradient clipping, no weight clipping, all layers FP8).

Analysis helpers for notebook 04 (``normalised_scores``, ``aggregate``,
``probability_of_improvement``) use rliable (IQM, 95% stratified bootstrap) when it is
installed and an equivalent NumPy implementation otherwise.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from repro import config, optim, results
from repro.bench import compiled_facts, recipe_emulated
from repro.recipes import get_recipe
from repro.rl import ppo

THROUGHPUT = "rl_throughput"
QUALITY = "rl_quality"
THROUGHPUT_RECIPES = ("fp32", "tf32", "bf16", "fp16", "fp8-current", "fp8-delayed")

# A variant = a recipe + flags of repro.optim / repro.rl.networks. `claims` says which claims
# it serves. The FP8 "end to end" variants store the weights in FP8 (E4M3 with a per-tensor
# power-of-two scale, held in a bfloat16 container: see repro.optim) and clip them.
_E2E = dict(recipe="fp8-delayed", master_weights="fp8", kahan=True, weight_clip=1.0)
VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": dict(recipe="fp32"),
    "bf16": dict(recipe="bf16"),
    "fp16": dict(recipe="fp16"),  # dynamic loss scaling (the recipe's loss_scaling)
    "fp8-delayed": dict(recipe="fp8-delayed"),  # A6: FP8 GEMMs, FP32 master weights
    "fp8-current": dict(recipe="fp8-current"),
    "fp8-all-layers": dict(recipe="fp8-delayed", keep_io_precise=False),  # A1: first/last too
    "fp8-e2e": dict(_E2E),  # A1, A7: FP8-stored weights with a Kahan-compensated update
    "fp8-e2e-nokahan": {**_E2E, "kahan": False},  # A7 ablation
    "bf16w-kahan": dict(recipe="bf16", master_weights="bf16", kahan=True),  # A7 (classic)
    "bf16w-nokahan": dict(recipe="bf16", master_weights="bf16", kahan=False),  # A7 ablation
    "fp8-noscale": dict(recipe="fp8-noscale"),  # A5 ablation: FP8 casts without scaling
    "fp8-e2e-nogradclip": {**_E2E, "grad_clip": None},  # A8 ablation
    "fp8-e2e-noweightclip": {**_E2E, "weight_clip": None},  # A8 ablation
}
VARIANT_CLAIMS = {
    "fp32": ["A10"], "bf16": ["A10"], "fp16": ["A10"], "fp8-delayed": ["A5", "A6", "A10"],
    "fp8-current": ["A5", "A10"], "fp8-all-layers": ["A1", "A10"], "fp8-e2e": ["A1", "A7", "A8"],
    "fp8-e2e-nokahan": ["A7"], "bf16w-kahan": ["A7"], "bf16w-nokahan": ["A7"],
    "fp8-noscale": ["A5"], "fp8-e2e-nogradclip": ["A8"], "fp8-e2e-noweightclip": ["A8"],
}


def variant_config(name: str) -> dict[str, Any]:
    if name not in VARIANTS:
        raise config.ConfigError(f"unknown RL variant {name!r}; valid variants: "
                                 f"{', '.join(VARIANTS)}")
    return dict(VARIANTS[name])


def throughput_variant(name: str) -> dict[str, Any]:
    """The PPO fields of a throughput cell's recipe name: an RL quality variant of
    :data:`VARIANTS` where one has that name (e.g. ``fp8-all-layers``: fp8-delayed with the
    first layer and heads in FP8 too, a speed lever for the widest networks whose learning
    notebook 04 measures under the same name), else the plain recipe (``tf32`` has no
    variant). Unknown recipe names fail in :func:`repro.recipes.get_recipe`."""
    if name in VARIANTS:
        return variant_config(name)
    get_recipe(name)
    return {"recipe": name}


# ------------------------------------------------------------------------ precision policy


def precision_policy(recipe: str, master_weights: str = "fp32",
                     keep_io_precise: bool = True) -> dict[str, str]:
    """Where each value lives under a recipe (claim A1's four stores, and what stays wider)."""
    r = get_recipe(recipe)
    q = r.gemm == "fp8"
    fwd = {"float8_e4m3fn": "fp8-e4m3", "float8_e5m2": "fp8-e5m2"}
    dt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[r.compute_dtype]
    if r.compute_dtype == "float32" and r.matmul_precision == "default":
        dt_gemm = "tf32"
    else:
        dt_gemm = dt
    return {
        "params (stored)": {"fp32": "fp32", "bf16": "bf16",
                            "fp8": "fp8-e4m3 (bf16 container)"}[master_weights],
        "weights (GEMM operand)": fwd[r.fwd_dtype] if q else dt_gemm,
        "activations (GEMM operand)": fwd[r.fwd_dtype] if q else dt_gemm,
        "activations (stored between layers)": dt,
        "gradients (GEMM operand)": fwd[r.bwd_dtype] if q else dt_gemm,
        "weight gradients (output)": "fp32" if master_weights == "fp32" else "fp32 (cast)",
        "optimizer state (Adam moments)": "fp32",
        "optimizer update arithmetic": "fp32",
        "GEMM accumulation": "fp32",
        "first/last layers": (dt if (q and keep_io_precise) else
                              (fwd[r.fwd_dtype] if q else dt_gemm)),
        "scaling": r.scaling if q else "-",
    }


A1_STORES = ("params (stored)", "activations (GEMM operand)", "gradients (GEMM operand)",
             "optimizer update arithmetic")


def stores_records(profile: str) -> list[dict[str, Any]]:
    """One record per recipe and per quality variant: how many of A1's four stores are FP8."""
    recs = []
    items = [(r, dict(recipe=r)) for r in THROUGHPUT_RECIPES] + list(VARIANTS.items())
    seen = set()
    for name, v in items:
        if name in seen:
            continue
        seen.add(name)
        pol = precision_policy(v["recipe"], v.get("master_weights", "fp32"),
                               v.get("keep_io_precise", True))
        n = sum(pol[k].startswith("fp8") for k in A1_STORES)
        recs.append(results.make_record(
            THROUGHPUT, "fp8_stores", n, f"of {len(A1_STORES)}", claims=["A1"],
            recipe=v["recipe"], sizes={"variant": name}, profile=profile,
            extra={"variant": name, "policy": pol, "a1_stores": list(A1_STORES),
                   "bytes_per_weight_format": optim.storage_bytes(
                       v.get("master_weights", "fp32")),
                   "bytes_per_weight_container": int(np.dtype(optim.container_dtype(
                       v.get("master_weights", "fp32"))).itemsize)}))
    return recs


# ------------------------------------------------------------------------------ timing


def _time_fn(fn, *args, repeats: int, warmup: int = 1):
    """(median s, IQR s, samples): repro.bench.time_fn when present, else the same by hand."""
    try:
        from repro.bench import time_fn
    except ImportError:  # pragma: no cover - bench is part of the repository
        time_fn = None
    if time_fn is not None:
        t = time_fn(fn, *args, repeats=repeats, warmup=warmup)
        return t.median_s, t.iqr_s, list(t.samples)
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    s = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        s.append(time.perf_counter() - t0)
    q1, med, q3 = np.percentile(s, [25, 50, 75])
    return float(med), float(q3 - q1), s


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


def throughput_config(network: str, width: int, recipe: str, num_envs: int,
                      p: Mapping[str, Any]) -> ppo.PPOConfig:
    """The PPO configuration a throughput cell times (``recipe``: a recipe or RL variant name,
    :func:`throughput_variant`)."""
    return ppo.validate(dict(
        **throughput_variant(recipe),
        env=p["networks"][network], network=network, width=width, depth=int(p.get("depth", 2)),
        num_envs=num_envs, num_steps=int(p["num_steps"]),
        total_timesteps=num_envs * int(p["num_steps"]) * int(p["updates"]),
        update_epochs=int(p.get("update_epochs", 4)),
        num_minibatches=int(p.get("num_minibatches", 4)), anneal_lr=False))


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
    throughput cell times and ``repro.kernelprof ppo`` traces."""
    update, args = update_step(c)
    t0 = time.perf_counter()
    compiled = update.lower(*args).compile()
    return compiled, args, time.perf_counter() - t0


def throughput_cell(network: str, width: int, recipe: str, num_envs: int, p: Mapping[str, Any],
                    profile: str) -> list[dict[str, Any]]:
    """Time the whole PPO loop and the update alone for one configuration."""
    from repro import hardware

    c = throughput_config(network, width, recipe, num_envs, p)
    base = c.recipe
    repeats = int(p["repeats"])
    info = hardware.detect()

    # The whole loop, one seed.
    train = jax.jit(ppo.make_train(c))
    key = jax.random.key(0)
    t0 = time.perf_counter()
    compiled_train = train.lower(key).compile()
    compile_e2e = time.perf_counter() - t0
    med, iqr, samples = _time_fn(compiled_train, key, repeats=repeats)
    steps = c.num_updates * c.batch_size

    # The update alone.
    compiled_update, args, compile_upd = update_program(c)
    umed, uiqr, usamples = _time_fn(compiled_update, *args, repeats=repeats)
    facts = compiled_facts(compiled_update)
    fp8_calls, mem = facts["fp8_gemm_calls"], facts["memory_bytes"]
    r = get_recipe(base)
    # an FP8 CNN's backward convolutions are emulated through BF16 (repro.ops.fp8_conv): the
    # cell's speed is not FP8's even where its GEMMs and forward convolutions are native
    conv_emulated = network != "mlp" and r.gemm == "fp8"
    emulated = recipe_emulated(r, facts["fp8_lowering"], info) or conv_emulated
    sizes = {"network": network, "width": width, "depth": c.depth, "num_envs": num_envs,
             "num_steps": c.num_steps, "env": c.env, "batch": c.batch_size,
             "minibatch": c.minibatch_size, "update_epochs": c.update_epochs}
    extra = {"fp8_gemm_calls": fp8_calls, "fp8_lowering": facts["fp8_lowering"],
             "compile_e2e_s": compile_e2e,
             "compile_update_s": compile_upd, "updates_per_call": c.num_updates,
             "keep_io_precise": c.keep_io_precise, "device_peak_bytes": _device_peak_bytes(),
             "device_peak_note": "cumulative over the process, not per recipe",
             "conv_backward": "bf16 emulation of FP8" if conv_emulated else None}
    common = dict(claims=["A2", "A9"], recipe=recipe, sizes=sizes, repeats=repeats,
                  emulated=emulated, profile=profile)
    s = steps / np.asarray(samples)
    q1, q3 = np.percentile(s, [25, 75])
    recs = [
        results.make_record(THROUGHPUT, "env_steps_per_s", steps / med, "steps/s",
                            spread=float(q3 - q1),
                            extra={**extra, "samples_s": samples, "time_s": med}, **common),
        results.make_record(THROUGHPUT, "update_time_ms", umed * 1e3, "ms", spread=uiqr * 1e3,
                            extra={**extra, "samples_ms": [x * 1e3 for x in usamples]},
                            **common),
    ]
    if mem is not None:
        recs.append(results.make_record(THROUGHPUT, "update_memory_bytes", mem, "bytes",
                                        extra=extra, **{**common, "claims": ["A1", "A4"]}))
    return recs


def throughput_cells(p: Mapping[str, Any], recipes: Sequence[str]) -> list[tuple]:
    cells = []
    for network in p["networks"]:
        widths = p["widths"] if network == "mlp" else [int(p.get("cnn_width", 0))]
        for width in widths:
            for recipe in recipes:
                for n in p["num_envs"]:
                    cells.append((f"{network}_w{width}_{recipe}_e{n}", network, int(width),
                                  recipe, int(n)))
    return cells


def _select(cells: list[tuple], only: Sequence[str] | None) -> list[tuple]:
    """Cells whose name matches one of the ``only`` globs (all cells without ``only``)."""
    if not only:
        return cells
    from fnmatch import fnmatch

    return [c for c in cells if any(fnmatch(c[0], pat) for pat in only)]


class CellsFailed(RuntimeError):
    """Cells of a study that raised; every other selected cell was run and written. A cell the
    device cannot compile (session 6: cuDNN had no FP8 convolution for one environment) must
    not cost the rest of an unattended GPU call."""

    def __init__(self, study: str, failures: list[str]):
        self.study, self.failures = study, failures
        super().__init__(f"{study}: {len(failures)} cell(s) failed, the others were written: "
                         + "; ".join(failures))


def _cell_failed(study: str, cell: str, err: Exception, failures: list[str]) -> None:
    from tqdm import tqdm

    first = (str(err).strip().splitlines() or [""])[0][:300]
    failures.append(f"{cell} ({type(err).__name__}: {first})")
    tqdm.write(f"{study}: cell {cell} failed, going on with the next: {failures[-1]}")


def cross_call_note(selected: list[tuple], every: list[tuple], force: bool,
                    root: str | Path) -> str | None:
    """A warning when this call would time cells whose configuration (network, width, envs)
    already has cells of other recipes recorded by an earlier call: a speed ratio needs both
    cells from one call, and notebook 03 leaves cross-call ratios out of A2/A9. None if not."""
    run = [c for c in selected if force or not results.have_cell(THROUGHPUT, c[0], root=root)]
    new = {c[0] for c in run}
    configs = {(c[1], c[2], c[4]) for c in run}
    kept = sorted(c[0] for c in every if (c[1], c[2], c[4]) in configs and c[0] not in new
                  and results.have_cell(THROUGHPUT, c[0], root=root))
    if not kept:
        return None
    return (f"{THROUGHPUT}: note: {', '.join(sorted(new))} will be compared with "
            f"{', '.join(kept)}, recorded by an earlier call: those ratios are cross-call "
            "(notebook 03 leaves them out of A2/A9); to time them together, select both and "
            "add --force")


def record_throughput(profile: str, root: str | Path | None = None, force: bool = False,
                      recipes: Sequence[str] | None = None,
                      only: Sequence[str] | None = None) -> list[Path]:
    """Run the ``rl_throughput`` study of ``params.yaml`` for ``profile``; returns paths.

    ``recipes`` restricts the recipes; ``only`` (globs on cell names such as
    ``"mlp_w4096_*"``) restricts the cells, so a long study splits into short runs.
    """
    from tqdm import tqdm

    p = config.stage_params(THROUGHPUT, profile)
    profile = p["profile"]
    all_recipes = list(p.get("recipes", THROUGHPUT_RECIPES))
    use = all_recipes if recipes is None else [r for r in all_recipes if r in recipes]
    for r in list(recipes or []) + all_recipes:
        throughput_variant(r)  # one-line error for an unknown name, before any work
    for network, env in p["networks"].items():
        ppo.validate(dict(env=env, network=network))
    root = Path(root) if root is not None else results.record_root(profile)
    written = []
    if force or not results.have_cell(THROUGHPUT, "stores", root=root):
        written.append(results.write_records(stores_records(profile), THROUGHPUT, "stores",
                                             root=root))
    cells, failures = _select(throughput_cells(p, use), only), []
    if note := cross_call_note(cells, throughput_cells(p, all_recipes), force, root):
        tqdm.write(note)
    for cell, network, width, recipe, n in (bar := tqdm(cells, desc=f"{THROUGHPUT} [{profile}]",
                                                        unit="cell")):
        if not force and results.have_cell(THROUGHPUT, cell, root=root):
            continue
        bar.set_postfix_str(cell)
        try:
            recs = throughput_cell(network, width, recipe, n, p, profile)
        except Exception as e:  # noqa: BLE001 - logged, the study goes on, raised at the end
            _cell_failed(THROUGHPUT, cell, e, failures)
            continue
        written.append(results.write_records(recs, THROUGHPUT, cell, root=root))
    if failures:
        raise CellsFailed(THROUGHPUT, failures)
    return written


# ------------------------------------------------------------------------------ quality


def random_return(env_name: str, num_envs: int = 64, num_steps: int = 2000,
                  seed: int = 0) -> float:
    """Mean return of the episodes a uniform random policy completes (normalisation floor)."""
    env, env_params = ppo.make_env(env_name)
    n_act = env.action_space(env_params).n

    @jax.jit
    def run(key):
        k0, key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(k0, num_envs), env_params)

        def step(carry, _):
            state, ep, key = carry
            key, ka, ks = jax.random.split(key, 3)
            a = jax.random.randint(ka, (num_envs,), 0, n_act)
            _, state, r, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(ks, num_envs), state, a, env_params)
            ep = ep + r
            done = term | trunc
            out = (jnp.sum(jnp.where(done, ep, 0.0)), jnp.sum(done))
            return (state, jnp.where(done, 0.0, ep), key), out

        _, (tot, n) = jax.lax.scan(step, (state, jnp.zeros(num_envs), key), None, num_steps)
        return tot.sum(), n.sum()

    tot, n = jax.device_get(run(jax.random.key(seed)))
    return float(tot / n) if n > 0 else float("nan")


def quality_config(env_name: str, variant: str, p: Mapping[str, Any]) -> ppo.PPOConfig:
    envs = p["envs"]
    return ppo.validate({**dict(p.get("ppo", {})), **dict(envs[env_name] or {}),
                         "env": env_name, **variant_config(variant)})


def seeds_runner(c: ppo.PPOConfig):
    """``run(seeds) -> metrics`` (numpy, [seeds, updates]): one jitted, vmapped PPO."""
    train = jax.jit(jax.vmap(ppo.make_train(c)))

    def run(seeds: Sequence[int]) -> dict[str, np.ndarray]:
        keys = jax.vmap(jax.random.key)(jnp.asarray(list(seeds), jnp.uint32))
        return {k: np.asarray(v) for k, v in jax.device_get(train(keys)).items()}

    return run


def run_seeds(c: ppo.PPOConfig, seeds: Sequence[int]) -> dict[str, np.ndarray]:
    return seeds_runner(c)(seeds)


def _curve(x: np.ndarray, points: int = 100) -> list[float | None]:
    """A learning curve thinned to at most ``points`` (means over equal chunks)."""
    chunks = np.array_split(np.asarray(x, np.float64), min(points, len(x)))
    with np.errstate(all="ignore"):
        return [None if not np.isfinite(v) else float(v)
                for v in (np.nanmean(ch) if np.isfinite(ch).any() else np.nan for ch in chunks)]


def quality_cell(env_name: str, variant: str, p: Mapping[str, Any],
                 profile: str) -> list[dict[str, Any]]:
    c = quality_config(env_name, variant, p)
    seeds = list(range(int(p["seeds"])))
    t0 = time.perf_counter()
    m = run_seeds(c, seeds)
    wall = time.perf_counter() - t0
    peak = _device_peak_bytes()
    final = ppo.final_return(m, float(p.get("last_fraction", 0.1)))
    from repro import ops

    emulated = bool(ops.is_emulated(get_recipe(c.recipe)))
    sizes = {"env": env_name, "variant": variant, "network": c.network, "width": c.width,
             "total_timesteps": c.total_timesteps, "num_envs": c.num_envs,
             "seeds": len(seeds)}
    cfg = {k: v for k, v in variant_config(variant).items()}
    recs = []
    for i, s in enumerate(seeds):
        recs.append(results.make_record(
            QUALITY, "final_return", final[i], "return", claims=VARIANT_CLAIMS[variant],
            recipe=c.recipe, sizes={**sizes, "seed": s}, emulated=emulated, profile=profile,
            extra={"variant": variant, "variant_config": cfg,
                   "curve": _curve(m["episode_return"][i]),
                   "skipped_steps": int(m["skipped"][i, -1]),
                   "final_loss_scale": float(m["loss_scale"][i, -1]),
                   "diverged": bool(m["nonfinite_params"][i, -1]),
                   "last_fraction": float(p.get("last_fraction", 0.1)),
                   "wall_s_all_seeds": wall,
                   # all seeds of the cell train together: the process's device peak so far
                   # (an upper bound for this cell; None where the backend has no stats)
                   "peak_device_bytes": peak}))
    return recs


def determinism_cell(env_name: str, variant: str, p: Mapping[str, Any],
                     profile: str) -> list[dict[str, Any]]:
    """Run ``variant`` twice on seeds (0, 1, 0): A10's "same seed, same result"."""
    run = seeds_runner(quality_config(env_name, variant, p))
    c = quality_config(env_name, variant, p)
    a = run([0, 1, 0])["episode_return"]
    b = run([0, 1, 0])["episode_return"]
    same = bool(np.array_equal(a, b, equal_nan=True)
                and np.array_equal(a[0], a[2], equal_nan=True))
    differ = not np.array_equal(a[0], a[1], equal_nan=True)
    common = dict(claims=["A10"], recipe=c.recipe, profile=profile,
                  sizes={"env": env_name, "variant": variant,
                         "total_timesteps": c.total_timesteps},
                  extra={"variant": variant, "compared": "per-update mean returns, bitwise",
                         "runs": "two jitted calls on seeds (0, 1, 0)"})
    return [results.make_record(QUALITY, "same_seed_identical", float(same), "bool", **common),
            results.make_record(QUALITY, "different_seeds_differ", float(differ), "bool",
                                **common)]


def quality_cells(p: Mapping[str, Any], variants: Sequence[str]) -> list[tuple]:
    cells = []
    det = p.get("determinism_variant")
    for env_name in p["envs"]:
        cells.append((f"{env_name}_random", "random", env_name, None))
        for v in variants:
            cells.append((f"{env_name}_{v}", "variant", env_name, v))
        if det and det in variants:
            cells.append((f"{env_name}_determinism_{det}", "determinism", env_name, det))
    return cells


def record_quality(profile: str, root: str | Path | None = None, force: bool = False,
                   recipes: Sequence[str] | None = None,
                   only: Sequence[str] | None = None) -> list[Path]:
    """Run the ``rl_quality`` study of ``params.yaml`` for ``profile``; returns paths.

    ``recipes`` restricts the run to the variants built on those recipes; ``only`` (globs on
    cell names such as ``"CartPole-v1_*"`` or ``"*_fp8-e2e*"``) to some cells.
    """
    from tqdm import tqdm

    p = config.stage_params(QUALITY, profile)
    profile = p["profile"]
    variants = list(p["variants"])
    for v in variants:
        variant_config(v)  # one-line error for an unknown variant
    for r in recipes or []:
        get_recipe(r)
    if recipes is not None:
        variants = [v for v in variants if VARIANTS[v]["recipe"] in recipes]
    for env_name in p["envs"]:
        for v in variants:
            quality_config(env_name, v, p)  # validate every cell before the first run
    root = Path(root) if root is not None else results.record_root(profile)
    written = []
    cells, failures = _select(quality_cells(p, variants), only), []
    for cell, kind, env_name, v in (bar := tqdm(cells, desc=f"{QUALITY} [{profile}]",
                                                unit="cell")):
        if not force and results.have_cell(QUALITY, cell, root=root):
            continue
        bar.set_postfix_str(cell)
        try:
            if kind == "random":
                recs = [results.make_record(
                    QUALITY, "random_return", random_return(env_name), "return", claims=["A10"],
                    sizes={"env": env_name, "variant": "random"}, profile=profile,
                    extra={"policy": "uniform random", "num_envs": 64, "num_steps": 2000})]
            elif kind == "determinism":
                recs = determinism_cell(env_name, v, p, profile)
            else:
                recs = quality_cell(env_name, v, p, profile)
        except Exception as e:  # noqa: BLE001 - logged, the study goes on, raised at the end
            _cell_failed(QUALITY, cell, e, failures)
            continue
        written.append(results.write_records(recs, QUALITY, cell, root=root))
    if failures:
        raise CellsFailed(QUALITY, failures)
    return written


QUALITY_REPEAT = "rl_quality_repeat"


def repeat_identical(df: pd.DataFrame, repeat: pd.DataFrame) -> pd.DataFrame:
    """A10 across processes: quality cells recorded twice, compared bitwise.

    ``repeat`` holds ``final_return`` records of cells that were run a second time in another
    process (``results/<hw>/rl_quality_repeat/``: same commit, machine and seeds; load it with
    ``keep_defective=True``: reproducibility does not depend on a numerics defect). One row per
    (hardware, env, variant) recorded at the same commit both times: the seeds compared,
    whether every seed's final return AND its learning curve are identical, and the commit.
    """
    cols = ["hardware", "env", "variant", "seeds", "identical", "commit", "commit_repeat"]

    def keyed(d):
        d = d[d.metric == "final_return"]
        return {(r.hardware, r.sizes["env"], r.extra["variant"], r.sizes["seed"]):
                (r.value, r.extra.get("curve"), r.git_commit) for r in d.itertuples()}

    if repeat.empty or df.empty:
        return pd.DataFrame(columns=cols)
    a, b = keyed(df), keyed(repeat)
    rows: dict[tuple, dict] = {}
    # a cell recorded again later with other code (e.g. re-recorded after a defect) is not a
    # repeat: only the same commit counts
    for k in sorted((k for k in set(a) & set(b) if a[k][2] == b[k][2]), key=str):
        cell = rows.setdefault(k[:3], {"hardware": k[0], "env": k[1], "variant": k[2],
                                       "seeds": 0, "identical": True,
                                       "commit": str(a[k][2])[:7],
                                       "commit_repeat": str(b[k][2])[:7]})
        va, vb = a[k][0], b[k][0]
        same = (va == vb or (np.isnan(va) and np.isnan(vb))) and a[k][1] == b[k][1]
        cell["seeds"] += 1
        cell["identical"] &= bool(same)
    return pd.DataFrame(list(rows.values()), columns=cols)


# ----------------------------------------------------------------------- analysis (04)


def _variant_col(df: pd.DataFrame) -> pd.Series:
    return df["extra"].map(lambda e: (e or {}).get("variant"))


def final_returns(df: pd.DataFrame, hardware: str | None = None) -> pd.DataFrame:
    """Tidy per-seed final returns: hardware, env, variant, seed, final_return, emulated."""
    d = df[df.metric == "final_return"].copy()
    if hardware is not None:
        d = d[d.hardware == hardware]
    d["variant"] = _variant_col(d)
    d["env"] = d["sizes"].map(lambda s: s["env"])
    d["seed"] = d["sizes"].map(lambda s: s["seed"])
    d["diverged"] = d["extra"].map(lambda e: e.get("diverged", False))
    d["skipped_steps"] = d["extra"].map(lambda e: e.get("skipped_steps", 0))
    cols = ["hardware", "env", "variant", "recipe", "seed", "value", "emulated", "diverged",
            "skipped_steps", "profile"]
    return d[cols].rename(columns={"value": "final_return"}).reset_index(drop=True)


def normalised_scores(df: pd.DataFrame, hardware: str, reference: str = "fp32"
                      ) -> tuple[dict[str, np.ndarray], list[str], pd.DataFrame]:
    """{variant: [seeds, envs]} of (return - random) / (reference mean - random), per hardware.

    The reference variant (fp32) scores 1 on average, a random policy 0; a diverged seed
    (NaN) scores 0. If the reference did not beat random on an env, the best variant's mean
    is the reference there. Only envs and seed counts present for every variant are used.
    """
    fr = final_returns(df, hardware)
    rnd = df[(df.metric == "random_return") & (df.hardware == hardware)].copy()
    rnd["env"] = rnd["sizes"].map(lambda s: s["env"])
    floor = rnd.groupby("env")["value"].mean()
    envs = sorted(set(fr.env) & set(floor.index))
    variants = [v for v in VARIANTS if v in set(fr.variant)]
    envs = [e for e in envs if all(((fr.env == e) & (fr.variant == v)).any() for v in variants)]
    if not envs:
        return {}, [], pd.DataFrame()
    n = min(int(((fr.env == e) & (fr.variant == v)).sum()) for e in envs for v in variants)
    means = fr.groupby(["env", "variant"])["final_return"].mean()
    scores, rows = {}, []
    for v in variants:
        cols = []
        for e in envs:
            ref = means.get((e, reference), np.nan)
            if not np.isfinite(ref) or ref - floor[e] <= 1e-6:
                ref = means.loc[e].max()
            x = fr[(fr.env == e) & (fr.variant == v)].sort_values("seed")["final_return"]
            x = np.asarray(x, np.float64)[:n]
            z = np.nan_to_num((x - floor[e]) / max(ref - floor[e], 1e-6), nan=0.0)
            cols.append(z)
            rows += [{"env": e, "variant": v, "seed": i, "normalised": z[i]} for i in range(n)]
        scores[v] = np.stack(cols, axis=1)
    return scores, envs, pd.DataFrame(rows)


def _iqm(x: np.ndarray) -> float:
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(x).ravel(), 0.25))


def _stratified_bootstrap(scores: np.ndarray, fn, reps: int, rng) -> np.ndarray:
    runs, tasks = scores.shape
    out = np.empty(reps)
    for i in range(reps):
        idx = rng.integers(0, runs, size=(runs, tasks))
        out[i] = fn(np.take_along_axis(scores, idx, axis=0))
    return out


@contextlib.contextmanager
def _global_numpy_seed(seed: int):
    """rliable's StratifiedBootstrap draws its indices from NumPy's GLOBAL generator
    (``np.random.choice`` in ``update_indices``), ignoring the ``random_state`` it is given, so
    its intervals changed from run to run. Seed the global generator for the call, then put
    its state back."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def aggregate(scores: Mapping[str, np.ndarray], reps: int = 2000, seed: int = 0
              ) -> pd.DataFrame:
    """IQM (and mean) of normalised scores per variant with 95% stratified-bootstrap CIs."""
    rows = []
    try:
        from rliable import library as rly
        from rliable import metrics as rm

        fn = lambda x: np.array([rm.aggregate_iqm(x), rm.aggregate_mean(x)])  # noqa: E731
        with warnings.catch_warnings(), _global_numpy_seed(seed):
            warnings.simplefilter("ignore", FutureWarning)  # arch: "random_state is deprecated"
            pt, ci = rly.get_interval_estimates(dict(scores), fn, reps=reps,
                                                random_state=np.random.RandomState(seed))
        for v in scores:
            rows.append({"variant": v, "iqm": pt[v][0], "iqm_lo": ci[v][0, 0],
                         "iqm_hi": ci[v][1, 0], "mean": pt[v][1], "mean_lo": ci[v][0, 1],
                         "mean_hi": ci[v][1, 1], "backend": "rliable"})
    except ImportError:
        rng = np.random.default_rng(seed)
        for v, s in scores.items():
            b_iqm = _stratified_bootstrap(s, _iqm, reps, rng)
            b_mean = _stratified_bootstrap(s, np.mean, reps, rng)
            rows.append({"variant": v, "iqm": _iqm(s), "iqm_lo": np.percentile(b_iqm, 2.5),
                         "iqm_hi": np.percentile(b_iqm, 97.5), "mean": float(np.mean(s)),
                         "mean_lo": np.percentile(b_mean, 2.5),
                         "mean_hi": np.percentile(b_mean, 97.5), "backend": "numpy"})
    return pd.DataFrame(rows)


def _poi(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y), averaged over tasks (columns)."""
    vals = []
    for j in range(x.shape[1]):
        a, b = x[:, j][:, None], y[:, j][None, :]
        vals.append(float(np.mean((a > b) + 0.5 * (a == b))))
    return float(np.mean(vals))


def probability_of_improvement(scores: Mapping[str, np.ndarray],
                               pairs: Iterable[tuple[str, str]], reps: int = 2000,
                               seed: int = 0) -> pd.DataFrame:
    """P(variant X scores above variant Y on a random env) with a 95% stratified bootstrap CI."""
    pairs = [(x, y) for x, y in pairs if x in scores and y in scores]
    rows = []
    try:
        from rliable import library as rly
        from rliable import metrics as rm

        d = {f"{x},{y}": (scores[x], scores[y]) for x, y in pairs}
        if d:
            with warnings.catch_warnings(), _global_numpy_seed(seed):
                warnings.simplefilter("ignore", FutureWarning)
                pt, ci = rly.get_interval_estimates(d, rm.probability_of_improvement, reps=reps,
                                                    random_state=np.random.RandomState(seed))
            for x, y in pairs:
                k = f"{x},{y}"
                rows.append({"x": x, "y": y, "p": float(np.ravel(pt[k])[0]),
                             "lo": float(np.ravel(ci[k][0])[0]),
                             "hi": float(np.ravel(ci[k][1])[0]), "backend": "rliable"})
    except ImportError:
        rng = np.random.default_rng(seed)
        for x, y in pairs:
            sx, sy = scores[x], scores[y]
            boot = []
            for _ in range(reps):
                ix = rng.integers(0, sx.shape[0], size=sx.shape)
                iy = rng.integers(0, sy.shape[0], size=sy.shape)
                boot.append(_poi(np.take_along_axis(sx, ix, 0), np.take_along_axis(sy, iy, 0)))
            rows.append({"x": x, "y": y, "p": _poi(sx, sy), "lo": np.percentile(boot, 2.5),
                         "hi": np.percentile(boot, 97.5), "backend": "numpy"})
    return pd.DataFrame(rows, columns=["x", "y", "p", "lo", "hi", "backend"])


# -------------------------------------------------------------------- analysis (03)


def throughput_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, network, width, num_envs, recipe) with the three metrics, and
    ``git_commit``: the commit(s) its records were made at, comma-separated."""
    d = df[df.metric.isin(["env_steps_per_s", "update_time_ms", "update_memory_bytes"])].copy()
    if d.empty:
        return pd.DataFrame()
    for k in ("network", "width", "num_envs", "env", "batch"):
        d[k] = d["sizes"].map(lambda s, k=k: s.get(k))
    d["fp8_gemm_calls"] = d["extra"].map(lambda e: e.get("fp8_gemm_calls"))
    # records made before the FP8 CNN cells were flagged emulated say so only here
    d["emulated"] = d["emulated"].astype(bool) | d["extra"].map(
        lambda e: bool(e.get("conv_backward")))
    keys = ["hardware", "hardware_name", "network", "width", "num_envs", "recipe"]
    t = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="median")
    em = d.groupby(keys)["emulated"].any().rename("emulated")
    calls = d.groupby(keys)["fp8_gemm_calls"].max()
    if "git_commit" not in d:
        d["git_commit"] = ""
    commit = d.groupby(keys)["git_commit"].agg(
        lambda c: ",".join(sorted({str(x) for x in c if isinstance(x, str) and x})))
    return t.join(em).join(calls).join(commit).reset_index()


def widest_fitting(table: pd.DataFrame, budget_bytes: float) -> pd.DataFrame:
    """The widest MLP whose PPO update fits ``budget_bytes`` of device memory, per (hardware,
    recipe, num_envs), from the compiled update's memory (``update_memory_bytes``) at the
    measured widths: a least-squares quadratic in the width (parameters, gradients and
    optimizer state grow as W^2, activations as W), solved for the budget. ``extrapolated``:
    the answer lies beyond the widest measured width (a projection, not a measurement). Needs
    three measured widths; others are left out."""
    cols = ["hardware", "recipe", "num_envs", "widths", "widest_width", "extrapolated",
            "max_rel_residual", "emulated"]
    if not len(table) or "update_memory_bytes" not in table:
        return pd.DataFrame(columns=cols)
    mlp = table[(table.network == "mlp")].dropna(subset=["update_memory_bytes"])
    rows = []
    for (h, r, n), g in mlp.groupby(["hardware", "recipe", "num_envs"]):
        g = g.groupby("width", as_index=False).agg(
            mem=("update_memory_bytes", "median"), emulated=("emulated", "any"))
        if len(g) < 3:
            continue
        w, m = g.width.to_numpy(float), g.mem.to_numpy(float)
        c2, c1, c0 = np.polyfit(w, m, 2)
        resid = float(np.max(np.abs(np.polyval([c2, c1, c0], w) - m) / m))
        roots = np.roots([c2, c1, c0 - budget_bytes])
        real = [x.real for x in roots if abs(x.imag) < 1e-9 and x.real > 0]
        widest = max(real) if real else float("nan")
        rows.append((h, r, int(n), [int(x) for x in w], widest,
                     bool(np.isfinite(widest) and widest > w.max()), resid,
                     bool(g.emulated.any())))
    return pd.DataFrame(rows, columns=cols)


def speedups(table: pd.DataFrame, recipe: str, baselines: Sequence[str] = ("fp16", "bf16")
             ) -> pd.DataFrame:
    """``recipe`` vs each baseline, per (hardware, network, width, num_envs): the end-to-end
    ratio of env-steps/s and the update-only ratio of times (> 1: ``recipe`` is faster).

    ``same_commit``: both cells were recorded at one git commit (in this repository's GPU
    workflow, one call: the same machine, in one sitting). A ratio across commits compares
    timings from different calls, possibly different machines of the same kind."""
    keys = ["hardware", "network", "width", "num_envs"]
    x = table[table.recipe == recipe].set_index(keys)
    rows = []
    for b in baselines:
        y = table[table.recipe == b].set_index(keys)
        j = x.join(y, lsuffix="", rsuffix="_base", how="inner")
        for k, r in j.iterrows():
            rows.append({**dict(zip(keys, k)), "recipe": recipe, "baseline": b,
                         "e2e": r["env_steps_per_s"] / r["env_steps_per_s_base"],
                         "update": r["update_time_ms_base"] / r["update_time_ms"],
                         "memory": (r.get("update_memory_bytes", np.nan)
                                    / r.get("update_memory_bytes_base", np.nan)),
                         "emulated": bool(r["emulated"] or r["emulated_base"]),
                         "same_commit": results.same_commit(r.get("git_commit"),
                                                            r.get("git_commit_base"))})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m repro.rl.experiments {throughput,quality} [--profile P] [--recipe R]
    [--only GLOB] [--force] [--list]``: a subset of cells, e.g. one 8-minute GPU call each."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m repro.rl.experiments")
    ap.add_argument("study", choices=["throughput", "quality"])
    ap.add_argument("--profile", default="full")
    ap.add_argument("--recipe", action="append", help="restrict to recipes (repeatable)")
    ap.add_argument("--only", action="append", help="glob on cell names (repeatable)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the selected cells and exit")
    a = ap.parse_args(argv)
    recipes = [r for item in a.recipe or [] for r in item.split(",") if r] or None
    if a.list:
        name = THROUGHPUT if a.study == "throughput" else QUALITY
        p = config.stage_params(name, a.profile)
        if a.study == "throughput":
            use = [r for r in p.get("recipes", THROUGHPUT_RECIPES)
                   if recipes is None or r in recipes]
            cells = throughput_cells(p, use)
        else:
            use = [v for v in p["variants"]
                   if recipes is None or VARIANTS[v]["recipe"] in recipes]
            cells = quality_cells(p, use)
        for c in _select(cells, a.only):
            print(c[0])
        return 0
    fn = record_throughput if a.study == "throughput" else record_quality
    try:
        written = fn(a.profile, None, a.force, recipes=recipes, only=a.only)
    except CellsFailed as e:
        print("\n".join([f"{e.study}: failed cells:", *e.failures]))
        return 1
    print(f"{a.study} [{a.profile}]: wrote {len(written)} cell(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
