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
  compiling warm-up (``repro.studies.gemm.time_fn``).
* ``update_time_ms`` -- one PPO update alone (``ppo.make_update_step``) on a synthetic rollout
  of the same size: the part of the loop whose GEMMs FP8 can speed up.
* ``update_memory_bytes`` -- the compiled update's buffers (arguments + outputs + temporaries
  - aliased), from XLA's ``memory_analysis()`` (every backend). Where the device reports
  ``memory_stats()`` the process peak is kept in ``extra`` too (it is cumulative over the
  process, so it is not a per-recipe number).
* ``extra.fp8_gemm_calls`` / ``extra.fp8_lowering`` -- cuBLASLt FP8 GEMM calls in the compiled
  update and how its f8 products lowered (``repro.studies.gemm.fp8_lowering``: small GEMMs get XLA's
  Triton GEMM with f8 operands, also FP8 tensor-core math); an FP8 recipe on a GPU whose
  program ran no FP8 GEMM is marked ``emulated`` (``repro.studies.gemm.recipe_emulated``).
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

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repro import config, results
from repro.models import ppo
from repro.precision import optim
from repro.precision.recipes import REGISTRY, resolve, value_formats
from repro.studies.timing import compiled_facts, recipe_emulated

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
    """(median s, IQR s, samples): repro.studies.gemm.time_fn when present, else the same by hand."""
    try:
        from repro.studies.timing import time_fn
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
        recipe=recipe,
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
    throughput cell times and ``repro.studies.kernel_times ppo`` traces."""
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
    r = resolve(base)
    # an FP8 CNN's backward convolutions are emulated through BF16 (repro.precision.ops.fp8_conv): the
    # cell's speed is not FP8's even where its GEMMs and forward convolutions are native
    conv_emulated = network != "mlp" and r.gemm == "fp8"
    emulated = recipe_emulated(r, facts["fp8_lowering"], info) or conv_emulated
    sizes = {"network": network, "width": width, "depth": c.depth, "num_envs": num_envs,
             "num_steps": c.num_steps, "env": c.env, "batch": c.batch_size,
             "minibatch": c.minibatch_size, "update_epochs": c.update_epochs}
    extra = {"fp8_gemm_calls": fp8_calls, "fp8_lowering": facts["fp8_lowering"],
             "compile_e2e_s": compile_e2e,
             "compile_update_s": compile_upd, "updates_per_call": c.num_updates,
             "scope": resolve(c.recipe).scope, "device_peak_bytes": _device_peak_bytes(),
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
    all_recipes = list(p["recipes"])
    use = all_recipes if recipes is None else [r for r in all_recipes if r in recipes]
    for r in list(recipes or []) + all_recipes:
        resolve(r)  # one-line error for an unknown name, before any work
    for network, env in p["networks"].items():
        ppo.validate(dict(env=env, network=network))
    root = Path(root) if root is not None else results.record_root(profile)
    written = []
    if force or not results.have_cell(THROUGHPUT, "stores", root=root):
        written.append(results.write_records(stores_records(profile, stores_names(all_recipes)), THROUGHPUT, "stores",
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
