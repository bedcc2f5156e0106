"""Which device runs, and what its datasheet says it can do.

``detect()`` looks at JAX's first device; ``registry()`` reads ``repro/data/hardware.yaml``
(datasheet dense peaks and bandwidth). Unknown GPUs run with a warning and no peaks; ``repro
record --hardware NAME`` records under another name.
"""

from __future__ import annotations

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
        return self.backend == "gpu" and (self.cc_major, self.cc_minor) >= (8, 9)

    @property
    def has_fp4(self) -> bool:
        """Native block-scaled FP4/MXFP8 tensor cores (Blackwell, compute capability >= 10)."""
        return self.backend == "gpu" and self.cc_major >= 10

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
    return HardwareInfo(slug=slug, name=e["name"], backend="cpu" if slug == "cpu" else "gpu",
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
               if m.lower() in name.lower()]
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
