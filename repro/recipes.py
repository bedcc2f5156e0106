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

Variants by name: ``"base:field=value,field=value"`` is ``base`` with those fields replaced,
each value coerced to the field's type (bool, int, str, or one of a Literal's values); the
variant's ``name`` is the full string, so records and figures can list ablations by name:

    >>> r = get_recipe("fp8-delayed:fp8_gemm_out=float32,amax_history_len=16")
    >>> (r.name, r.fp8_gemm_out, r.amax_history_len)
    ('fp8-delayed:fp8_gemm_out=float32,amax_history_len=16', 'float32', 16)
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp

Gemm = Literal["dense", "fp8", "mxfp8", "nvfp4"]
Scaling = Literal["none", "current", "delayed", "block"]
GemmOut = Literal["float32", "compute"]
Fp8Layout = Literal["natural", "tn"]


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
      fp8_gemm_out: element type of the forward and data-gradient GEMM outputs of per-tensor
        FP8 products (``repro.ops.fp8_dot``; a speed lever, issue 3). "compute" (default): the
        GEMM writes ``compute_dtype`` (``preferred_element_type``, as flax's
        ``Fp8DirectDotGeneralOp``) and the dequantize scale is multiplied in that dtype, so
        XLA's GEMM rewriter folds the scale (and a following bias add) into the cuBLASLt call:
        half the output bytes of "float32" (the GEMM writes FP32, then a separate pass scales
        and casts). The scale product is then rounded to ``compute_dtype`` (relative error
        <= 2**-8 for BF16) and, where XLA does not fold the scale into the GEMM (e.g. CPU),
        the output rounded twice: within 2 BF16 ulps of "float32".
        Compute dtypes without FP32's exponent range (FP16: the unscaled FP8 product overflows
        it) always use "float32". Weight-gradient GEMMs always output FP32 (weight-sized, and
        they feed FP32 master weights).
      fp8_layout: how the FP8 GEMMs meet cuBLASLt's FP8 "TN" requirement (both operands with
        the contraction dim minor; a speed lever, issue 3). "natural" (default): GEMMs written
        with their natural contraction dims; XLA's GEMM rewriter inserts transposes of the
        FP8 copies (the weight in the forward pass, the saved input and the output gradient in
        the weight-gradient GEMM). "tn": every GEMM written in TN form; the transposed FP8
        copies are quantized from the high-precision source in the producing pass (Transformer
        Engine's cast-transpose), and the transposed input ``x^T`` is saved for the backward
        pass instead of ``x``. Same values either way (FP8 operands bit-identical); only the
        layout, the fusion and the residual differ. Convolutions ignore it.
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
    fp8_gemm_out: GemmOut = "compute"
    fp8_layout: Fp8Layout = "natural"

    def __post_init__(self):
        for f in ("fp8_gemm_out", "fp8_layout"):
            allowed = typing.get_args(_field_types()[f])
            if getattr(self, f) not in allowed:
                raise ValueError(f"recipe {self.name!r}: {f} must be one of {list(allowed)}, "
                                 f"got {getattr(self, f)!r}")

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


@functools.cache
def _field_types() -> dict[str, object]:
    return typing.get_type_hints(Recipe)


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


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _coerce(spec: str, field: str, text: str):
    """``text`` as a value of Recipe field ``field`` (bool, int, float, str or a Literal)."""
    kind = _field_types()[field]
    allowed = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
    if allowed is not None:
        if text not in allowed:
            raise ValueError(f"recipe {spec!r}: {field}={text!r} is not one of {list(allowed)}")
        return text
    if kind is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"recipe {spec!r}: {field}={text!r} is not a bool (true/false)")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"recipe {spec!r}: {field}={text!r} is not "
                             f"{'an int' if kind is int else 'a float'}") from None
    return text


@functools.cache
def _parse_variant(spec: str) -> Recipe:
    """``"base:field=value,..."`` -> the base recipe with those fields, named ``spec``."""
    base, _, body = spec.partition(":")
    recipe = _registered(base.strip())
    if not body.strip():
        raise ValueError(f"recipe {spec!r}: nothing after ':'; expected 'field=value,...'")
    fields = [f for f in _field_types() if f != "name"]
    changes: dict[str, object] = {}
    for item in body.split(","):
        key, eq, text = (part.strip() for part in item.partition("="))
        if not eq or not key or not text:
            raise ValueError(f"recipe {spec!r}: {item.strip()!r} is not 'field=value'")
        if key not in fields:
            raise ValueError(f"recipe {spec!r}: unknown field {key!r}; valid fields: "
                             f"{', '.join(fields)}")
        if key in changes:
            raise ValueError(f"recipe {spec!r}: field {key!r} given twice")
        changes[key] = _coerce(spec, key, text)
    return recipe.replace(name=spec, **changes)


def _registered(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(
            f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)} "
            "(variants: 'base:field=value,...')"
        ) from None


def get_recipe(name: str | Recipe, **overrides) -> Recipe:
    """The named recipe, with optional field overrides (for ablations).

    ``name`` is a registry name, a variant ``"base:field=value,field=value"`` (values coerced
    to the fields' types; the variant's ``name`` is the whole string) or a ``Recipe``.
    Raises a one-line ``ValueError`` for an unknown recipe, field or value.
    """
    if isinstance(name, Recipe):
        return name.replace(**overrides) if overrides else name
    if not isinstance(name, str):
        raise ValueError(f"recipe must be a name or a Recipe, got {type(name).__name__}")
    recipe = _parse_variant(name) if ":" in name else _registered(name)
    if overrides:
        fields = {f.name for f in dataclasses.fields(Recipe)}
        bad = sorted(set(overrides) - fields)
        if bad:
            raise ValueError(f"unknown recipe field(s) {bad}; valid fields: {sorted(fields)}")
        recipe = recipe.replace(**overrides)
    return recipe
