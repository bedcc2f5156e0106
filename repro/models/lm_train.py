"""Train the decoder LM under one precision recipe: AdamW, warmup + cosine, held-out eval,
orbax checkpoints that resume to the same result.

    from repro.models import lm as model, lm_train as train
    res = train.train(model.get_config("tiny"), train.TrainConfig(steps=100), "nvfp4")
    res.final_eval_loss, res.eval_history   # nats per byte

* Master weights and AdamW's moments are FP32 (``repro.precision.layers`` keeps FP32 params and casts
  per recipe); gradients are clipped to global norm ``grad_clip``.
* The learning rate warms up linearly for ``warmup_steps`` then follows a cosine to
  ``min_lr_ratio * lr`` at ``steps``.
* Every ``eval_every`` steps (and at the end) the mean loss over fixed held-out windows
  (``data.heldout_batches``) is recorded, with the mean training loss since the last eval.
* Deterministic and resumable: the batch of step ``s`` is a function of (seed, s), the
  quantization key (NVFP4 stochastic rounding, RHT signs) is ``fold_in(key(seed), s)`` on the
  flax rng stream ``"quant"``, and a checkpoint holds parameters, FP8_META state, optimizer
  state, the step and the curves. A run killed after step N and restarted from its checkpoint
  therefore computes exactly what the uninterrupted run computes (tested on CPU).
* ``time_budget_s`` stops a run cleanly (checkpoint written, ``finished=False``) so that one
  long run can span several time-limited jobs.
* ``stop_at`` truncates a run on purpose: it follows the schedule of ``steps`` (the same
  learning rate at every step as the whole run) but ends after ``stop_at`` steps, with an
  evaluation there, and counts as finished (``truncated_at`` says so). Its curve is the
  whole run's curve up to that step; for a slow reference recipe whose compared quantity
  (the best held-out loss) comes early.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from repro import hardware
from repro.models import lm as M
from repro.models import lm_data as D
from repro.models import sharding as distributed
from repro.precision import layers
from repro.precision.recipes import resolve


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 25
    eval_extra: tuple[int, ...] = ()  # more evaluation steps (e.g. log-spaced early ones)
    eval_batches: int = 4
    checkpoint_every: int = 0  # 0: only when stopping (time budget) and at the end
    seed: int = 0

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def eval_steps(self) -> list[int]:
        """Steps after which the held-out loss is measured: every ``eval_every``, the
        ``eval_extra`` steps, and always the last."""
        pts = (set(range(self.eval_every, self.steps + 1, self.eval_every)) if self.eval_every
               else set())
        pts |= {int(s) for s in self.eval_extra if 0 < int(s) <= self.steps}
        return sorted(pts | {self.steps})


@dataclass
class TrainResult:
    steps_done: int
    finished: bool
    # {"step", "tokens", "eval_loss", "train_loss", "lr"}; "lr": that of the step's last update
    eval_history: list[dict[str, float]]
    final_eval_loss: float | None
    n_params: int
    tokens_per_step: int
    wall_s: float  # this process only (a resumed run restarts the clock)
    steps_this_process: int
    compiled_memory: dict[str, int] = field(default_factory=dict)
    peak_bytes_in_use: int | None = None
    resumed_from: int | None = None
    variables: Any = None
    truncated_at: int | None = None  # ``stop_at`` of a run truncated on purpose

    @property
    def tokens_per_s(self) -> float:
        return self.steps_this_process * self.tokens_per_step / max(self.wall_s, 1e-9)


def make_schedule(tc: TrainConfig) -> optax.Schedule:
    """Linear warmup from 0 to ``lr``, cosine decay to ``min_lr_ratio * lr`` at ``steps``."""
    warm = max(1, min(tc.warmup_steps, tc.steps - 1))
    return optax.warmup_cosine_decay_schedule(0.0, tc.lr, warm, max(tc.steps, warm + 1),
                                              end_value=tc.lr * tc.min_lr_ratio)


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW (FP32 moments); no weight decay on norms/embedding."""
    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: getattr(path[-1], "key", "") == "kernel", params)

    return optax.chain(
        optax.clip_by_global_norm(tc.grad_clip),
        optax.adamw(make_schedule(tc), b1=tc.b1, b2=tc.b2, eps=tc.eps,
                    weight_decay=tc.weight_decay, mask=decay_mask),
    )


# ------------------------------------------------------------------- compiled functions


def _static_key(tc: TrainConfig) -> TrainConfig:
    """The parts of TrainConfig baked into the compiled step (the seed is a traced arg)."""
    return tc.replace(seed=0, eval_every=0, eval_batches=0, checkpoint_every=0)


def _raw_functions(cfg: M.LMConfig, recipe, tc_static: TrainConfig, gather=None):
    """(init, step, eval), not jitted: :func:`_functions` jits them for one device,
    :func:`_sharded_functions` with data-parallel / FSDP shardings.

    ``gather`` (FSDP): applied to the variables where the forward pass reads them (a sharding
    constraint to "replicated": XLA all-gathers the weights and, in the backward pass,
    reduce-scatters their gradients), so the GEMMs run data-parallel on whole weights."""
    model = M.Decoder(cfg, recipe)
    tx = make_optimizer(tc_static)
    gather = gather or (lambda v: v)

    def init(seed, tokens):
        variables = model.init(jax.random.fold_in(jax.random.key(0), seed), tokens)
        variables = layers.init_amax_ring(variables, recipe)  # a "ring" recipe's histories
        return variables, tx.init(variables["params"])

    def loss_fn(variables, x, y, qkey):
        return M.cross_entropy(model.apply(gather(variables), x, rngs={"quant": qkey}), y)

    def step(variables, opt_state, x, y, seed, step_i):
        qkey = jax.random.fold_in(jax.random.fold_in(jax.random.key(1), seed), step_i)
        loss, grads = jax.value_and_grad(loss_fn)(variables, x, y, qkey)
        variables, opt_state = layers.apply_gradients(variables, grads, tx, opt_state)
        return variables, opt_state, loss

    def evaluate(variables, x, y):
        return M.cross_entropy(model.apply(gather(variables), x), y)

    return init, step, evaluate


@functools.lru_cache(maxsize=16)
def _functions(cfg: M.LMConfig, recipe, tc_static: TrainConfig, donate: bool):
    """(init, step, eval) jitted once per (model, recipe, optimizer) and shared by seeds."""
    init, step, evaluate = _raw_functions(cfg, recipe, tc_static)
    return (jax.jit(init), jax.jit(step, donate_argnums=(0, 1) if donate else ()),
            jax.jit(evaluate))


_COMPILED: dict = {}


# ------------------------------------------------------- data-parallel and FSDP training
# Data-parallel and FSDP training of the decoder LM (claim B5), through ``jax.sharding``.
#
#     from repro.models import sharding as distributed
#     from repro.models import lm as model, lm_train as train
#     mesh = distributed.make_mesh(8, fsdp=4)              # ("data", "fsdp") = (2, 4)
#     res = train.train("tiny", train.TrainConfig(batch_size=8), "nvfp4", mesh=mesh, fsdp=True)
#
# ``train.train(..., mesh=mesh, fsdp=...)`` runs the same step function as on one device
# (``train._raw_functions``), jitted here with shardings:
#
# * batch ``[B, T]``: ``PartitionSpec(("data", "fsdp"))`` (or ``"data"`` on a 1-D mesh) on B,
#   placed with ``jax.make_array_from_callback`` (each process fills its own shards of the
#   deterministic global batch, so the same code runs multi-host);
# * parameters: replicated (``fsdp=False``: data parallelism) or split over "fsdp" along their
#   largest divisible axis (``fsdp=True``; ``repro.models.sharding.param_specs``: parameters under
#   ``MIN_FSDP_SIZE`` elements and all FP8_META state replicated);
# * optimizer state: the same rule, so Adam's moments are split like their parameters and the
#   step counter is replicated;
# * the loss: replicated (a mean over the sharded batch: an all-reduce).
#
# XLA inserts the collectives: with replicated parameters, an all-reduce of the gradients; with
# FSDP, all-gathers of the weights and reduce-scatters of their gradients. For FSDP the forward
# pass reads the variables through a sharding constraint to "replicated"
# (``train._raw_functions(gather=...)``): without it XLA kept some GEMMs on split weights and
# moved the activations instead (on the H200, 157 all-to-alls in the 120m step on 2 GPUs, which
# ran slower than one GPU; ``tests/test_distributed.py`` checks the step has none). The weights
# are gathered whole, so a device holds a full copy of the parameters during the step (not of
# Adam's moments): ZeRO-3's memory saving only for the optimizer state at these sizes.
#
# The quantization recipes need nothing more: the FP8 delayed-scaling amaxes and the NVFP4
# per-tensor amaxes are ``jnp.max`` reductions, global over the shards; the NVFP4 random bits
# come from ``jax.random`` with a key that does not depend on the device count (threefry is
# partitionable), so a sharded run computes the single-device values up to the order of
# floating-point reductions (tested on 8 simulated CPU devices, 8x1 and 2x4 meshes).
#
# Checkpoints (orbax, ``train._save`` / ``train._restore``) write the global arrays from their
# shards and restore each leaf with the sharding of the current run's state.


def _check_batch(batch_size: int, mesh: Mesh) -> None:
    n = distributed.data_size(mesh)
    if batch_size % n:
        raise ValueError(f"batch_size={batch_size} is not divisible by the {n} devices of the "
                         f"mesh's batch axes {distributed.batch_axes(mesh)}")


def _state_shardings(cfg: M.LMConfig, recipe, tc_static, mesh: Mesh, fsdp: bool):
    """(variables, opt_state) ``NamedSharding`` trees for one model/recipe/optimizer."""
    init, _, _ = _raw_functions(cfg, recipe, tc_static)
    abstract = jax.eval_shape(init, jnp.int32(0), jnp.zeros((1, cfg.seq_len), jnp.int32))
    return tuple(distributed.tree_shardings(t, mesh, fsdp) for t in abstract)


@functools.lru_cache(maxsize=16)
def _sharded_functions(cfg: M.LMConfig, recipe, tc_static, donate: bool, mesh: Mesh, fsdp: bool):
    """(init, step, eval) of ``train._raw_functions`` jitted with the shardings above."""
    rep = distributed.replicated(mesh)
    # FSDP: the forward pass reads the weights all-gathered (see the module's docstring)
    gather = (lambda v: jax.lax.with_sharding_constraint(v, rep)) if fsdp else None
    init, step, evaluate = _raw_functions(cfg, recipe, tc_static, gather)
    var_sh, opt_sh = _state_shardings(cfg, recipe, tc_static, mesh, fsdp)
    batch = distributed.batch_sharding(mesh, 2)
    return (
        jax.jit(init, in_shardings=(rep, rep), out_shardings=(var_sh, opt_sh)),
        jax.jit(step, in_shardings=(var_sh, opt_sh, batch, batch, rep, rep),
                out_shardings=(var_sh, opt_sh, rep), donate_argnums=(0, 1) if donate else ()),
        jax.jit(evaluate, in_shardings=(var_sh, batch, batch), out_shardings=rep),
    )


def _batch_putter(mesh: Mesh) -> Callable[[Any], jax.Array]:
    """``put(x)``: a host batch ``[B, ...]`` as a global array split over the batch axes."""
    def put(x):
        x = np.asarray(x)
        return distributed.put_global(x, distributed.batch_sharding(mesh, x.ndim))
    return put



# -------------------------------------------------------------------------- checkpoints


def _manager(ckpt_dir: Path):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(
        ckpt_dir.resolve(),
        options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True),
    )


def _save(mgr, step: int, variables, opt_state, meta: dict) -> None:
    import orbax.checkpoint as ocp

    mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"variables": variables, "opt_state": opt_state}),
        meta=ocp.args.JsonSave(meta)), force=True)
    mgr.wait_until_finished()


def _restore(mgr, variables, opt_state):
    import orbax.checkpoint as ocp

    step = mgr.latest_step()
    if step is None:
        return None
    target = {"variables": variables, "opt_state": opt_state}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    out = mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return step, out["state"]["variables"], out["state"]["opt_state"], dict(out["meta"])


def _fingerprint(cfg, recipe, tc: TrainConfig) -> str:
    return json.dumps({"model": dataclasses.asdict(cfg), "recipe": str(getattr(recipe, "name",
                       recipe)), "train": dataclasses.asdict(tc)}, sort_keys=True)


# --------------------------------------------------------------------------------- train


def _memory_analysis(compiled) -> dict[str, int]:
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return {}
    if m is None:
        return {}
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
            "alias_size_in_bytes", "generated_code_size_in_bytes")
    out = {k: int(getattr(m, k)) for k in keys if hasattr(m, k)}
    if out:
        out["total_bytes"] = (out.get("argument_size_in_bytes", 0)
                              + out.get("output_size_in_bytes", 0)
                              + out.get("temp_size_in_bytes", 0)
                              - out.get("alias_size_in_bytes", 0))
    return out


def _peak_bytes() -> int | None:
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001
        return None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def train(cfg: M.LMConfig | str, tc: TrainConfig, recipe="bf16", *, corpus=None,
          ckpt_dir: str | Path | None = None, time_budget_s: float | None = None,
          stop_after: int | None = None, stop_at: int | None = None, progress: bool = True,
          keep_variables: bool = False,
          bytes_limit: int | None = None, desc: str | None = None, mesh=None,
          fsdp: bool = False) -> TrainResult:
    """Train (or resume) one run; see the module docstring.

    ``ckpt_dir``: resume from the latest checkpoint there, and checkpoint into it. A
    checkpoint written by a different model/recipe/TrainConfig is refused (one-line error).
    ``stop_after``: stop (with a checkpoint) after this global step, as a kill would; for tests.
    ``stop_at``: end the run after this step (a truncated run, see the module docstring).
    All input checks (``data.preflight``) run before anything is compiled.
    ``mesh`` (a ``jax.sharding.Mesh``, see ``repro.models.sharding.make_mesh``): data-parallel
    training, the batch split over the mesh; ``fsdp=True`` also splits parameters and
    optimizer state over its "fsdp" axis (:func:`_sharded_functions`). Checkpoints hold the global
    arrays, so a run may resume on another mesh.
    """
    t_call = time.monotonic()  # the time budget counts compilation too
    cfg = M.get_config(cfg)
    recipe_obj = resolve(recipe)
    if recipe_obj.backend == "jax":
        from repro.precision.peers import check_jax_nvfp4_available

        check_jax_nvfp4_available()
    if tc.steps < 1:
        raise ValueError(f"steps must be >= 1, got {tc.steps}")
    if stop_at is not None and not 1 <= stop_at <= tc.steps:
        raise ValueError(f"stop_at must be in [1, steps={tc.steps}], got {stop_at}")
    end = tc.steps if stop_at is None else int(stop_at)
    splits = D.preflight(cfg, tc.batch_size, corpus, bytes_limit=bytes_limit, recipe=recipe_obj)
    if tc.eval_batches * tc.batch_size * (cfg.seq_len + 1) > 50 * splits.heldout.size:
        warnings.warn("evaluation windows overlap heavily: the held-out split is small",
                      stacklevel=2)
    evals = D.heldout_batches(splits.heldout, cfg.seq_len, tc.batch_size,
                              max(1, tc.eval_batches))
    on_gpu = hardware.platform() == "gpu"
    if mesh is None:
        init_fn, step_fn, eval_fn = _functions(cfg, recipe_obj, _static_key(tc), on_gpu)
        put = jnp.asarray
    else:
        _check_batch(tc.batch_size, mesh)
        init_fn, step_fn, eval_fn = _sharded_functions(cfg, recipe_obj, _static_key(tc), on_gpu,
                                                       mesh, bool(fsdp))
        put = _batch_putter(mesh)
    seed = jnp.int32(tc.seed)

    x0, _ = D.train_batch(splits.train, 0, tc.batch_size, cfg.seq_len, tc.seed)
    variables, opt_state = init_fn(seed, jnp.asarray(x0))
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(variables["params"]))

    fingerprint = _fingerprint(cfg, recipe_obj, tc)
    mgr, start, history, resumed = None, 0, [], None
    pending_restored: list[float] = []
    if ckpt_dir is not None:
        mgr = _manager(Path(ckpt_dir))
        got = _restore(mgr, variables, opt_state)
        if got is not None:
            start, variables, opt_state, meta = got
            if meta.get("fingerprint") != fingerprint:
                raise ValueError(f"checkpoint in {ckpt_dir} was written by a different run "
                                 "configuration; remove it or use another directory")
            history, resumed = list(meta["history"]), start
            if start > end:
                raise ValueError(f"checkpoint in {ckpt_dir} is at step {start}, past "
                                 f"stop_at={end}; remove it or drop stop_at")
            pending_restored = [float(v) for v in meta.get("pending", [])]

    eval_at = set(tc.eval_steps()) | {end}
    tokens_per_step = tc.batch_size * cfg.seq_len
    sched = make_schedule(tc)

    def do_eval():
        return float(np.mean([float(eval_fn(variables, put(x), put(y))) for x, y in evals]))

    # Compile the step ahead of time (once per model/recipe/optimizer/batch shape: seeds share
    # it); its memory analysis is claim B3's "compiled" number.
    key = (cfg, recipe_obj, _static_key(tc), on_gpu) + (() if mesh is None else
                                                        (mesh, bool(fsdp)))
    if key not in _COMPILED:
        x, y = D.train_batch(splits.train, start, tc.batch_size, cfg.seq_len, tc.seed)
        c = step_fn.lower(variables, opt_state, put(x), put(y), seed,
                          jnp.int32(start)).compile()
        while len(_COMPILED) >= 12:  # a study cycles through ~11 recipes, seed by seed
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = (c, _memory_analysis(c))
    compiled, mem = _COMPILED[key]

    from tqdm import tqdm

    bar = tqdm(total=end, initial=start, disable=not progress, leave=False,
               desc=desc or f"{cfg.name} {getattr(recipe_obj, 'name', recipe_obj)} s{tc.seed}")
    t0 = time.monotonic()
    pending: list = list(pending_restored)  # train losses since the last eval point
    step = start
    stopped = False
    while step < end:
        x, y = D.train_batch(splits.train, step, tc.batch_size, cfg.seq_len, tc.seed)
        variables, opt_state, loss = compiled(variables, opt_state, put(x), put(y), seed,
                                              jnp.int32(step))
        pending.append(loss)
        step += 1
        bar.update(1)
        if step in eval_at:
            train_loss = float(np.mean([float(v) for v in pending])) if pending else math.nan
            pending = []
            ev = do_eval()
            if not math.isfinite(ev):
                warnings.warn(f"{cfg.name}/{getattr(recipe_obj, 'name', recipe_obj)} seed "
                              f"{tc.seed}: non-finite eval loss at step {step}", stacklevel=2)
            history.append({"step": step, "tokens": step * tokens_per_step, "eval_loss": ev,
                            "train_loss": train_loss,
                            "lr": float(sched(step - 1))})  # of the last update applied
            bar.set_postfix(eval=f"{ev:.3f}")
        more = step < end
        budget_hit = (more and time_budget_s is not None
                      and time.monotonic() - t_call > time_budget_s)
        killed = more and stop_after is not None and step >= stop_after
        periodic = tc.checkpoint_every and step % tc.checkpoint_every == 0
        if mgr is not None and (budget_hit or killed or (periodic and more)):
            _save(mgr, step, variables, opt_state, {
                "fingerprint": fingerprint, "history": history, "step": step,
                "pending": [float(v) for v in pending]})
        if budget_hit or killed:
            stopped = True
            break
    jax.block_until_ready(variables)
    wall = time.monotonic() - t0
    bar.close()
    finished = step >= end and not stopped
    if finished and mgr is not None and resumed != step:
        _save(mgr, step, variables, opt_state, {"fingerprint": fingerprint,
                                                "history": history, "step": step,
                                                "pending": []})
    final = history[-1]["eval_loss"] if finished and history else None
    return TrainResult(
        steps_done=step, finished=finished, eval_history=history, final_eval_loss=final,
        n_params=n_params, tokens_per_step=tokens_per_step, wall_s=wall,
        steps_this_process=step - start, compiled_memory=mem, peak_bytes_in_use=_peak_bytes(),
        resumed_from=resumed, variables=variables if keep_variables else None,
        truncated_at=end if end < tc.steps else None)


def remove_checkpoints(ckpt_dir: str | Path) -> None:
    shutil.rmtree(ckpt_dir, ignore_errors=True)
