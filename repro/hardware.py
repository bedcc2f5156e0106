"""Which device runs, and what its datasheet says it can do.

``detect()`` looks at JAX's first device; ``registry()`` reads ``repro/data/hardware.yaml``
(datasheet dense peaks and bandwidth of NVIDIA GPUs and Google TPUs, matched by JAX's
``device_kind``). Unknown devices run with a warning and no peaks; ``repro record --hardware
NAME`` records under another name.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml


@dataclass(frozen=True)
class HardwareInfo:
    slug: str
    name: str
    backend: str  # "gpu", "cpu", "tpu"
    compute_capability: str | None = None
    peak_tflops: dict[str, float | None] = field(default_factory=dict)
    memory_bandwidth_tbs: float | None = None
    memory_gib: float | None = None

    @property
    def cc_major(self) -> int:
        return int(self.compute_capability.split(".")[0]) if self.compute_capability else 0

    @property
    def has_fp8(self) -> bool:
        """FP8 arithmetic: tensor cores of compute capability >= 8.9 on a GPU; on a TPU, an
        ``fp8`` peak in the registry (none of v5e, v5p, v6e has one)."""
        if self.backend == "tpu":
            return bool(self.peak_tflops.get("fp8"))
        return self.backend == "gpu" and (self.cc_major, self.cc_minor) >= (8, 9)

    @property
    def has_fp4(self) -> bool:
        """Native block-scaled FP4/MXFP8 tensor cores (Blackwell, compute capability >= 10)."""
        if self.backend == "tpu":
            return bool(self.peak_tflops.get("fp4"))
        return self.backend == "gpu" and self.cc_major >= 10

    @property
    def has_int8(self) -> bool:
        """INT8 products on the matrix units (``s8 x s8 -> s32``): tensor cores of compute
        capability >= 7.5 on a GPU; on a TPU, an ``int8`` peak in the registry."""
        if self.backend == "tpu":
            return bool(self.peak_tflops.get("int8"))
        return self.backend == "gpu" and (self.cc_major, self.cc_minor) >= (7, 5)

    @property
    def native_formats(self) -> tuple[str, ...]:
        """The narrow formats this device multiplies natively, of fp8, fp4 and int8."""
        return tuple(f for f, ok in (("fp8", self.has_fp8), ("fp4", self.has_fp4),
                                     ("int8", self.has_int8)) if ok)

    @property
    def cc_minor(self) -> int:
        return int(self.compute_capability.split(".")[1]) if self.compute_capability else 0


@functools.cache
def registry() -> dict[str, dict[str, Any]]:
    text = resources.files("repro").joinpath("data/hardware.yaml").read_text()
    return yaml.safe_load(text)


def lookup(slug: str) -> HardwareInfo:
    """The registry entry ``slug`` (e.g. ``"b200"``) as a HardwareInfo."""
    reg = registry()
    if slug not in reg:
        raise ValueError(f"unknown hardware {slug!r}; registry has: {', '.join(reg)}")
    e = reg[slug]
    return HardwareInfo(slug=slug, name=e["name"], backend=e["backend"],
                        compute_capability=e["compute_capability"],
                        peak_tflops=dict(e["peak_tflops"]),
                        memory_bandwidth_tbs=e["memory_bandwidth_tbs"],
                        memory_gib=e["memory_gib"])


def _slugify(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def from_device_name(name: str, backend: str, compute_capability: str | None) -> HardwareInfo:
    if backend == "cpu":
        return lookup("cpu")
    matches = [(len(m), slug) for slug, e in registry().items() for m in e["match"]
               if m.lower() in name.lower() and e["backend"] == backend]
    if matches:  # the longest match wins: "GB200" also contains "B200"
        info = lookup(max(matches)[1])
        return HardwareInfo(**{**info.__dict__, "name": name,
                               "compute_capability": compute_capability
                               or info.compute_capability})
    warnings.warn(f"hardware {name!r} is not in repro/data/hardware.yaml: running without "
                  "datasheet peaks (add an entry to compare against them)", stacklevel=2)
    return HardwareInfo(slug=_slugify(name), name=name, backend=backend,
                        compute_capability=compute_capability)


@functools.cache
def detect() -> HardwareInfo:
    """The hardware JAX runs on (first device)."""
    import jax

    dev = jax.devices()[0]
    backend = dev.platform
    backend = "gpu" if backend in ("gpu", "cuda", "rocm") else backend
    cc = getattr(dev, "compute_capability", None)
    info = from_device_name(dev.device_kind, backend, str(cc) if cc else None)
    return info


# ------------------------------------------------------------------------ target switch

# (platform, device_kind) that code paths are chosen for while a program is traced for another
# device (:func:`target`): a JAX configuration value that is part of the trace context, so a
# jitted function traced for one target is not reused from JAX's caches for another. Made on
# the first use of :func:`target` (importing this module imports no JAX).
_STATE = None


def _state():
    global _STATE
    if _STATE is None:
        import inspect

        from jax._src import config as jax_config

        make = jax_config.string_or_object_state
        if "include_in_trace_context" not in inspect.signature(make).parameters:
            _STATE = _contextvar_state()
            return _STATE
        _STATE = make(
            "repro_target", None, "(platform, device kind) repro chooses code paths for",
            include_in_trace_context=True)
    return _STATE


def _contextvar_state():
    """The same for a JAX whose configuration values cannot join the trace context: a plain
    context variable, with JAX's caches cleared around each use of :func:`target`."""
    import contextvars

    import jax

    var = contextvars.ContextVar("repro_target", default=None)

    class State:
        @property
        def value(self):
            return var.get()

        @contextlib.contextmanager
        def __call__(self, value):
            jax.clear_caches()
            token = var.set(value)
            try:
                yield
            finally:
                var.reset(token)
                jax.clear_caches()

    return State()


def _target() -> tuple[str, str] | None:
    return None if _STATE is None else _STATE.value


def platform() -> str:
    """The platform that code paths are chosen for: ``"gpu"``, ``"tpu"`` or ``"cpu"``.

    The one switch for every choice that differs by device (a Pallas kernel or its reference,
    cuDNN flash attention, GEMV tile tables): JAX's default backend, unless a program is being
    traced for another device under :func:`target`. Code must ask this, not
    ``jax.default_backend()``, so that a CPU-only machine traces exactly what a GPU ran."""
    if (t := _target()) is not None:
        return t[0]
    import jax

    backend = jax.default_backend()
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def device_kind() -> str:
    """The device kind (``jax.devices()[0].device_kind``, e.g. ``"NVIDIA H200"``) that code
    paths are chosen for; see :func:`platform`."""
    if (t := _target()) is not None:
        return t[1]
    import jax

    return jax.devices()[0].device_kind


@functools.cache
def _registered(platform_name: str, kind: str) -> HardwareInfo:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unknown device: no peaks, no narrow formats
        return from_device_name(kind, platform_name, None)


def current() -> HardwareInfo:
    """The hardware code paths are chosen for: the registry's entry of the :func:`target`
    where one is set (what tracing a record's program for its GPU needs), else
    :func:`detect`."""
    if (t := _target()) is not None:
        return lookup("cpu") if t[0] == "cpu" else _registered(*t)
    return detect()


def fp8_pays() -> bool:
    """Whether a per-layer FP8 policy (``fp8-auto``) may choose FP8 on the device code paths
    are chosen for (:func:`platform`, :func:`device_kind`). On a GPU, and on the CPU, which
    traces and tests what a GPU runs, always: the policy's width rule was measured on a GPU,
    and a GPU's traced program must not depend on how its kind is spelled. Elsewhere (a TPU),
    only where the registry gives the device FP8 arithmetic: none of v5e, v5p, v6e has it, so
    there every layer stays in BF16 (FP8 would be computed by converting to BF16)."""
    p = platform()
    if p in ("gpu", "cpu"):
        return True
    return _registered(p, device_kind()).has_fp8


@contextlib.contextmanager
def target(platform_name: str, kind: str = ""):
    """Choose code paths for ``platform_name`` (``"gpu"``, ``"tpu"``, ``"cpu"``) and device
    ``kind`` inside the block, whatever device this process runs on: what tracing a
    record's program for its own hardware needs. Functions jitted inside are traced (and
    cached) for that target only."""
    with _state()((platform_name, kind)):
        yield


# ------------------------------------------------------------------- recording identity


def _registered_as(label: str) -> str | None:
    """The registry entry a ``--hardware`` label names: its slug, or a ``match`` substring."""
    slug = _slugify(label)
    if slug in registry():
        return slug
    hits = [(len(m), s) for s, e in registry().items() for m in e["match"]
            if m.lower() in label.lower()]
    return max(hits)[1] if hits else None


def check_label(label: str, detected: HardwareInfo | None = None) -> str:
    """The folder name ``repro record --hardware LABEL`` records under, or a one-line
    ``ValueError``. A label may name a machine the registry lacks; one that names a registry
    entry must agree with the detected device (same backend, same compute capability, the same
    entry where the device is registered): records say which device made them."""
    slug = _slugify(label)
    if not slug:
        raise ValueError(f"--hardware {label!r}: a name needs letters or digits")
    info = detected or detect()
    entry = _registered_as(label)
    if entry is None or entry == info.slug:
        return slug
    e = lookup(entry)
    if e.backend != info.backend:
        why = f"it names {e.name} ({e.backend.upper()}) and JAX runs on the {info.backend.upper()}"
    elif e.compute_capability and info.compute_capability and \
            e.compute_capability != info.compute_capability:
        why = (f"it names {e.name} (compute capability {e.compute_capability}) and this "
               f"device has compute capability {info.compute_capability}")
    elif info.slug in registry():
        why = f"it names {e.name} and this device is {info.name} ({info.slug})"
    else:
        return slug  # an unregistered device of the same kind, e.g. a variant of the entry
    raise ValueError(f"--hardware {label!r} contradicts the detected device: {why}; leave "
                     f"--hardware out (records go under {info.slug!r}) or name a machine the "
                     "registry lacks")


def _gpu_hours(recs: list[dict[str, Any]]) -> float:
    """Seconds between consecutive cells of one hardware (gaps under two hours: one sitting;
    each sitting's first cell is not counted): the time a run of those cells took there."""
    import datetime as dt

    ts = sorted(dt.datetime.fromisoformat(r["timestamp"]) for r in recs if r.get("timestamp"))
    return sum(g for g in ((b - a).total_seconds() for a, b in zip(ts, ts[1:])) if g < 7200)


@functools.cache
def _cpu_matmul_tflops(n: int = 512) -> float:
    import time

    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), jnp.bfloat16)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(3):
        f(a).block_until_ready()
    return 2 * n ** 3 * 3 / (time.perf_counter() - t0) / 1e12


def _human(seconds: float) -> str:
    for unit, s in (("weeks", 604800), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * s:
            return f"{seconds / s:.0f} {unit}"
    return f"{seconds:.0f} s"


def cpu_estimate(experiment: str, root) -> str:
    """Roughly how long ``experiment``'s full profile would take on this CPU: the time its
    committed cells took on a GPU (cell timestamps under ``root``, i.e. ``results/``), times
    how much slower this CPU multiplies BF16 matrices than that GPU's recorded GEMMs."""
    import json
    from pathlib import Path

    def records(folder: str, hw: Path) -> list[dict[str, Any]]:
        out = []
        for p in sorted((hw / folder).glob("*.json")):
            try:
                data = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            out += [r for r in (data if isinstance(data, list) else [data])
                    if isinstance(r, dict)]
        return out

    best = None
    for hw in sorted(Path(root).glob("*/")):
        recs = [r for r in records(experiment, hw) if r.get("backend") == "gpu"]
        gemm = [r.get("value") for r in records("gemm", hw) if r.get("metric") == "tflops"
                and r.get("recipe") == "bf16" and isinstance(r.get("value"), (int, float))]
        if recs and gemm and (best is None or len(recs) > best[1]):
            best = (hw.name, len(recs), _gpu_hours(recs), max(gemm))
    if best is None:
        return f"no GPU records of {experiment} under {root} to estimate its time from"
    name, _, gpu_s, gpu_tflops = best
    slower = gpu_tflops / _cpu_matmul_tflops()
    return (f"its cells took about {_human(gpu_s)} on the {name} (by their records' "
            f"timestamps) and this CPU multiplies BF16 matrices about {slower:,.0f}x slower "
            f"than the {name}'s recorded GEMMs: roughly {_human(gpu_s * slower)} here")
