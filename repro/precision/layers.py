"""flax.linen layers whose products follow a precision recipe: Dense, DenseGeneral, Conv.

Model code passes a ``recipe`` (a ``repro.precision.recipes.Recipe``; :func:`dense` also takes a
recipe's name and resolves it) and never knows which format runs: every product goes through
``repro.precision.ops.dot`` (``ops.fp8_conv`` for FP8 convolutions). Parameters are FP32 master weights (``param_dtype``); activations come out in
``recipe.dtype``.

Quantization state lives in the ``FP8_META`` collection (flax's ``OVERWRITE_WITH_GRADIENT``):

* fp8 with delayed scaling: ``{input,kernel,output_grad}_amax_history`` ([amax_history_len])
  and ``..._scale`` (scalar, dequantize multiplier) per layer. With ``amax_history="ring"``
  a layer keeps ``..._amax`` (its newest amax) and ``..._scale``; the histories of every layer
  are one array, the ``AMAX_RING`` collection (:func:`init_amax_ring` adds it to the
  variables once after ``init``; :func:`apply_gradients` updates it).
* fp8 with ``fp8_weights="stored"``: ``weight``, the FP8 copy of the layer's weight
  (``repro.precision.ops.StoredWeight``), made at ``init`` and after every optimizer update
  by :func:`apply_gradients`; the layer's products read it, never the master weight.
* nvfp4: ``step``, a float32 counter. The PRNG key for the random Hadamard transform and the
  stochastic rounding comes from the flax rng stream ``"quant"`` when the caller provides one
  (``model.apply(v, x, rngs={"quant": key})``); otherwise it is the fixed key
  ``fold_in(fold_in(PRNGKey(0), crc32(module path)), step)``: different per layer and per
  step, reproducible, no rng plumbing needed.

The state is never mutated in the forward pass; its "gradient" is the new state (the custom
VJPs in ``repro.precision.ops`` return it). So differentiate the loss with respect to ALL variables and
call :func:`apply_gradients`, which runs the optimizer on "params" and overwrites FP8_META with
its gradient::

    variables = model.init(key, x)                     # {"params", maybe FP8_META}
    opt_state = tx.init(variables["params"])
    def loss_fn(v, x, y): return jnp.mean((model.apply(v, x) - y) ** 2)
    grads = jax.grad(loss_fn)(variables, x, y)         # grads[FP8_META] = updated state
    variables, opt_state = apply_gradients(variables, grads, tx, opt_state)

Caveats: a layer applied twice within one differentiated loss sums its two "gradients" (the
state is then wrong): use separate layers. A layer not used by the loss gets a zero
"gradient", which resets its state.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util
from flax.linen import fp8_ops
from jax import lax

from repro import hardware
from repro.precision import conv, kernels, ops, validate
from repro.precision import scaling as S
from repro.precision.recipes import Recipe, resolve
from repro.precision.scaling import AmaxSlot, DelayedScalingState

__all__ = ["FP8_META", "AMAX_RING", "Dense", "DenseGeneral", "Conv", "dense", "apply_gradients",
           "quant_state", "init_amax_ring"]

FP8_META = fp8_ops.OVERWRITE_WITH_GRADIENT
AMAX_RING = "amax_ring"  # the collection of a "ring" recipe's stacked amax histories

default_kernel_init = nn.initializers.lecun_normal()
FP32 = resolve("fp32")  # the layers' default recipe


def quant_state(module: nn.Module, recipe: Recipe):
    """(meta, key) for ``ops.dot`` from ``module``'s FP8_META variables and rng streams."""
    if recipe.gemm == "fp8" and recipe.scaling == "delayed" and recipe.amax_history == "ring":
        meta = {}
        for k in ops.META_KEYS:
            amax = module.variable(FP8_META, f"{k}{RING_SUFFIX}", jnp.zeros, (), jnp.float32)
            scale = module.variable(FP8_META, f"{k}_scale", jnp.ones, (), jnp.float32)
            meta[k] = AmaxSlot(amax.value, scale.value)
        return meta, None
    if recipe.gemm == "fp8" and recipe.scaling == "delayed":
        n = recipe.amax_history_len
        meta = {}
        for k in ops.META_KEYS:
            hist = module.variable(FP8_META, f"{k}_amax_history", jnp.zeros, (n,), jnp.float32)
            scale = module.variable(FP8_META, f"{k}_scale", jnp.ones, (), jnp.float32)
            meta[k] = DelayedScalingState(hist.value, scale.value)
        return meta, None
    if recipe.gemm == "nvfp4":
        step = module.variable(FP8_META, "step", jnp.zeros, (), jnp.float32)
        if module.has_rng("quant"):
            key = module.make_rng("quant")
        else:
            path = "/".join(str(p) for p in module.scope.path)
            key = jax.random.fold_in(jax.random.PRNGKey(0), zlib.crc32(path.encode()))
            key = jax.random.fold_in(key, lax.stop_gradient(step.value).astype(jnp.uint32))
        return {"step": step.value}, key
    return None, None


class Dense(nn.Module):
    """``activation(x @ kernel + bias)`` over the last axis, the product as ``recipe`` says.

    ``activation``: None, "relu" or "tanh". For FP8 recipes with ``fp8_epilogue="fused"`` the
    bias and activation run inside the FP8 product's ``custom_vjp``
    (``repro.precision.ops.fp8_dense``): the backward keeps FP8 operands and a 1-bit ReLU
    mask instead of a BF16 activation. Every other recipe applies them after the product.
    """

    features: int
    recipe: Recipe = FP32
    use_bias: bool = True
    activation: str | None = None
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    param_dtype: Any = jnp.float32

    @property
    def dtype(self):
        return self.recipe.dtype

    @nn.compact
    def __call__(self, x):
        r = _recipe(self.recipe, "Dense")
        _check_input(x, 1, "Dense")
        validate.positive_int(self.features, "Dense", "features")
        kernel = self.param("kernel", self.kernel_init, (jnp.shape(x)[-1], self.features),
                            self.param_dtype)
        r = layer_recipe(r, kernel.shape)
        meta, key = quant_state(self, r)
        if r.gemm == "fp8" and r.fp8_weights == "stored":
            meta = {**(meta or {}), "weight": _stored(self, kernel, r, meta)}
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        if r.gemm == "fp8" and r.fp8_epilogue == "fused":
            return ops.fp8_dense(x, kernel, bias, r, meta, self.activation)
        if r.gemm == "int8":  # bias and activation inside the INT8 product's custom_vjp
            from repro.precision import int8

            return int8.int8_dense(x, kernel, bias, r, self.activation)
        y = ops.dot(x, kernel, r, meta=meta, key=key)
        if bias is not None:
            y = y + bias.astype(y.dtype)
        return activate(y, self.activation)


def _stored(module: nn.Module, kernel, recipe: Recipe, meta):
    """The layer's stored FP8 weight (``Recipe.fp8_weights`` "stored"), a ``FP8_META``
    variable made at ``init`` from the initial weight with the kernel's initial scale (what the
    first per-call quantization would use), and after that by :func:`apply_gradients`. The
    transposed copy is stored where the layer's products would run in the "tn" layout for this
    weight (``recipe.fp8_layout``; "auto": where the cast-transpose kernel runs)."""
    def init():
        # a copy: the kernel's scale variable and this one are donated apart
        scale = jnp.array(meta["kernel"].scale) if recipe.scaling == "delayed" else None
        transpose = recipe.fp8_layout == "tn" or (
            recipe.fp8_layout == "auto" and recipe.fp8_cast == "native"
            and kernels.fits(kernel.shape))
        return ops.stored_weight(kernel, recipe, scale, transpose)
    return module.variable(FP8_META, "weight", init).value


def _recipe(recipe, what: str) -> Recipe:
    """``recipe`` if it is a Recipe; a one-line TypeError otherwise (a name is resolved where a
    model is configured: :func:`dense`, ``repro.precision.recipes.resolve``)."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"{what}: recipe must be a Recipe (resolve the name {recipe!r} "
                        f"first), got {type(recipe).__name__}")
    return recipe


def _no_stored(recipe: Recipe, what: str) -> None:
    if recipe.gemm == "fp8" and recipe.fp8_weights == "stored":
        raise ValueError(f"{what}: recipe {recipe.name!r} has fp8_weights='stored', which Dense "
                         "layers implement; use fp8_weights='per-call' here")


def layer_recipe(recipe: Recipe, kernel_shape) -> Recipe:
    """The recipe a layer of weight ``kernel_shape`` [K, N] runs under: ``recipe`` itself, or
    for a GEMM smaller than ``recipe.fp8_min_dim`` in K or N a dense GEMM in its compute dtype
    (the per-layer policy of ``fp8-auto``); a policy on a device without FP8 arithmetic (a
    TPU v5e: :func:`repro.hardware.fp8_pays`) keeps every layer dense. The decision depends
    on the weight and the device alone, so ``init`` and ``apply`` agree (and only FP8 layers
    carry FP8 state). INT8 recipes: ``repro.precision.int8.layer_recipe``."""
    if recipe.gemm == "int8":
        from repro.precision import int8

        return int8.layer_recipe(recipe, kernel_shape)
    if recipe.gemm == "fp8" and recipe.fp8_min_dim > 0 and (
            min(kernel_shape) < recipe.fp8_min_dim or not hardware.fp8_pays()):
        return recipe.replace(name=f"{recipe.name}/dense", gemm="dense", scaling="none")
    return recipe


def activate(y, activation: str | None):
    """``activation`` (None, "relu", "tanh") applied to ``y``."""
    if activation not in ops.ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ops.ACTIVATIONS)}, "
                         f"got {activation!r}")
    return {None: lambda v: v, "relu": nn.relu, "tanh": nn.tanh}[activation](y)


def dense(features: int, recipe: Recipe | str, *, use_bias: bool = True,
          activation: str | None = None, kernel_init: Callable | None = None,
          name: str | None = None) -> nn.Module:
    """The dense layer for ``recipe``: :class:`Dense` for this repository's recipes, the peer
    library's layer (``repro.precision.peers``) for ``backend`` flax, te or jax (with the
    activation applied after it)."""
    r = resolve(recipe)
    if r.backend != "repro":
        from repro.precision import peers

        layer = peers.dense(features, r, use_bias=use_bias, kernel_init=kernel_init, name=name)
        return layer if activation is None else _Activated(layer, activation)
    kw = {} if kernel_init is None else {"kernel_init": kernel_init}
    return Dense(features, recipe=r, use_bias=use_bias, activation=activation, name=name, **kw)


class _Activated(nn.Module):
    layer: nn.Module
    activation: str

    def __call__(self, x):
        return activate(self.layer(x), self.activation)


def _ints(v, what: str, name: str) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple; a float, a bool or a string is refused (not
    truncated). Python only: the traced program does not change."""
    items = (v,) if isinstance(v, (int, np.integer)) else v
    if not isinstance(items, (tuple, list)) or not items or not all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in items):
        raise TypeError(f"{what}: {name} must be an int or a non-empty sequence of ints, "
                        f"got {v!r}")
    return tuple(int(a) for a in items)


def _features(v, what: str) -> tuple[int, ...]:
    out = _ints(v, what, "features")
    if min(out) < 1:
        raise ValueError(f"{what}: features must be positive, got {v!r}")
    return out


def _check_input(x, min_ndim: int, what: str) -> None:
    """The input's rank, checked on its static shape before anything is traced."""
    ndim = np.ndim(x)
    if ndim < min_ndim:
        raise ValueError(f"{what}: x needs at least {min_ndim} "
                         f"{'axis' if min_ndim == 1 else 'axes'}, got shape {np.shape(x)}")


class DenseGeneral(nn.Module):
    """Dense over the trailing ``axis`` (int or tuple) to ``features`` (int or tuple).

    E.g. Q/K/V projections ``[B, T, D] -> [B, T, H, Dh]`` (features=(H, Dh)) and the attention
    output ``[B, T, H, Dh] -> [B, T, D]`` (axis=(-2, -1)). The kernel has shape
    ``in_dims + features`` and is flattened to one 2-D GEMM (so NVFP4 16x16 blocks tile the
    flattened [prod(in), prod(features)] matrix). ``kernel_init`` sees the 2-D shape.
    """

    features: int | Sequence[int]
    recipe: Recipe = FP32
    axis: int | Sequence[int] = -1
    use_bias: bool = True
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    param_dtype: Any = jnp.float32

    @property
    def dtype(self):
        return self.recipe.dtype

    @nn.compact
    def __call__(self, x):
        r = _recipe(self.recipe, "DenseGeneral")
        _no_stored(r, "DenseGeneral")
        features = _features(self.features, "DenseGeneral")
        _check_input(x, 1, "DenseGeneral")
        axes = tuple(sorted(validate.axis(a, x.ndim, "DenseGeneral")
                            for a in _ints(self.axis, "DenseGeneral", "axis")))
        n_in = len(axes)
        if len(set(axes)) != n_in or axes != tuple(range(x.ndim - n_in, x.ndim)):
            raise ValueError(f"DenseGeneral: axis {self.axis} must be the trailing axes of an "
                             f"input of rank {x.ndim}")
        in_dims = x.shape[x.ndim - n_in:]
        k_in, k_out = math.prod(in_dims), math.prod(features)

        def init(key, shape, dtype):
            return self.kernel_init(key, (k_in, k_out), dtype).reshape(shape)

        kernel = self.param("kernel", init, in_dims + features, self.param_dtype)
        meta, key = quant_state(self, r)
        lead = x.shape[:x.ndim - n_in]
        y = ops.dot(x.reshape(*lead, k_in), kernel.reshape(k_in, k_out), r, meta=meta, key=key)
        y = y.reshape(*lead, *features)
        if self.use_bias:
            bias = self.param("bias", self.bias_init, features, self.param_dtype)
            y = y + bias.astype(y.dtype)
        return y


class Conv(nn.Module):
    """Channels-last convolution ``[N, *spatial, C] -> [N, *spatial', features]``.

    fp8 recipes: FP8 forward (e4m3 operands straight into ``lax.conv_general_dilated``) and an
    emulated backward (quantize-dequantize: e5m2 gradient and e4m3 operands through BF16
    transposed convolutions), see ``ops.fp8_conv``. They are here for the numerics: on the H200
    the FP8 CNN updates are slower than BF16's (``rl_throughput`` records, ``cnn_w0_*``). Block-scaled recipes (mxfp8, nvfp4)
    run convolutions in ``recipe.dtype`` (BF16), as NVIDIA's NVFP4 recipe keeps non-GEMM-heavy
    layers in BF16. Unbatched inputs (rank len(kernel_size) + 1) are accepted.
    """

    features: int
    kernel_size: int | Sequence[int]
    strides: int | Sequence[int] = 1
    padding: str | Sequence[tuple[int, int]] = "SAME"
    recipe: Recipe = FP32
    use_bias: bool = True
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    param_dtype: Any = jnp.float32

    @property
    def dtype(self):
        return self.recipe.dtype

    @nn.compact
    def __call__(self, x):
        r = _recipe(self.recipe, "Conv")
        _no_stored(r, "Conv")
        _features(self.features, "Conv")
        ks = _ints(self.kernel_size, "Conv", "kernel_size")
        if min(ks) < 1:
            raise ValueError(f"Conv: kernel_size must be positive, got {self.kernel_size!r}")
        nsp = len(ks)
        unbatched = x.ndim == nsp + 1
        if unbatched:
            x = x[None]
        if x.ndim != nsp + 2:
            raise ValueError(f"Conv: input rank {x.ndim} does not fit kernel_size {ks}")
        strides = _ints(self.strides, "Conv", "strides")
        strides = strides * nsp if len(strides) == 1 else strides
        if len(strides) != nsp or min(strides) < 1:
            raise ValueError(f"Conv: strides must be 1 or {nsp} positive ints, "
                             f"got {self.strides!r}")
        padding = self.padding
        if isinstance(padding, int):
            padding = [(padding, padding)] * nsp
        padding = conv.static_padding(padding)
        kernel = self.param("kernel", self.kernel_init, ks + (x.shape[-1], self.features),
                            self.param_dtype)
        if r.gemm == "fp8":
            meta, _ = quant_state(self, r)
            y = ops.fp8_conv(x, kernel, r, meta, strides=strides, padding=padding)
        else:
            dt = r.dtype
            y = lax.conv_general_dilated(
                x.astype(dt), kernel.astype(dt), strides, padding,
                dimension_numbers=ops.conv_dimension_numbers(x.ndim),
                precision=r.precision, preferred_element_type=jnp.float32).astype(dt)
        if self.use_bias:
            bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            y = y + bias.astype(y.dtype)
        return y[0] if unbatched else y


def apply_gradients(variables, grads, tx: optax.GradientTransformation, opt_state):
    """One optimizer step on ``variables["params"]``; FP8_META replaced by its "gradient".

    ``grads``: the gradient of the loss with respect to ``variables`` (same collections). If it
    has no FP8_META (e.g. only "params" were differentiated, or the model has no quantization
    state), the state is left as it is. If ``grads`` has no "params" key it is taken to be the
    params gradient itself. Returns ``(variables, opt_state)``.

    Where the variables hold an ``AMAX_RING`` (``amax_history="ring"``), the amaxes the layers
    wrote are pushed into it in one update and every layer's scale is set from it
    (:func:`update_amax_ring`). Where layers store FP8 weights (``fp8_weights="stored"``),
    their copies are made from the updated master weights last (:func:`refresh_stored`).
    """
    params = variables["params"]
    pgrads = grads["params"] if "params" in grads else grads
    updates, opt_state = tx.update(pgrads, opt_state, params)
    new = {k: v for k, v in variables.items()}
    new["params"] = optax.apply_updates(params, updates)
    if "params" in grads and FP8_META in grads and FP8_META in variables:
        new[FP8_META] = grads[FP8_META]
        if AMAX_RING in variables:
            new[FP8_META], new[AMAX_RING] = update_amax_ring(new[FP8_META],
                                                             variables[AMAX_RING])
    if FP8_META in variables and _has_stored(new[FP8_META]):
        new[FP8_META] = refresh_stored(new[FP8_META], new["params"])
    return (type(variables)(new) if not isinstance(variables, dict) else new), opt_state


# ------------------------------------------------------------ the ring of amax histories

RING_SUFFIX = "_amax"  # a ring layer's FP8_META variable of its newest amax: "input_amax", ...


def _ring_names(meta) -> list[tuple[str, ...]]:
    """The paths of every ring layer's newest-amax variable in ``meta``, sorted."""
    flat = traverse_util.flatten_dict(meta) if meta else {}
    return sorted(k for k in flat if k[-1].endswith(RING_SUFFIX)
                  and k[-1][:-len(RING_SUFFIX)] in ops.META_KEYS)


def init_amax_ring(variables, recipe: Recipe):
    """``variables`` with an ``AMAX_RING`` collection where ``recipe`` keeps its amax
    histories in a ring (``amax_history="ring"``): zeros, one column per tensor of every FP8
    layer (input and kernel in ``fwd_dtype``, output gradient in ``bwd_dtype``). Unchanged
    otherwise (the same object), so that a program built through it is the same program for
    every other recipe. Call it once after ``model.init``."""
    r = _recipe(recipe, "init_amax_ring")
    if not (r.gemm == "fp8" and r.scaling == "delayed" and r.amax_history == "ring"):
        return variables
    names = _ring_names(variables.get(FP8_META))
    if not names:  # no FP8 layer (a policy that keeps every layer dense here)
        return variables
    fmax = [float(jnp.finfo(r.bwd_dtype if n[-1].startswith("output_grad") else
                            r.fwd_dtype).max) for n in names]
    ring = S.init_ring(names, fmax, r.amax_history_len, r.amax_compute_algo, r.margin)
    new = {**variables, AMAX_RING: {"ring": ring}}
    return type(variables)(new) if not isinstance(variables, dict) else new


def update_amax_ring(meta, ring_collection):
    """``(meta, ring collection)`` after one step: the newest amax of every tensor (``meta``'s
    ring variables, which the layers' backward passes wrote) pushed into the ring in one
    dynamic-update-slice, and every ``..._scale`` of ``meta`` set from it
    (``repro.precision.scaling.ring_update``)."""
    ring = ring_collection["ring"]
    flat = traverse_util.flatten_dict(meta)
    names = list(ring.names)
    if _ring_names(meta) != names:
        raise ValueError(f"the amax ring has {len(names)} tensors but the FP8 state has "
                         f"{len(_ring_names(meta))}: make the ring from these variables "
                         "(layers.init_amax_ring)")
    scale_of = [n[:-1] + (n[-1][:-len(RING_SUFFIX)] + "_scale",) for n in names]
    ring, scales = S.ring_update(ring, jnp.stack([flat[n] for n in names]),
                                 jnp.stack([flat[n] for n in scale_of]))
    for i, n in enumerate(scale_of):
        flat[n] = scales[i]
    return traverse_util.unflatten_dict(flat), {**ring_collection, "ring": ring}


# -------------------------------------------------------------------- stored FP8 weights


def _has_stored(meta) -> bool:
    if isinstance(meta, ops.StoredWeight):
        return True
    return isinstance(meta, Mapping) and any(_has_stored(v) for v in meta.values())


def refresh_stored(meta, params):
    """``meta`` with every layer's stored FP8 weight made again from its (updated) master
    weight ``params[...]["kernel"]``, with the scale the layer's next call quantizes with
    (delayed scaling: its ``kernel_scale`` in ``meta``; else from the weight's amax now)."""
    out = dict(meta)
    for k, v in meta.items():
        if isinstance(v, ops.StoredWeight):
            scale = meta["kernel_scale"] if v.recipe.scaling == "delayed" else None
            out[k] = ops.stored_weight(params["kernel"], v.recipe, scale, v.q_t is not None)
        elif isinstance(v, Mapping) and _has_stored(v):
            out[k] = refresh_stored(v, params[k])
    return out
