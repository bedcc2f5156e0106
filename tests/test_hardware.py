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


# ------------------------------------------------------------------------------ TPUs

TPUS = {  # slug: (device_kind JAX reports, bf16 TFLOP/s, int8 TOP/s, HBM TB/s, GiB)
    "tpu-v5e": ("TPU v5 lite", 197, 393, 0.819, 16),
    "tpu-v5p": ("TPU v5", 459, 918, 2.765, 95),
    "tpu-v6e": ("TPU v6 lite", 918, 1836, 1.638, 32),
}


@pytest.mark.parametrize("slug", TPUS)
def test_tpu_entries_carry_published_peaks_and_their_source(slug):
    _, bf16, int8, tbs, gib = TPUS[slug]
    info, e = hardware.lookup(slug), hardware.registry()[slug]
    assert info.backend == "tpu" and info.compute_capability is None
    assert (info.peak_tflops["bf16"], info.peak_tflops["int8"]) == (bf16, int8)
    assert (info.memory_bandwidth_tbs, info.memory_gib) == (tbs, gib)
    assert e["source"].startswith("https://cloud.google.com/tpu/docs/")
    # no FP8 / FP4 arithmetic on these TPUs; INT8 on the matrix units
    assert not info.has_fp8 and not info.has_fp4 and info.has_int8
    assert info.native_formats == ("int8",)


@pytest.mark.parametrize("slug", TPUS)
def test_tpu_detected_from_device_kind(slug):
    kind = TPUS[slug][0]
    info = hardware.from_device_name(kind, "tpu", None)
    assert (info.slug, info.backend, info.name) == (slug, "tpu", kind)
    assert info.peak_tflops["bf16"] == TPUS[slug][1]


def test_v5_lite_is_not_v5p():
    # "TPU v5 lite" contains "TPU v5" (v5p's kind): the longest match wins.
    assert hardware.from_device_name("TPU v5 lite", "tpu", None).slug == "tpu-v5e"
    assert hardware.from_device_name("TPU v5p", "tpu", None).slug == "tpu-v5p"


def test_unknown_tpu_runs_without_peaks_and_without_fp8():
    with pytest.warns(UserWarning, match="not in repro/data/hardware.yaml"):
        info = hardware.from_device_name("TPU v9 turbo", "tpu", None)
    assert info.backend == "tpu" and not info.has_fp8 and not info.has_int8


def test_backend_comes_from_the_entry():
    backends = {s: hardware.lookup(s).backend for s in hardware.registry()}
    assert backends["cpu"] == "cpu" and backends["tpu-v5e"] == "tpu"
    assert all(backends[s] == "gpu" for s in GPUS)
    assert all(e["backend"] in ("gpu", "tpu", "cpu") for e in hardware.registry().values())


def test_gpu_int8_from_compute_capability():
    assert hardware.lookup("a100-sxm").has_int8 and hardware.lookup("h200").has_int8
    assert hardware.lookup("h200").native_formats == ("fp8", "int8")
    assert not hardware.lookup("cpu").has_int8


def test_tpu_label_agrees_with_a_tpu_and_not_with_a_gpu():
    v5e = hardware.from_device_name("TPU v5 lite", "tpu", None)
    assert hardware.check_label("tpu-v5e", v5e) == "tpu-v5e"
    assert hardware.check_label("TPU v5e", v5e) == "tpu-v5e"
    with pytest.raises(ValueError, match="TPU"):
        hardware.check_label("tpu-v5e", hardware.lookup("h200"))
    with pytest.raises(ValueError, match="contradicts"):
        hardware.check_label("tpu-v6e", v5e)


def test_repro_hardware_lists_the_tpus():
    from repro import tables

    text = tables.hardware()
    rows = {line.split()[0]: line.split() for line in text.splitlines()[4:]}
    assert {"tpu-v5e", "tpu-v5p", "tpu-v6e", "h200"} <= set(rows)
    assert rows["tpu-v5e"][1] == "tpu" and "393" in rows["tpu-v5e"] and "0.819" in rows["tpu-v5e"]
    assert "native INT8" in text.splitlines()[0]
