"""The datasheet registry and device-name matching."""

import math

import jax
import pytest

from repro import hardware

REQUIRED = ["a100-sxm", "h100-sxm", "h200", "b200", "gb200", "gb300", "l40s", "rtx-4090", "cpu"]
GPUS = [s for s in REQUIRED if s != "cpu"]


@pytest.fixture(autouse=True)
def fresh_detect():
    hardware.detect.cache_clear()
    yield
    hardware.detect.cache_clear()


def test_registry_has_the_hardware_we_compare_against():
    assert set(REQUIRED) <= set(hardware.registry())


@pytest.mark.parametrize("slug", GPUS)
def test_gpu_peaks_are_sane(slug):
    info = hardware.lookup(slug)
    p = info.peak_tflops
    assert info.backend == "gpu" and info.memory_bandwidth_tbs > 0 and info.memory_gib > 0
    assert 0 < p["fp32"] <= p["tf32"] <= p["bf16"] == p["fp16"]
    if info.cc_major * 10 + info.cc_minor >= 89:  # Ada, Hopper, Blackwell: FP8 tensor cores
        assert info.has_fp8
        assert math.isclose(p["fp8"], 2 * p["bf16"], rel_tol=0.02)
    else:
        assert p["fp8"] is None and not info.has_fp8
    if info.cc_major >= 10:  # Blackwell: FP4 tensor cores, at least twice FP8
        assert info.has_fp4 and p["fp4"] >= 2 * p["fp8"]
    else:
        assert p["fp4"] is None and not info.has_fp4


def test_published_numbers():
    # The peaks the claims are compared against (CLAIMS.md): FP4 / FP8 / BF16, TB/s.
    assert hardware.lookup("h100-sxm").peak_tflops["fp8"] == pytest.approx(1979, abs=1)
    assert hardware.lookup("b200").peak_tflops["fp4"] == 9000
    assert hardware.lookup("gb200").peak_tflops["fp4"] == 10000
    assert hardware.lookup("gb300").peak_tflops["fp4"] == 15000
    assert hardware.lookup("a100-sxm").peak_tflops["fp16"] == 312
    assert hardware.lookup("h200").memory_bandwidth_tbs == 4.8


def test_cpu_entry_has_no_peaks():
    info = hardware.lookup("cpu")
    assert info.backend == "cpu" and not info.has_fp8 and not info.has_fp4
    assert all(v is None for v in info.peak_tflops.values())


@pytest.mark.parametrize("name,cc,slug", [
    ("NVIDIA GB200", "10.0", "gb200"),
    ("NVIDIA B200", "10.0", "b200"),
    ("NVIDIA GB300", "10.3", "gb300"),
    ("NVIDIA H100 80GB HBM3", "9.0", "h100-sxm"),
    ("NVIDIA H200", "9.0", "h200"),
    ("NVIDIA A100-SXM4-80GB", "8.0", "a100-sxm"),
    ("NVIDIA L40S", "8.9", "l40s"),
    ("NVIDIA GeForce RTX 4090", "8.9", "rtx-4090"),
])
def test_device_names(name, cc, slug):
    info = hardware.from_device_name(name, "gpu", cc)
    assert info.slug == slug and info.name == name and info.compute_capability == cc


def test_gb200_is_not_b200():
    # "GB200" contains "B200": the longest match must win.
    assert hardware.from_device_name("NVIDIA GB200", "gpu", "10.0").slug == "gb200"
    assert hardware.from_device_name("NVIDIA GB200", "gpu", None).peak_tflops["fp4"] == 10000


def test_unknown_gpu_warns_and_runs_without_peaks():
    with pytest.warns(UserWarning, match="not in repro/data/hardware.yaml"):
        info = hardware.from_device_name("NVIDIA Quantum X9000", "gpu", "12.0")
    assert info.slug == "nvidia-quantum-x9000" and info.peak_tflops == {}
    assert info.has_fp8 and info.has_fp4  # capabilities come from the compute capability


def test_lookup_unknown_lists_registry():
    with pytest.raises(ValueError, match="registry has: .*gb200"):
        hardware.lookup("z100")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="tests expect a CPU backend")
def test_detect_cpu():
    info = hardware.detect()
    assert (info.slug, info.backend, info.has_fp8) == ("cpu", "cpu", False)
