"""Precision recipes: the one registry of every precision name in the repository.

A recipe is data (MaxText's separation: model code never knows which format runs). It says

* how a layer's matrix products run (``gemm``, ``scaling``, the FP8/NVFP4 fields, whose names
  follow Transformer Engine's DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling and
  NVFP4BlockScaling, so a TE user recognises every knob) and who runs them (``backend``: this
  repository's ``repro.precision.ops``, or a peer library: flax, Transformer Engine, JAX);
* which layers are quantized (``scope``);
* what the optimizer does with the weights (``master_weights``, ``kahan``, ``grad_clip``,
  ``weight_clip``): the training-time half of a recipe, which the RL and LM studies ablate.

A name becomes a :class:`Recipe` through :func:`resolve` once, where it enters (a study's
parameters, a PPO or GRPO config, an LM run, ``layers.dense``, ``networks.make_network``); the
layers, ops, networks and cost model take that Recipe. Nothing else keeps a list of names.
Adding a recipe is one entry in :data:`REGISTRY` (plus its tests).

    >>> from repro.precision import resolve
    >>> resolve("fp8-delayed").amax_history_len
    1024
    >>> resolve("fp8-e2e").master_weights, resolve("fp8-e2e").family
    ('fp8', 'fp8-delayed')

Variants by name: ``"base:field=value,field=value"`` is ``base`` with those fields replaced,
each value coerced to the field's type; the variant's ``name`` is the whole string, so records
and figures list ablations by name:

    >>> r = resolve("fp8-delayed:fp8_gemm_out=float32,amax_history_len=16")
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

from repro.schema import suggest

Gemm = Literal["dense", "fp8", "fp8block", "mxfp8", "nvfp4", "int8"]
Scaling = Literal["none", "current", "delayed", "block"]
GemmOut = Literal["float32", "compute"]
Fp8Layout = Literal["auto", "natural", "tn"]
Fp8Cast = Literal["native", "rounding"]
Fp8Epilogue = Literal["fused", "separate"]
Fp8GradCast = Literal["one-pass", "two-pass"]
AmaxHistory = Literal["shift", "ring"]
Fp8Weights = Literal["per-call", "stored"]
Backend = Literal["repro", "flax", "te", "jax"]
Scope = Literal["default", "all", "mlp"]
Storage = Literal["fp32", "bf16", "fp8"]
Int8WeightScale = Literal["channel", "tensor"]


@dataclass(frozen=True)
class Recipe:
    """How matrix products run, which layers they cover, and how weights are stored.

    Attributes:
      name: the registry name (or the whole ``"base:field=value"`` string of a variant).
      base: for an entry that varies another (a training-time ablation such as ``fp8-e2e``),
        that entry's name; records keep it as their ``recipe`` and ``name`` as the variant.
      gemm: "dense" (an ordinary dot in ``compute_dtype``), "fp8" (per-tensor scaled FP8 with
        all three GEMMs of a layer in FP8), "fp8block" (DeepSeek-V3's block FP8: E4M3 with
        FP32 scales per 128x128 weight tile and 1x128 activation/gradient block, TE's
        Float8BlockScaling), "mxfp8" or "nvfp4" (block-scaled), "int8" (symmetric INT8 in all
        three GEMMs, INT32 accumulation, FP32 scales: ``repro.precision.int8``).
      backend: who computes the quantized GEMMs: "repro" (``repro.precision.ops``), "flax"
        (``flax.linen.fp8_ops.Fp8DirectDotGeneralOp``), "te" (Transformer Engine's flax
        ``dot_general``), "jax" (``jax.nn.scaled_dot_general``). Peers are benchmark
        references; ``repro.precision.layers.dense`` builds the right layer for each.
      compute_dtype: dtype of activations and of dense GEMM operands.
      param_dtype: dtype of the master weights in the layers (FP32).
      matmul_precision: ``jax.lax.Precision`` name for dense GEMMs. "highest" is true FP32;
        "default" on an NVIDIA GPU with FP32 operands is TF32.
      scaling: "none" (cast without scaling: the ablation that shows why scaling matters),
        "current" (this tensor's amax now), "delayed" (amax history, TE DelayedScaling), or
        "block" (block FP8, MXFP8 or NVFP4 block scales).
      fwd_dtype / bwd_dtype: FP8 formats of forward operands and gradients (TE's HYBRID).
      amax_history_len, amax_compute_algo, margin: TE DelayedScaling fields.
      loss_scaling: dynamic loss scaling (FP16).
      weight_block_2d, rht, stochastic_rounding: NVFP4BlockScaling parts (16x16 weight blocks,
        random Hadamard transform on the weight-gradient GEMM inputs, stochastic rounding of
        gradients). Ablations switch them off one at a time.
      fp8_gemm_out: element type of the forward and data-gradient GEMM outputs of per-tensor
        FP8 products. "compute" (default): the GEMM writes ``compute_dtype`` and the
        dequantize scale is multiplied in that dtype, so XLA's GEMM rewriter folds the scale
        (and a following bias add) into the cuBLASLt call: half the output bytes of "float32"
        (FP32 output, then a separate scale-and-cast pass). The scale product is rounded to
        ``compute_dtype`` (relative error <= 2**-8 for BF16): within 2 BF16 ulps of "float32".
        FP16 compute (no FP32 exponent range) always uses "float32". Weight-gradient GEMMs
        always output FP32 (they feed FP32 master weights).
      fp8_layout: how FP8 GEMMs meet cuBLASLt's "TN" requirement (both operands with the
        contraction dim minor). "natural": GEMMs written with their natural contraction dims,
        XLA transposes the 1-byte FP8 copies. "tn": every GEMM in TN form, the transposed FP8
        copies made in the pass that quantizes (TE's cast-transpose; one Pallas kernel per
        operand on a GPU, ``repro.precision.kernels``), ``x^T`` saved for the backward pass.
        "auto" (default): "tn" where that kernel runs (a GPU, operand shapes that are
        multiples of its tile), else "natural". Same values either way. Convolutions ignore it.
      fp8_cast: how GEMM operands are cast to FP8. "native": the hardware's saturating
        round-to-nearest convert (``repro.precision.formats.fp8_cast``); "rounding": explicit
        rounding arithmetic (``fp8_quantize``), bit-identical and slower: an ablation.
        Convolutions always use "rounding" (their emulated backward converts back).
      fp8_epilogue: where a layer's bias and activation run. "fused": inside the FP8 GEMM's
        ``custom_vjp`` (``repro.precision.ops.fp8_dense``): the backward keeps only the FP8
        operands and a 1-bit ReLU mask, and reads the output gradient once for the mask, the
        bias gradient and its FP8 cast. "separate": bias and activation after the FP8 product
        (plain JAX ops, which keep the activation's own residual): an ablation.
      fp8_grad_cast: how the "tn" layout's kernel quantizes the output gradient. "one-pass"
        (default): ``g`` and ``g^T`` in one read of ``g``. "two-pass": ``g^T`` first (the
        weight gradient consumes it), then ``g`` in a second read, so that ``g`` and both FP8
        copies are never alive together: a smaller backward peak for one more read of ``g``
        per layer (memory against speed; same values).
      amax_history: the layout of delayed scaling's amax histories
        (``repro.precision.scaling``). "shift" (default): one history per tensor, newest first,
        shifted inside each layer's backward pass (Transformer Engine's layout). "ring": every
        tensor's history in one ``[amax_history_len, n]`` array of the model, written at row
        ``step mod amax_history_len`` by one dynamic-update-slice for all of them in the
        optimizer step (``repro.precision.layers.apply_gradients``; the variables get it from
        ``repro.precision.layers.init_amax_ring``). The same scales bit for bit.
      fp8_weights: where a layer's FP8 weight comes from. "per-call" (default): each call
        quantizes the FP32 master weight (its amax, the cast and the transposed copy).
        "stored": the optimizer step writes the FP8 copy (and its transposed copy) right after
        it updates the master weight, and the layer's forward and data-gradient GEMMs read
        only that copy; the master weight is read by the optimizer alone (and receives the
        weight gradient). The same values bit for bit (the copy is made with the scale the
        next call would use). Dense layers only.
      fp8_min_dim: a per-layer precision policy. A layer whose weight has a dimension (K or N)
        below it runs as a dense GEMM in ``compute_dtype`` instead of FP8: narrow layers, the
        first layer of a small-input network and small heads cost more to quantize than FP8
        saves (``repro.precision.layers.layer_recipe``). 0: every layer in FP8.
      int8_weight_scale: INT8 recipes: the weight's scales, "channel" (one per output channel,
        moved onto the output gradient for the data gradient) or "tensor" (one).
      int8_min_dim: INT8's per-layer policy, as ``fp8_min_dim`` is FP8's: a layer whose weight
        has a dimension below it runs as a dense GEMM in ``compute_dtype``, and so does every
        layer on a device without INT8 matrix arithmetic faster than its BF16
        (``repro.precision.int8.layer_recipe``). 0: every layer in INT8.
      scope: which layers a quantized recipe covers. "default": the recipe's own policy (RL
        networks keep their first layer and heads in BF16; the LM follows NVIDIA's NVFP4
        policy, ``repro.models.lm``); "all": every linear layer; "mlp": the LM's MLP GEMMs only.
      master_weights: storage of the parameters between steps: "fp32", "bf16", or "fp8"
        (E4M3 with a per-tensor power-of-two scale, in a BF16 container; ``repro.precision.
        optim``).
      kahan: Kahan-compensated updates of bf16/fp8-stored weights.
      grad_clip: the trainer's global-norm gradient clipping (False: the ablation).
      weight_clip: clip parameters to ``[-weight_clip, weight_clip]`` after each update.
      claims: the claims this entry is an experiment arm of.
      about: one line on what the entry is for (shown by ``repro recipes``).
    """

    name: str
    base: str | None = None
    gemm: Gemm = "dense"
    backend: Backend = "repro"
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
    fp8_layout: Fp8Layout = "auto"
    fp8_cast: Fp8Cast = "native"
    fp8_epilogue: Fp8Epilogue = "fused"
    fp8_grad_cast: Fp8GradCast = "one-pass"
    fp8_min_dim: int = 0
    int8_weight_scale: Int8WeightScale = "channel"
    int8_min_dim: int = 0
    amax_history: AmaxHistory = "shift"
    fp8_weights: Fp8Weights = "per-call"
    scope: Scope = "default"
    master_weights: Storage = "fp32"
    kahan: bool = False
    grad_clip: bool = True
    weight_clip: float | None = None
    claims: tuple[str, ...] = ()
    about: str = ""

    def __post_init__(self):
        # Python checks of the fields' values: a recipe the ops cannot run as written is
        # refused here, once, not inside a traced program (nor silently run otherwise).
        for f, kind in _field_types().items():
            v = getattr(self, f)
            if typing.get_origin(kind) is Literal and v not in typing.get_args(kind):
                raise ValueError(f"recipe {self.name!r}: {f} must be one of "
                                 f"{list(typing.get_args(kind))}, got {v!r}")
            want = _FIELD_KIND.get(kind)
            if want is not None and not _is_kind(v, want):
                raise ValueError(f"recipe {self.name!r}: {f} must be {want[1]}, got "
                                 f"{type(v).__name__} {v!r}")
        for f, valid in _FIELD_VALUES.items():
            if getattr(self, f) not in valid:
                raise ValueError(f"recipe {self.name!r}: {f} must be one of {list(valid)}, "
                                 f"got {getattr(self, f)!r}{_FIELD_WHY.get(f, '')}")
        if self.weight_clip is not None and not 0 < self.weight_clip < float("inf"):
            raise ValueError(f"recipe {self.name!r}: weight_clip must be a finite number > 0 "
                             f"or None (no clipping), got {self.weight_clip!r}")
        for f, lo, hi in (("amax_history_len", 1, None), ("margin", 0, 32),
                          ("fp8_min_dim", 0, None), ("int8_min_dim", 0, None)):
            v = getattr(self, f)
            if v < lo or (hi is not None and v > hi):
                shown = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise ValueError(f"recipe {self.name!r}: {f} must be {shown}, got {v}")

    @property
    def dtype(self) -> jnp.dtype:
        return jnp.dtype(self.compute_dtype)

    @property
    def family(self) -> str:
        """The precision recipe this entry varies (itself for a plain recipe)."""
        return self.base or self.name

    @property
    def precision(self) -> jax.lax.Precision:
        return jax.lax.Precision[self.matmul_precision.upper()]

    @property
    def quantized(self) -> bool:
        return self.gemm != "dense"

    @property
    def number_format(self) -> str:
        """The GEMM operands' format: fp32, tf32, bf16, fp16, fp8 (per-tensor or MXFP8), fp4 or
        int8."""
        if self.gemm in ("fp8", "fp8block", "mxfp8"):
            return "fp8"
        if self.gemm == "int8":
            return "int8"
        if self.gemm == "nvfp4":
            return "fp4"
        if self.compute_dtype == "float32":
            return "fp32" if self.matmul_precision == "highest" else "tf32"
        return {"bfloat16": "bf16", "float16": "fp16"}[self.compute_dtype]

    @property
    def quantizer(self) -> str | None:
        """What quantizes the GEMM operands: None (dense), "none"/"current"/"delayed"
        (per-tensor FP8; "current" for INT8 too), "fp8block", "mxfp8" or "nvfp4" (block
        scales)."""
        if not self.quantized:
            return None
        return self.gemm if self.scaling == "block" else self.scaling

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)


@functools.cache
def _field_types() -> dict[str, object]:
    return typing.get_type_hints(Recipe)


# Recipe fields of a plain type: the Python type each must have (a bool is not an int here, and
# a string such as "no" is not a bool).
_FIELD_KIND = {str: (str, "a string"), int: (int, "an int"), bool: (bool, "a bool"),
               float | None: ((int, float, type(None)), "a number or None"),
               str | None: ((str, type(None)), "a string or None")}


def _is_kind(v, want) -> bool:
    types, _ = want
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return False
    return isinstance(v, types)


# String fields with a closed set of values (what jnp.dtype / lax.Precision accept is wider
# than what the ops run: float64 would silently run as float32, int8 fail inside a GEMM).
_FIELD_VALUES = {
    "compute_dtype": ("float32", "bfloat16", "float16"),
    "param_dtype": ("float32",),
    "matmul_precision": ("default", "high", "highest"),
    "fwd_dtype": ("float8_e4m3fn", "float8_e5m2"),
    "bwd_dtype": ("float8_e4m3fn", "float8_e5m2"),
}
_FIELD_WHY = {
    "compute_dtype": " (the dtypes the ops compute in; JAX would run float64 as float32)",
    "param_dtype": " (the layers keep FP32 master weights; master_weights sets their storage)",
}


_BF16 = dict(compute_dtype="bfloat16", matmul_precision="default")
_E2E = dict(base="fp8-delayed", gemm="fp8", scaling="delayed", **_BF16, master_weights="fp8",
            kahan=True, weight_clip=1.0)
_NVFP4 = dict(gemm="nvfp4", scaling="block", **_BF16)
_INT8 = dict(gemm="int8", scaling="current", **_BF16)

REGISTRY: dict[str, Recipe] = {r.name: r for r in [
    # precision recipes
    Recipe("fp32", about="true FP32 GEMMs (Precision.HIGHEST)", claims=("A2", "A10")),
    Recipe("tf32", matmul_precision="default", about="FP32 operands, TF32 tensor cores"),
    Recipe("bf16", **_BF16, about="BF16 operands and activations, FP32 master weights",
           claims=("A2", "A10")),
    Recipe("fp16", compute_dtype="float16", matmul_precision="default", loss_scaling=True,
           about="FP16 with dynamic loss scaling", claims=("A2", "A10")),
    Recipe("fp8-current", gemm="fp8", scaling="current", **_BF16, claims=("A2", "A5", "A10"),
           about="FP8 GEMMs (E4M3 fwd, E5M2 grads), scale from each tensor's amax now"),
    Recipe("fp8-delayed", gemm="fp8", scaling="delayed", **_BF16,
           claims=("A2", "A5", "A6", "A10"),
           about="FP8 GEMMs with TE's delayed scaling (amax history of 1024 steps)"),
    Recipe("fp8-noscale", gemm="fp8", scaling="none", **_BF16, claims=("A5",),
           about="FP8 casts without any scaling: the ablation of A5"),
    Recipe("mxfp8", gemm="mxfp8", scaling="block", **_BF16,
           about="OCP MXFP8: E4M3 elements, one E8M0 scale per 32"),
    Recipe("fp8-block", gemm="fp8block", scaling="block", **_BF16, bwd_dtype="float8_e4m3fn",
           claims=("A12",), about="DeepSeek-V3 block FP8 (E4M3; FP32 scales per 128x128 weight "
           "tile, 1x128 activation and gradient block); emulated"),
    Recipe("nvfp4", **_NVFP4, claims=("B3", "B4"),
           about="NVIDIA's NVFP4 training recipe: E2M1, E4M3 scale per 16, FP32 per tensor"),
    Recipe("fp8-auto", base="fp8-delayed", gemm="fp8", scaling="delayed", **_BF16,
           fp8_min_dim=1024, claims=("A2", "A4"),
           about="fp8-delayed where FP8 pays: layers with both dimensions >= 1024, BF16 "
                 "elsewhere (the H200's mlp_step crossover)"),
    Recipe("int8", **_INT8, claims=("C1", "C2"),
           about="INT8 GEMMs (symmetric, INT32 accumulation; weights per channel, activations "
                 "and gradients per tensor), FP32 master weights"),
    Recipe("int8-auto", base="int8", **_INT8, int8_min_dim=1024,
           about="int8 where INT8 pays: layers with both dimensions >= 1024 on a device with "
                 "INT8 matrix arithmetic faster than its BF16, BF16 elsewhere"),
    # training-time variants (the RL studies' arms)
    Recipe("fp8-all-layers", base="fp8-delayed", gemm="fp8", scaling="delayed", **_BF16,
           scope="all", claims=("A1", "A10"),
           about="fp8-delayed with the first layer and output heads in FP8 too"),
    Recipe("fp8-lean", base="fp8-delayed", gemm="fp8", scaling="delayed", **_BF16,
           fp8_grad_cast="two-pass", claims=("A4",),
           about="fp8-delayed with the output gradient quantized in two passes: a smaller "
                 "backward peak for one more read of it"),
    Recipe("fp8-e2e", **_E2E, claims=("A1", "A7", "A8"),
           about="FP8 GEMMs and FP8-stored weights, Kahan-compensated update, weight clip 1.0"),
    Recipe("fp8-e2e-nokahan", **{**_E2E, "kahan": False}, claims=("A7",),
           about="fp8-e2e without Kahan compensation"),
    Recipe("bf16w-kahan", base="bf16", **_BF16, master_weights="bf16", kahan=True,
           claims=("A7",), about="BF16-stored weights with a Kahan-compensated update"),
    Recipe("bf16w-nokahan", base="bf16", **_BF16, master_weights="bf16", claims=("A7",),
           about="BF16-stored weights, plain rounding update"),
    Recipe("fp8-e2e-nogradclip", **{**_E2E, "grad_clip": False}, claims=("A8",),
           about="fp8-e2e without gradient clipping"),
    Recipe("fp8-e2e-noweightclip", **{**_E2E, "weight_clip": None}, claims=("A8",),
           about="fp8-e2e without weight clipping"),
    # NVFP4 ablations (the LM study's arms)
    Recipe("nvfp4-no-rht", base="nvfp4", **_NVFP4, rht=False, claims=("B4",),
           about="nvfp4 without the random Hadamard transform"),
    Recipe("nvfp4-no-sr", base="nvfp4", **_NVFP4, stochastic_rounding=False, claims=("B4",),
           about="nvfp4 with round-to-nearest gradients"),
    Recipe("nvfp4-1d-weights", base="nvfp4", **_NVFP4, weight_block_2d=False, claims=("B4",),
           about="nvfp4 with 1x16 weight blocks"),
    Recipe("nvfp4-all-layers", base="nvfp4", **_NVFP4, scope="all", claims=("B4",),
           about="NVFP4 in every linear layer of the LM"),
    Recipe("nvfp4-mlp-only", base="nvfp4", **_NVFP4, scope="mlp", claims=("B4",),
           about="NVFP4 on the LM's MLP GEMMs only (MaxText's choice)"),
    # peers: other libraries' implementations, for the benchmarks
    Recipe("flax-fp8", gemm="fp8", scaling="delayed", backend="flax", **_BF16,
           about="flax.linen.fp8_ops.Fp8DirectDotGeneralOp (delayed scaling)"),
    Recipe("te-fp8-current", gemm="fp8", scaling="current", backend="te", **_BF16,
           about="Transformer Engine Float8CurrentScaling (where TE is installed)"),
    Recipe("te-mxfp8", gemm="mxfp8", scaling="block", backend="te", **_BF16,
           about="Transformer Engine MXFP8BlockScaling (where TE is installed)"),
    Recipe("jax-nvfp4", gemm="nvfp4", scaling="block", backend="jax", **_BF16, rht=False,
           stochastic_rounding=False, weight_block_2d=False, claims=("B4",),
           about="jax.nn.scaled_dot_general's nvfp4 (GPU only): no RHT, no SR, 1x16 weights"),
]}


def names(backend: str | None = None) -> list[str]:
    """Registry names, optionally of one backend ("repro" for this repository's own)."""
    return [n for n, r in REGISTRY.items() if backend is None or r.backend == backend]


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _coerce(spec: str, field: str, text: str):
    """``text`` as a value of Recipe field ``field`` (bool, int, float, str, None or a Literal)."""
    kind = _field_types()[field]
    args = typing.get_args(kind)
    if type(None) in args and text.lower() in ("none", "null"):
        return None
    if typing.get_origin(kind) is Literal:
        if text not in args:
            raise ValueError(f"recipe {spec!r}: {field}={text!r} is not one of {list(args)}")
        return text
    if type(None) in args:  # Optional[X]
        kind = next(a for a in args if a is not type(None))
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


_VARIANT_FIELDS = tuple(f for f in _field_types() if f not in ("name", "base", "claims", "about"))


@functools.cache
def _parse_variant(spec: str) -> Recipe:
    """``"base:field=value,..."`` -> the base recipe with those fields, named ``spec``."""
    head, _, body = spec.partition(":")
    recipe = _registered(head.strip())
    if not body.strip():
        raise ValueError(f"recipe {spec!r}: nothing after ':'; expected 'field=value,...'")
    changes: dict[str, object] = {}
    for item in body.split(","):
        key, eq, text = (part.strip() for part in item.partition("="))
        if not eq or not key or not text:
            raise ValueError(f"recipe {spec!r}: {item.strip()!r} is not 'field=value'")
        if key not in _VARIANT_FIELDS:
            raise ValueError(f"recipe {spec!r}: unknown field {key!r}"
                             f"{suggest(key, _VARIANT_FIELDS)}; valid fields: "
                             f"{', '.join(_VARIANT_FIELDS)}")
        if key in changes:
            raise ValueError(f"recipe {spec!r}: field {key!r} given twice")
        changes[key] = _coerce(spec, key, text)
    return recipe.replace(name=spec, **changes)


def _registered(name: str) -> Recipe:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}{suggest(name, REGISTRY)}; valid recipes: "
                         f"{', '.join(REGISTRY)} (variants: 'base:field=value,...')") from None


def resolve(name: str | Recipe, **overrides) -> Recipe:
    """The Recipe for ``name``: a registry name, a variant ``"base:field=value,..."`` (values
    coerced to the fields' types; its ``name`` is the whole string) or a ``Recipe`` itself,
    with optional field ``overrides``. A one-line ``ValueError`` for anything unknown."""
    if isinstance(name, Recipe):
        recipe = name
    elif isinstance(name, str):
        recipe = _parse_variant(name) if ":" in name else _registered(name)
    else:
        raise ValueError(f"recipe must be a name or a Recipe, got {type(name).__name__}")
    if overrides:
        bad = sorted(set(overrides) - set(_field_types()))
        if bad:
            raise ValueError(f"unknown recipe field(s) {bad}; valid fields: "
                             f"{', '.join(_field_types())}")
        recipe = recipe.replace(**overrides)
    return recipe


def value_formats(recipe: Recipe) -> dict[str, str]:
    """Where each value lives under a recipe: the format of every store of a training step."""
    r = recipe
    q = r.gemm in ("fp8", "fp8block")
    fwd = {"float8_e4m3fn": "fp8-e4m3", "float8_e5m2": "fp8-e5m2"}
    dt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[r.compute_dtype]
    dt_gemm = "tf32" if r.number_format == "tf32" else dt
    out = {
        "params (stored)": {"fp32": "fp32", "bf16": "bf16",
                            "fp8": "fp8-e4m3 (bf16 container)"}[r.master_weights],
        "weights (GEMM operand)": fwd[r.fwd_dtype] if q else dt_gemm,
        "activations (GEMM operand)": fwd[r.fwd_dtype] if q else dt_gemm,
        "activations (stored between layers)": dt,
        "gradients (GEMM operand)": fwd[r.bwd_dtype] if q else dt_gemm,
        "weight gradients (output)": "fp32" if r.master_weights == "fp32" else "fp32 (cast)",
        "optimizer state (Adam moments)": "fp32",
        "optimizer update arithmetic": "fp32",
        "GEMM accumulation": "fp32",
        "first/last layers": (dt if (q and r.scope == "default") else
                              (fwd[r.fwd_dtype] if q else dt_gemm)),
        "scaling": r.scaling if q else "-",
    }
    if r.gemm == "int8":  # INT8 operands, INT32 accumulation (repro.precision.int8)
        out.update({"weights (GEMM operand)": "int8" + (
                        " (per channel)" if r.int8_weight_scale == "channel" else ""),
                    "activations (GEMM operand)": "int8", "gradients (GEMM operand)": "int8",
                    "GEMM accumulation": "int32",
                    "first/last layers": dt if r.scope == "default" else "int8",
                    "scaling": r.scaling})
    return out
