"""Precision recipes as data.

A recipe says how a layer computes its matrix products and in which dtypes values live. Layers
take a recipe as an argument (MaxText's separation: model code never knows which format runs),
and the field names follow Transformer Engine's recipes (DelayedScaling, Float8CurrentScaling,
MXFP8BlockScaling, NVFP4BlockScaling) so a TE user recognises every knob.

    >>> from repro.recipes import get_recipe
    >>> get_recipe("fp8-delayed").amax_history_len
    1024
    >>> get_recipe("nvfp4", rht=False).rht
    False
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp

Gemm = Literal["dense", "fp8", "mxfp8", "nvfp4"]
Scaling = Literal["none", "current", "delayed", "block"]


@dataclass(frozen=True)
class Recipe:
    """How matrix products run and which dtypes values are stored in.

    Attributes:
      name: the registry name.
      gemm: "dense" (an ordinary dot in ``compute_dtype``), "fp8" (per-tensor scaled FP8 with
        all three GEMMs of a layer in FP8), "mxfp8" or "nvfp4" (block-scaled).
      compute_dtype: dtype of activations and of dense GEMM operands.
      param_dtype: dtype of the master weights (FP32 unless a recipe says otherwise).
      matmul_precision: ``jax.lax.Precision`` name for dense GEMMs. "highest" is true FP32;
        "default" on an NVIDIA GPU with FP32 operands is TF32.
      scaling: "none" (cast without scaling, the ablation that shows why scaling matters),
        "current" (this tensor's amax now), "delayed" (amax history, TE DelayedScaling), or
        "block" (MXFP8/NVFP4 block scales).
      fwd_dtype / bwd_dtype: FP8 formats for forward operands and gradients (TE's HYBRID format).
      amax_history_len, amax_compute_algo, margin: TE DelayedScaling fields.
      loss_scaling: dynamic loss scaling (FP16).
      weight_block_2d, rht, stochastic_rounding: NVFP4BlockScaling parts (16x16 weight blocks,
        random Hadamard transform on the weight-gradient GEMM inputs, stochastic rounding of
        gradients). Ablations switch them off one at a time.
      emulated: filled in by ``repro.ops`` when a block-scaled format runs without native tensor
        cores; recipes themselves are device-independent.
    """

    name: str
    gemm: Gemm = "dense"
    compute_dtype: str = "float32"
    param_dtype: str = "float32"
    matmul_precision: str = "highest"
    scaling: Scaling = "none"
    fwd_dtype: str = "float8_e4m3fn"
    bwd_dtype: str = "float8_e5m2"
    amax_history_len: int = 1024
    amax_compute_algo: Literal["max", "most_recent"] = "max"
    margin: int = 0
    loss_scaling: bool = False
    weight_block_2d: bool = True
    rht: bool = True
    stochastic_rounding: bool = True

    @property
    def dtype(self) -> jnp.dtype:
        return jnp.dtype(self.compute_dtype)

    @property
    def precision(self) -> jax.lax.Precision:
        return jax.lax.Precision[self.matmul_precision.upper()]

    @property
    def quantized(self) -> bool:
        return self.gemm != "dense"

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe("fp32", matmul_precision="highest"),
        Recipe("tf32", matmul_precision="default"),
        Recipe("bf16", compute_dtype="bfloat16", matmul_precision="default"),
        Recipe("fp16", compute_dtype="float16", matmul_precision="default", loss_scaling=True),
        Recipe("fp8-current", gemm="fp8", compute_dtype="bfloat16", matmul_precision="default",
               scaling="current"),
        Recipe("fp8-delayed", gemm="fp8", compute_dtype="bfloat16", matmul_precision="default",
               scaling="delayed"),
        # FP8 cast with no scaling at all: the ablation for claim A5.
        Recipe("fp8-noscale", gemm="fp8", compute_dtype="bfloat16", matmul_precision="default",
               scaling="none"),
        Recipe("mxfp8", gemm="mxfp8", compute_dtype="bfloat16", matmul_precision="default",
               scaling="block"),
        Recipe("nvfp4", gemm="nvfp4", compute_dtype="bfloat16", matmul_precision="default",
               scaling="block"),
    ]
}


def recipe_names() -> list[str]:
    return list(RECIPES)


def get_recipe(name: str | Recipe, **overrides) -> Recipe:
    """The named recipe, with optional field overrides (for ablations)."""
    if isinstance(name, Recipe):
        return name.replace(**overrides) if overrides else name
    try:
        recipe = RECIPES[name]
    except KeyError:
        raise ValueError(
            f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}"
        ) from None
    if overrides:
        fields = {f.name for f in dataclasses.fields(Recipe)}
        bad = sorted(set(overrides) - fields)
        if bad:
            raise ValueError(f"unknown recipe field(s) {bad}; valid fields: {sorted(fields)}")
        recipe = recipe.replace(**overrides)
    return recipe
