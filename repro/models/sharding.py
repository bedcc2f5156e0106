"""Data-parallel and FSDP training through ``jax.sharding`` (claim B5): meshes, specs, start-up.

Everything here is GSPMD: a computation is written for the GLOBAL batch, ``jax.jit`` gets the
shardings of its inputs and outputs (``NamedSharding(mesh, PartitionSpec(...))``), and
``jax.lax.with_sharding_constraint`` pins intermediate arrays; XLA partitions the program and
inserts the collectives. A mean over a batch-sharded loss therefore becomes a local sum plus an
all-reduce, and so does its gradient with respect to replicated parameters: the data-parallel
gradient all-reduce. A ``jnp.max`` over a sharded array is a local max plus an all-reduce(max),
so the delayed-scaling amax of an FP8 layer is the GLOBAL amax over all devices, exactly as on
one device (tested: ``tests/test_distributed.py``).

Meshes (:func:`make_mesh`):

* ``("data",)``: data parallelism. The batch is split over "data"; parameters, FP8_META state
  and optimizer state are replicated.
* ``("data", "fsdp")``: fully sharded data parallelism (ZeRO-3). The batch is split over BOTH
  axes (every device sees different examples); each large parameter, and its optimizer state, is
  split over "fsdp" along its largest divisible axis (:func:`fsdp_spec`); XLA all-gathers a
  weight where a GEMM needs it and reduce-scatters its gradient. Small parameters (norm scales,
  biases: fewer than ``min_size`` elements) and the FP8_META collection (delayed-scaling amax
  histories and scales, the NVFP4 step counter) stay replicated.

Multi-host: call :func:`initialize_from_env` first thing in every process; it runs
``jax.distributed.initialize()`` when the environment says this is one of several processes, and
does nothing otherwise. Then ``jax.devices()`` lists the devices of ALL hosts and the same mesh
code spans them. Global batches are built with ``jax.make_array_from_callback`` (each process
fills only its own shards; see :func:`put_global`).

Uses only stable public APIs (``jax.sharding.Mesh``, ``NamedSharding``, ``PartitionSpec``,
``jax.jit`` in/out shardings, ``jax.lax.with_sharding_constraint``, ``jax.distributed``). The mesh
axes are ``Auto`` (GSPMD propagation), built with ``Mesh`` directly: ``jax.make_mesh`` defaults
to ``Explicit`` axes in recent JAX versions.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["DATA", "FSDP", "make_mesh", "initialize_from_env", "multihost_env",
           "batch_axes", "batch_spec", "batch_sharding", "replicated", "fsdp_spec",
           "param_specs", "specs_for", "tree_shardings", "constrain_batch", "put_global",
           "data_size", "fsdp_size", "is_simulated"]

DATA = "data"
FSDP = "fsdp"
MIN_FSDP_SIZE = 1024  # parameters smaller than this (elements) stay replicated


# -------------------------------------------------------------------------------- meshes


def make_mesh(n_devices: int | None = None, fsdp: bool | int = False,
              devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh over the first ``n_devices`` devices (all by default).

    ``fsdp=False``: 1-D ``("data",)``. ``fsdp=True``: 2-D ``("data", "fsdp")`` with every
    device on "fsdp" (shape ``(1, n)``); ``fsdp=k`` (an int): shape ``(n // k, k)``.
    """
    devs = list(devices if devices is not None else jax.devices())
    n = len(devs) if n_devices is None else int(n_devices)
    if not 1 <= n <= len(devs):
        raise ValueError(f"make_mesh: n_devices={n_devices} but {len(devs)} device(s) exist")
    devs = devs[:n]
    if fsdp is False or fsdp is None:
        return Mesh(np.asarray(devs, dtype=object).reshape(n), (DATA,))
    k = n if fsdp is True else int(fsdp)
    if k < 1 or n % k:
        raise ValueError(f"make_mesh: fsdp={fsdp} does not divide n_devices={n}")
    return Mesh(np.asarray(devs, dtype=object).reshape(n // k, k), (DATA, FSDP))


def data_size(mesh: Mesh) -> int:
    """How many ways the batch is split (product of the batch axes)."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def fsdp_size(mesh: Mesh) -> int:
    return int(mesh.shape.get(FSDP, 1))


def is_simulated(devices: Sequence[Any] | None = None) -> bool:
    """True when the devices are CPU devices (``--xla_force_host_platform_device_count``
    fakes sharing one host's cores): a run on them checks equivalence, not scaling."""
    devs = list(devices if devices is not None else jax.devices())
    return any(d.platform == "cpu" for d in devs)


# ----------------------------------------------------------------------- multi-host start


def multihost_env(environ: dict[str, str] | None = None) -> str | None:
    """Which multi-process launcher the environment shows, or None for a single process.

    * ``JAX_COORDINATOR_ADDRESS`` (with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``; optional
      ``JAX_LOCAL_DEVICE_IDS``): a manual launch, e.g. one process per host.
    * Slurm: ``SLURM_JOB_ID`` with ``SLURM_NTASKS`` (or ``SLURM_NPROCS``) > 1.
    * Open MPI: ``OMPI_COMM_WORLD_SIZE`` > 1.
    ``REPRO_DISTRIBUTED=0`` disables detection (e.g. one process per task by choice).
    """
    env = os.environ if environ is None else environ
    if env.get("REPRO_DISTRIBUTED", "1") == "0":
        return None
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return "coordinator"
    if env.get("SLURM_JOB_ID") and int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1"))
                                       or 1) > 1:
        return "slurm"
    if int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
        return "ompi"
    return None


def initialize_from_env(environ: dict[str, str] | None = None) -> bool:
    """Start JAX's distributed runtime when this is one of several processes; else a no-op.

    Call it before anything touches a device. Returns True when ``jax.distributed.initialize``
    ran (or had already run), False in a single-process run. With ``JAX_COORDINATOR_ADDRESS``
    the process count and id come from ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` (both
    required); under Slurm and Open MPI JAX detects everything itself.
    """
    env = os.environ if environ is None else environ
    kind = multihost_env(env)
    if kind is None:
        return False
    if jax.distributed.is_initialized():
        return True
    if kind == "coordinator":
        missing = [k for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if not env.get(k)]
        if missing:
            raise ValueError(f"JAX_COORDINATOR_ADDRESS is set but {', '.join(missing)} "
                             "is not: set all three (or unset JAX_COORDINATOR_ADDRESS)")
        kwargs: dict[str, Any] = dict(coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
                                      num_processes=int(env["JAX_NUM_PROCESSES"]),
                                      process_id=int(env["JAX_PROCESS_ID"]))
        if ids := env.get("JAX_LOCAL_DEVICE_IDS"):
            kwargs["local_device_ids"] = [int(i) for i in ids.split(",") if i.strip()]
        jax.distributed.initialize(**kwargs)
    else:
        jax.distributed.initialize()
    return True


# ------------------------------------------------------------------------------- specs


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the batch is split over: "data", and "fsdp" where the mesh has it."""
    return tuple(a for a in (DATA, FSDP) if a in mesh.axis_names)


def batch_spec(mesh: Mesh, ndim: int = 1, axis: int = 0) -> P:
    """``PartitionSpec`` splitting dimension ``axis`` of an ``ndim``-D array over the batch
    axes; every other dimension replicated."""
    axes = batch_axes(mesh)
    entry = axes[0] if len(axes) == 1 else axes
    spec = [None] * ndim
    spec[axis] = entry
    return P(*spec)


def batch_sharding(mesh: Mesh, ndim: int = 1, axis: int = 0) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(mesh, ndim, axis))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def fsdp_spec(shape: Sequence[int], n_fsdp: int, min_size: int = MIN_FSDP_SIZE,
              axis_name: str = FSDP) -> P:
    """The FSDP ``PartitionSpec`` of one array: its largest dimension divisible by ``n_fsdp``
    split over ``axis_name`` (the first such dimension on a tie); replicated when ``n_fsdp`` is
    1, the array has fewer than ``min_size`` elements, or no dimension divides."""
    shape = tuple(int(s) for s in shape)
    if n_fsdp <= 1 or not shape or math.prod(shape) < min_size:
        return P()
    best = None
    for i, s in enumerate(shape):
        if s % n_fsdp == 0 and (best is None or s > shape[best]):
            best = i
    if best is None:
        return P()
    spec = [None] * len(shape)
    spec[best] = axis_name
    return P(*spec)


def _is_meta_path(path) -> bool:
    from repro.precision.layers import FP8_META

    return any(getattr(k, "key", getattr(k, "name", None)) == FP8_META for k in path)


def param_specs(tree: Any, mesh: Mesh, fsdp: bool = True,
                min_size: int = MIN_FSDP_SIZE) -> Any:
    """``PartitionSpec`` per leaf of a variables / optimizer-state tree.

    ``fsdp=False`` or a mesh without "fsdp": every leaf replicated (data parallelism).
    Otherwise :func:`fsdp_spec` per leaf, except leaves under the FP8_META collection
    (delayed-scaling histories and scales, NVFP4 step counters), always replicated. The rule
    depends on the shape only, so Adam's moments get the specs of their parameters.
    """
    return specs_for(tree, fsdp_size(mesh) if fsdp else 1, min_size)


def specs_for(tree: Any, n_fsdp: int, min_size: int = MIN_FSDP_SIZE) -> Any:
    """:func:`param_specs` for an "fsdp" axis of ``n_fsdp`` devices (no mesh needed)."""
    def one(path, leaf):
        if n_fsdp <= 1 or _is_meta_path(path):
            return P()
        return fsdp_spec(getattr(leaf, "shape", ()), n_fsdp, min_size)

    return jax.tree_util.tree_map_with_path(one, tree)


def tree_shardings(tree: Any, mesh: Mesh, fsdp: bool = True,
                   min_size: int = MIN_FSDP_SIZE) -> Any:
    """``NamedSharding`` per leaf (see :func:`param_specs`)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s),
                        param_specs(tree, mesh, fsdp, min_size),
                        is_leaf=lambda x: isinstance(x, P))


def constrain_batch(mesh: Mesh, axis: int = 0) -> Callable[[Any], Any]:
    """``f(tree)``: ``with_sharding_constraint`` splitting dimension ``axis`` of every array
    leaf over the batch axes (leaves with fewer dimensions, e.g. PRNG keys, are left alone)."""
    def f(tree):
        def one(x):
            nd = getattr(x, "ndim", 0)
            if nd <= axis or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                return x
            return jax.lax.with_sharding_constraint(x, batch_sharding(mesh, nd, axis))
        return jax.tree.map(one, tree)
    return f


def put_global(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from a host array that every process holds in full (e.g. a batch that is
    a deterministic function of (seed, step)): each process places only its own shards, so
    the same call works on one host and on many."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
