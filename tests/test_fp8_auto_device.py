"""fp8-auto reads the device: on a TPU without FP8 arithmetic (the registry's v5e, v5p, v6e)
every layer stays in BF16; on a GPU (and the CPU that traces a GPU's program) the width rule
is unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repro import hardware
from repro.precision import layers
from repro.precision.layers import FP8_META
from repro.precision.recipes import resolve

SHAPES = [(4096, 4096), (1024, 4096), (4096, 1024), (64, 4096), (4096, 8)]


@pytest.mark.parametrize("kind", ["TPU v5 lite", "TPU v5", "TPU v6 lite", "TPU v9 unknown"])
def test_fp8_auto_keeps_every_layer_bf16_on_a_tpu(kind):
    auto = resolve("fp8-auto")
    with hardware.target("tpu", kind):
        assert not hardware.fp8_pays()
        assert all(layers.layer_recipe(auto, s).gemm == "dense" for s in SHAPES)
        # a recipe that asks for FP8 everywhere still gets it (emulated, and labelled so)
        assert layers.layer_recipe(resolve("fp8-delayed"), (4096, 4096)).gemm == "fp8"


def test_fp8_auto_width_rule_unchanged_on_gpu_and_cpu():
    auto = resolve("fp8-auto")
    expect = [min(s) >= auto.fp8_min_dim for s in SHAPES]
    for platform, kind in [("gpu", "NVIDIA H200"), ("gpu", ""), ("gpu", "NVIDIA A100-SXM4-80GB"),
                           ("cpu", "cpu")]:
        with hardware.target(platform, kind):
            assert [layers.layer_recipe(auto, s).gemm == "fp8" for s in SHAPES] == expect


def test_tpu_entry_as_the_device_gives_a_bf16_network():
    """A network under fp8-auto, initialised as for a TPU v5e, carries no FP8 state; as for
    an H200, its wide layer does; the TPU's forward pass is the BF16 layers' own."""
    auto = resolve("fp8-auto:fp8_min_dim=64")
    x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 64)), jnp.bfloat16)
    wide = layers.Dense(64, recipe=auto)
    with hardware.target("tpu", "TPU v5 lite"):
        v = wide.init(jax.random.key(0), x)
        y_tpu = wide.apply(v, x)
    assert FP8_META not in v
    with hardware.target("gpu", "NVIDIA H200"):
        assert FP8_META in wide.init(jax.random.key(0), x)
    dense = layers.Dense(64, recipe=auto.replace(gemm="dense", scaling="none"))
    assert np.array_equal(np.asarray(y_tpu), np.asarray(dense.apply(v, x)))
