"""Data-parallel and FSDP training of the decoder LM (claim B5), through ``jax.sharding``.

    from repro import distributed
    from repro.lm import model, train
    mesh = distributed.make_mesh(8, fsdp=4)              # ("data", "fsdp") = (2, 4)
    res = train.train("tiny", train.TrainConfig(batch_size=8), "nvfp4", mesh=mesh, fsdp=True)

``train.train(..., mesh=mesh, fsdp=...)`` runs the same step function as on one device
(``train._raw_functions``), jitted here with shardings:

* batch ``[B, T]``: ``PartitionSpec(("data", "fsdp"))`` (or ``"data"`` on a 1-D mesh) on B,
  placed with ``jax.make_array_from_callback`` (each process fills its own shards of the
  deterministic global batch, so the same code runs multi-host);
* parameters: replicated (``fsdp=False``: data parallelism) or split over "fsdp" along their
  largest divisible axis (``fsdp=True``; ``repro.distributed.param_specs``: parameters under
  ``MIN_FSDP_SIZE`` elements and all FP8_META state replicated);
* optimizer state: the same rule, so Adam's moments are split like their parameters and the
  step counter is replicated;
* the loss: replicated (a mean over the sharded batch: an all-reduce).

XLA inserts the collectives: with replicated parameters, an all-reduce of the gradients; with
FSDP, all-gathers of the weights and reduce-scatters of their gradients. For FSDP the forward
pass reads the variables through a sharding constraint to "replicated"
(``train._raw_functions(gather=...)``): without it XLA kept some GEMMs on split weights and
moved the activations instead (on the H200, 157 all-to-alls in the 120m step on 2 GPUs, which
ran slower than one GPU; ``tests/test_distributed.py`` checks the step has none). The weights
are gathered whole, so a device holds a full copy of the parameters during the step (not of
Adam's moments): ZeRO-3's memory saving only for the optimizer state at these sizes.

The quantization recipes need nothing more: the FP8 delayed-scaling amaxes and the NVFP4
per-tensor amaxes are ``jnp.max`` reductions, global over the shards; the NVFP4 random bits
come from ``jax.random`` with a key that does not depend on the device count (threefry is
partitionable), so a sharded run computes the single-device values up to the order of
floating-point reductions (tested on 8 simulated CPU devices, 8x1 and 2x4 meshes).

Checkpoints (orbax, ``train._save`` / ``train._restore``) write the global arrays from their
shards and restore each leaf with the sharding of the current run's state.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from repro import distributed
from repro.lm import model as M


def check_batch(batch_size: int, mesh: Mesh) -> None:
    n = distributed.data_size(mesh)
    if batch_size % n:
        raise ValueError(f"batch_size={batch_size} is not divisible by the {n} devices of the "
                         f"mesh's batch axes {distributed.batch_axes(mesh)}")


def state_shardings(cfg: M.LMConfig, recipe, tc_static, mesh: Mesh, fsdp: bool):
    """(variables, opt_state) ``NamedSharding`` trees for one model/recipe/optimizer."""
    from repro.lm import train as T

    init, _, _ = T._raw_functions(cfg, recipe, tc_static)
    abstract = jax.eval_shape(init, jnp.int32(0), jnp.zeros((1, cfg.seq_len), jnp.int32))
    return tuple(distributed.tree_shardings(t, mesh, fsdp) for t in abstract)


@functools.lru_cache(maxsize=16)
def functions(cfg: M.LMConfig, recipe, tc_static, donate: bool, mesh: Mesh, fsdp: bool):
    """(init, step, eval) of ``train._raw_functions`` jitted with the shardings above."""
    from repro.lm import train as T

    rep = distributed.replicated(mesh)
    # FSDP: the forward pass reads the weights all-gathered (see the module's docstring)
    gather = (lambda v: jax.lax.with_sharding_constraint(v, rep)) if fsdp else None
    init, step, evaluate = T._raw_functions(cfg, recipe, tc_static, gather)
    var_sh, opt_sh = state_shardings(cfg, recipe, tc_static, mesh, fsdp)
    batch = distributed.batch_sharding(mesh, 2)
    return (
        jax.jit(init, in_shardings=(rep, rep), out_shardings=(var_sh, opt_sh)),
        jax.jit(step, in_shardings=(var_sh, opt_sh, batch, batch, rep, rep),
                out_shardings=(var_sh, opt_sh, rep), donate_argnums=(0, 1) if donate else ()),
        jax.jit(evaluate, in_shardings=(var_sh, batch, batch), out_shardings=rep),
    )


def batch_putter(mesh: Mesh) -> Callable[[Any], jax.Array]:
    """``put(x)``: a host batch ``[B, ...]`` as a global array split over the batch axes."""
    def put(x):
        x = np.asarray(x)
        return distributed.put_global(x, distributed.batch_sharding(mesh, x.ndim))
    return put
