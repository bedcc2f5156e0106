"""Per-tensor FP8: all three GEMMs of a layer in FP8, a scale per tensor (current, delayed or
none), and stored FP8 weights (:func:`fp8_dot`, :func:`fp8_dense`, :func:`stored_weight`;
:mod:`repro.precision.ops` says what the products compute and dispatches to them).

Layout (``recipe.fp8_layout``; "auto", the default, picks "tn" where the cast-transpose kernel
of ``repro.precision.kernels`` runs, else "natural"). "natural": every GEMM is written as
``dot_general`` with the natural contraction dims: fwd ``x[M,K] . w[K,N]`` (contract K), dgrad
``g[M,N] . w[K,N]`` (contract N), wgrad ``x[M,K] . g[M,N]`` (contract M). cuBLASLt FP8 on
Hopper needs both operands with the contraction dim minor ("TN"); XLA's GEMM rewriter inserts
the missing transposes, and with this formulation they are always transposes of 1-byte FP8
arrays: ``w`` in the forward pass (weight-sized), and ``xq``/``gq`` in the wgrad
(activation-sized). "tn": every GEMM written in TN form, the transposed FP8 copies made in
the pass that quantizes (Transformer Engine's cast-transpose: ``x^T``, ``g^T``, ``w^T``; on a
GPU one Pallas kernel per operand), ``x^T`` saved instead of ``x``; same values
(``recipe.fp8_grad_cast`` "two-pass": the output gradient's two copies in two passes, for a
smaller backward peak). Block-scaled GEMMs are written directly in the TN form ``a[M,K] . b[N,K]`` that
``scaled_matmul`` requires.

An input that is not differentiated (a network's input batch: its holder keeps it through
the backward pass anyway) is saved as it is, not as an FP8 copy, and the backward pass
quantizes it again with its forward scale (same values); no data gradient is computed for it.

Delayed scaling and the ``meta`` cotangent. ``meta`` is a dict
``{"input", "kernel", "output_grad"}`` of ``repro.precision.scaling.DelayedScalingState``. The forward
pass quantizes with the stored scales (computed at the end of the previous step, as TE does)
and the custom_vjp returns the UPDATED state (current amax pushed into each history, scale
recomputed) as the "gradient" of ``meta``: flax's overwrite-with-gradient mechanism
(``flax.linen.fp8_ops``). A train step replaces the state by its gradient
(``repro.precision.layers.apply_gradients``). Caveat: if the same ``meta`` is used by several calls in one
differentiated function (shared weights), the cotangents are summed and the state is wrong;
give each call its own state. flax avoids this with a private dtype; we keep to public APIs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from repro.precision import formats as F
from repro.precision import kernels
from repro.precision import scaling as S
from repro.precision import validate
from repro.precision.gemm import (_DN_DGRAD, _DN_FWD, _DN_TN, _DN_WGRAD, ACTIVATIONS,
                                  _check_2d_weight, _epilogue, _epilogue_grad, _flatten_lhs,
                                  _fmax, _token)


META_KEYS = ("input", "kernel", "output_grad")


def init_meta(history_len: int = 1024) -> dict[str, S.DelayedScalingState]:
    """Fresh delayed-scaling state for one FP8 GEMM: input, kernel and output-gradient."""
    return {k: S.init_delayed(history_len) for k in META_KEYS}


def _scale_now(x, dtype, recipe):
    if recipe.scaling == "none":
        return jnp.float32(1.0)
    return S.current_scale(x, _fmax(dtype), recipe.margin)


def _gemm_out_dtype(recipe, op) -> jnp.dtype:
    """Element type of the forward and dgrad GEMM outputs (``Recipe.fp8_gemm_out``).

    "compute" writes ``recipe.dtype`` when it has FP32's exponent range (BF16, FP32): the
    unscaled product of FP8 values (up to K * 448 * 57344) overflows FP16, so FP16 keeps FP32.
    Convolutions always use FP32."""
    dt = recipe.dtype
    if (op[0] in ("dot", "dot_tn") and recipe.fp8_gemm_out == "compute"
            and jnp.finfo(dt).maxexp >= jnp.finfo(jnp.float32).maxexp):
        return dt
    return jnp.dtype(jnp.float32)


def _rescale(acc, scale, dtype):
    """``acc * scale`` cast to ``dtype``, the multiply in ``acc``'s dtype: a multiply of the
    GEMM output by a broadcast scalar, which XLA's GEMM rewriter folds into the cuBLASLt FP8
    call (and a following vector bias add into its epilogue)."""
    return (acc * scale.astype(acc.dtype)).astype(dtype)


def _fwd_gemm(op, xq, wq, out_dtype=jnp.float32):
    """The forward product of FP8 operands in ``out_dtype``, unscaled. For "tn", ``wq`` is
    the transposed weight ``w^T[N, K]``."""
    if op[0] == "dot":
        return lax.dot_general(xq, wq, _DN_FWD, preferred_element_type=out_dtype)
    if op[0] == "dot_tn":
        return lax.dot_general(xq, wq, _DN_TN, preferred_element_type=out_dtype)
    _, strides, padding, dn = op
    return lax.conv_general_dilated(xq, wq, strides, padding, dimension_numbers=dn,
                                    preferred_element_type=jnp.float32)


def _bwd_gemms(op, gq, xq, wq, out_dtype=jnp.float32, gq_t=None):
    """dgrad (``out_dtype``) and wgrad (FP32) of FP8 operands, unscaled.

    "dot": ``xq`` is the saved input ``x[M, K]``. "dot_tn": ``xq`` is the saved ``x^T[K, M]``
    and ``gq_t`` the transposed gradient ``g^T[N, M]``: every GEMM in TN form."""
    if op[0] in ("dot", "dot_tn"):
        if op[0] == "dot":
            dw = lax.dot_general(xq, gq, _DN_WGRAD, preferred_element_type=jnp.float32)
        else:
            dw = lax.dot_general(xq, gq_t, _DN_TN, preferred_element_type=jnp.float32)
        # The weight gradient first: nothing waits for ``dw`` until the optimizer, and XLA's
        # scheduler left weight-gradient GEMMs to the end of the backward pass, keeping every
        # layer's FP8 operands (x^T, g^T) alive until then. Through the barrier the data
        # gradient (and the layers below) waits for it; an unused data gradient (the input's)
        # is still left out.
        gq, dw = lax.optimization_barrier((gq, dw))
        dx = lax.dot_general(gq, wq, _DN_DGRAD, preferred_element_type=out_dtype)
        return dx, dw
    # Convolution backward: quantize-dequantize emulation. The FP8 values (exact in BF16,
    # unscaled) go through BF16 transposed convolutions; scales are applied afterwards.
    _, strides, padding, dn = op
    bf = jnp.bfloat16

    def conv(a, b):
        return lax.conv_general_dilated(a, b, strides, padding, dimension_numbers=dn)

    _, vjp = jax.vjp(conv, xq.astype(bf), wq.astype(bf))
    dx, dw = vjp(gq.astype(bf))
    return dx.astype(jnp.float32), dw.astype(jnp.float32)


def _replace_meta(meta, new: dict):
    """``new`` (a dict keyed like META_KEYS) in the exact pytree structure of ``meta``."""
    leaves = [leaf for k in sorted(new) for leaf in jax.tree.leaves(new[k])]
    return jax.tree.unflatten(jax.tree.structure(meta), leaves)


def _pushed(state, amax, dtype, recipe):
    """A tensor's delayed-scaling state after this step's ``amax``: pushed into its own
    history ("shift", :func:`repro.precision.scaling.delayed_update`), or for the "ring"
    layout (``Recipe.amax_history``) the amax alone beside the unchanged scale: the optimizer
    step pushes every tensor's at once (``repro.precision.layers.apply_gradients``)."""
    if recipe.amax_history == "ring":
        return S.AmaxSlot(jnp.asarray(amax, jnp.float32), state.scale)
    return S.delayed_update(state, amax, _fmax(dtype), recipe.amax_compute_algo, recipe.margin)


def _caster(recipe, op):
    """The FP8 cast of GEMM operands: the hardware convert (``Recipe.fp8_cast`` "native") for
    products, the explicit rounding for convolutions (their emulated backward converts the FP8
    operands back to BF16, a round trip XLA may fold)."""
    return F.fp8_cast if recipe.fp8_cast == "native" and op[0] != "conv" else F.fp8_quantize


def _cast_and_amax(cast, x, dtype, scale):
    """``(cast(x), amax(x))`` computed together. Under delayed scaling nothing downstream
    waits for the amax (it only updates the history), and XLA's scheduler then ran its
    reduction late, keeping the activation-sized source alive until the end of the step (a
    quarter more memory than BF16 for the benchmark MLP); the barrier makes both results
    available at once, so the source can be freed where it is quantized."""
    return lax.optimization_barrier((cast(x, dtype, scale), S.amax(x)))


def _operand(x, dtype, recipe, op, scale=None, mask=None, transpose=False):
    """The FP8 copy of a GEMM operand ``x[M, N]`` for ``recipe``.

    Returns ``(q, q^T or None, scale, amax, column sums)``. ``scale``: the stored scale
    (delayed scaling) or None (computed here from this tensor's amax). ``mask``: a packed ReLU
    mask (``jnp.packbits`` along N) applied first. ``transpose``: also the transposed copy
    (the "tn" layout); then, where it runs, one Pallas kernel reads ``x`` once for all of it
    (``repro.precision.kernels.cast_transpose``).
    """
    cast = _caster(recipe, op)
    one_pass = transpose and recipe.fp8_cast == "native" and kernels.fits(x.shape)
    if not one_pass and mask is not None:
        x = _epilogue_grad(x, mask, "relu", x.shape[-1])
        mask = None
    current = scale is None  # current scaling (or none): the scale comes first
    if current:
        xm = x if mask is None else _epilogue_grad(x, mask, "relu", x.shape[-1])
        scale = _scale_now(xm, dtype, recipe)
    if one_pass:
        q, qt, amax, sums = kernels.cast_transpose(x, dtype, scale, mask)
        return q, qt, scale, amax, sums
    q, amax = (cast(x, dtype, scale), None) if current else _cast_and_amax(cast, x, dtype, scale)
    qt = cast(x.T, dtype, scale) if transpose else None
    return q, qt, scale, amax, None


def _requantize(x, dtype, recipe, op, scale):
    """The FP8 copy of a kept input for the weight gradient, with its forward scale: ``x^T``
    for "tn" (one kernel pass where it runs), else ``x``."""
    if op[0] != "dot_tn":
        return _caster(recipe, op)(x, dtype, scale)
    if recipe.fp8_cast == "native" and kernels.fits(x.shape):
        return kernels.cast_transpose(x, dtype, scale, None, "t")[1]
    return _caster(recipe, op)(x.T, dtype, scale)


def _fp8_fwd(x, w, b, meta, recipe, op, act, keep_input=False):
    """The forward product and its residuals. ``keep_input``: save ``x`` itself (the caller
    holds it anyway, see :func:`_fp8_fwd_rule`) instead of its FP8 copy; the backward
    quantizes it again with the same scale (same values)."""
    fdt = jnp.dtype(recipe.fwd_dtype)
    tn = op[0] == "dot_tn"
    delayed = recipe.scaling == "delayed"
    mx, mw = (meta["input"], meta["kernel"]) if delayed else (None, None)
    xq, xq_t, sx, ax, _ = _operand(x, fdt, recipe, op, mx.scale if delayed else None,
                                   transpose=tn and not keep_input)
    stored = None if meta is None else meta.get("weight")
    if stored is None:
        # the weight: quantized ONCE per call (the dgrad reuses it); its amax from the FP32 master
        wq, wq_t, sw, aw, _ = _operand(w, fdt, recipe, op, mw.scale if delayed else None,
                                       transpose=tn)
    else:  # the copy the optimizer step wrote (``fp8_weights="stored"``): w is not read
        wq, wq_t, sw, aw = _stored_operands(stored, tn)
    carry = None
    if delayed:
        carry = (meta["output_grad"], _pushed(mx, ax, fdt, recipe), _pushed(mw, aw, fdt, recipe))
    odt = _gemm_out_dtype(recipe, op)
    # "tn": every GEMM in TN form; x^T, not x, is kept for the weight-gradient GEMM
    acc = _fwd_gemm(op, xq, wq_t if tn else wq, odt)
    y, act_res = _epilogue(_rescale(acc, sx * sw, recipe.dtype), b, act)
    bt = None if b is None else _token(b)
    x_res = x if keep_input else (xq_t if tn else xq)
    return y, (x_res, wq, sx, sw, carry, _token(x), _token(w), bt, act_res, meta)


def _fp8_fwd_rule(x, w, b, meta, recipe, op, act):
    """The custom_vjp's forward (``symbolic_zeros``: each primal says whether it is
    differentiated). An input that is not differentiated (a network's input batch) is held by
    its caller through the backward pass anyway, so it is saved as it is: no FP8 copy of it
    outlives the forward pass, and no data gradient is computed for it. (For a non-
    differentiated input that the caller would free, e.g. features of a frozen network, this
    keeps its own bytes instead of one byte per element.)"""
    keep = not x.perturbed
    x, w, b, meta = jax.tree.map(lambda p: p.value, (x, w, b, meta),
                                 is_leaf=lambda p: isinstance(p, CustomVJPPrimal))
    return _fp8_fwd(x, w, b, meta, recipe, op, act, keep_input=keep)


def _grad_gemms(recipe, op, act_mask, g, x_res, wq, scale, want_dx):
    """The output gradient's FP8 copies and both backward GEMMs: ``(dx or None, dw, scale,
    amax, column sums)``, unscaled. In the "tn" layout through the kernel: ``g^T`` alone where
    no data gradient is wanted, and with ``recipe.fp8_grad_cast == "two-pass"`` a second pass
    for ``g`` after the weight gradient, so that ``g`` and both FP8 copies are never alive
    together."""
    bdt = jnp.dtype(recipe.bwd_dtype)
    tn = op[0] == "dot_tn"
    if not (tn and recipe.fp8_cast == "native" and kernels.fits(g.shape)):
        gq, gq_t, sg, ag, sums = _operand(g, bdt, recipe, op, scale, act_mask, transpose=tn)
        dx, dw = _bwd_gemms(op, gq, x_res, wq, _gemm_out_dtype(recipe, op), gq_t)
        return (dx if want_dx else None), dw, sg, ag, sums
    if scale is None:  # current scaling: the scale first
        gm = g if act_mask is None else _epilogue_grad(g, act_mask, "relu", g.shape[-1])
        scale = _scale_now(gm, bdt, recipe)
    two = recipe.fp8_grad_cast == "two-pass"
    gq, gq_t, ag, sums = kernels.cast_transpose(g, bdt, scale, act_mask,
                                                "t" if two or not want_dx else "qt")
    dw = lax.dot_general(x_res, gq_t, _DN_TN, preferred_element_type=jnp.float32)
    if not want_dx:
        return None, dw, scale, ag, sums
    if two:  # the second pass waits for the weight gradient (else XLA runs both passes first)
        g, act_mask, dw = lax.optimization_barrier((g, act_mask, dw))
        gq = kernels.cast_transpose(g, bdt, scale, act_mask, "q")[0]
    else:  # the weight gradient first, as _bwd_gemms does
        gq, dw = lax.optimization_barrier((gq, dw))
    dx = lax.dot_general(gq, wq, _DN_DGRAD, preferred_element_type=_gemm_out_dtype(recipe, op))
    return dx, dw, scale, ag, sums


def _fp8_bwd(recipe, op, act, res, g):
    x_res, wq, sx, sw, carry, xt, wt, bt, act_res, meta = res
    fdt, bdt = jnp.dtype(recipe.fwd_dtype), jnp.dtype(recipe.bwd_dtype)
    if isinstance(g, SymbolicZero):  # the output is not used: a zero gradient
        g = jnp.zeros(g.shape, g.dtype)
    mask = act_res if act == "relu" else None
    if act == "tanh":
        g = _epilogue_grad(g, act_res, act, g.shape[-1])
    kept = x_res.dtype != fdt  # the input itself (not differentiated): quantize it again
    if kept:
        x_res = _requantize(x_res, fdt, recipe, op, sx)
    delayed = recipe.scaling == "delayed"
    dx, dw, sg, ag, sums = _grad_gemms(recipe, op, mask, g, x_res, wq,
                                       carry[0].scale if delayed else None, not kept)
    db = None
    if bt is not None:
        if sums is None:
            gm = g if mask is None else _epilogue_grad(g, mask, "relu", g.shape[-1])
            sums = jnp.sum(gm.astype(jnp.float32), axis=0)
        db = sums.astype(bt.dtype)
    if delayed:
        mg, new_x, new_w = carry
        new = {"input": new_x, "kernel": new_w, "output_grad": _pushed(mg, ag, bdt, recipe)}
        if "weight" in meta:  # the optimizer step writes the next copy
            new["weight"] = jax.tree.map(jnp.zeros_like, meta["weight"])
        meta_ct = _replace_meta(meta, new)
    else:
        meta_ct = None if meta is None else jax.tree.map(jnp.zeros_like, meta)
    dx = None if dx is None else _rescale(dx, sg * sw, xt.dtype)
    dw = _rescale(dw, sx * sg, wt.dtype)
    return dx, dw, db, meta_ct


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fp8_core(x, w, b, meta, recipe, op, act):
    return _fp8_fwd(x, w, b, meta, recipe, op, act)[0]


_fp8_core.defvjp(_fp8_fwd_rule, _fp8_bwd, symbolic_zeros=True)


def _fp8_call(x, w, recipe, meta, op, what, b=None, act=None):
    if recipe.scaling not in ("current", "delayed", "none"):
        raise ValueError(f"{what}: recipe {recipe.name!r} has scaling={recipe.scaling!r}; "
                         "FP8 per-tensor scaling is 'current', 'delayed' or 'none'")
    if act not in ACTIVATIONS:
        raise ValueError(f"{what}: activation must be one of {list(ACTIVATIONS)}, got {act!r}")
    stored = recipe.fp8_weights == "stored"
    if stored and not isinstance((meta or {}).get("weight"), StoredWeight):
        raise ValueError(f"{what}: recipe {recipe.name!r} reads a stored FP8 weight: meta needs "
                         "'weight', a StoredWeight (see ops.stored_weight)")
    if recipe.scaling == "delayed":
        if meta is None:
            raise ValueError(f"{what}: delayed scaling needs meta (see ops.init_meta)")
        missing = [k for k in META_KEYS if k not in meta]
        if missing:
            raise ValueError(f"{what}: meta lacks {missing}; expected keys {META_KEYS}")
    elif stored:
        meta = {"weight": meta["weight"]}  # the stored copy alone (no scaling state)
    else:
        meta = None  # no state: ignore whatever was passed, its cotangent is zero
    return _fp8_core(x, w, b, meta, recipe, op, act)


def _tn(recipe, x_shape, w_shape) -> bool:
    """Whether a product runs in the "tn" layout (``Recipe.fp8_layout``; "auto": where the
    cast-transpose kernel runs for the input, the weight and the output gradient)."""
    if recipe.fp8_layout != "auto":
        return recipe.fp8_layout == "tn"
    m, k = x_shape
    n = w_shape[1]
    return (recipe.fp8_cast == "native"
            and all(kernels.fits(s) for s in ((m, k), (k, n), (m, n))))


def fp8_dot(x, w, recipe, meta=None):
    """``x[..., K] @ w[K, N] -> [..., N]`` in ``recipe.dtype``, all three GEMMs in FP8.

    Forward operands ``recipe.fwd_dtype`` (e4m3), the output gradient ``recipe.bwd_dtype``
    (e5m2); FP32 accumulation; scales multiply the GEMM outputs. ``meta`` (delayed scaling
    only): ``{"input", "kernel", "output_grad"}`` -> DelayedScalingState; its gradient is the
    updated state. Gradients come back in x's and w's dtypes. ``recipe``: a per-tensor FP8
    recipe of this repository (``gemm="fp8"``); anything else is refused.
    """
    return _fp8_dense(x, w, None, recipe, meta, None, "fp8_dot")


def fp8_dense(x, w, b, recipe, meta=None, activation: str | None = None):
    """``activation(x[..., K] @ w[K, N] + b[N])`` with all three GEMMs in FP8, bias and
    activation inside the ``custom_vjp`` (``Recipe.fp8_epilogue`` "fused").

    What the backward pass keeps: the FP8 input (an input that is not differentiated: the
    input itself) and weight, their scales, and for ``"relu"`` a 1-bit mask
    (``jnp.packbits``), for ``"tanh"`` the output; no activation-sized BF16 copy for ReLU. The output gradient is read once for the activation's gradient, the bias
    gradient (summed in FP32) and its FP8 cast. ``b`` may be None; ``activation`` one of
    None, "relu", "tanh". Same forward values as ``activation(fp8_dot(x, w) + b)``.
    """
    return _fp8_dense(x, w, b, recipe, meta, activation, "fp8_dense")


def _fp8_dense(x, w, b, recipe, meta, activation, what):
    recipe = validate.recipe_for(recipe, ("fp8",), what)
    w = _check_2d_weight(w, what)
    x2 = _flatten_lhs(x, w, what)
    if b is not None and jnp.shape(b) != (w.shape[1],):
        raise ValueError(f"{what}: bias shape {jnp.shape(b)} does not match the "
                         f"{w.shape[1]} outputs of w {w.shape}")
    op = ("dot_tn",) if _tn(recipe, x2.shape, w.shape) else ("dot",)
    y = _fp8_call(x2, w, recipe, meta, op, what, b, activation)
    return y.reshape(*x.shape[:-1], w.shape[1])


@dataclasses.dataclass(frozen=True)
class StoredWeight:
    """The FP8 copy of a weight ``w[K, N]`` that a layer of a ``fp8_weights="stored"`` recipe
    reads instead of its master weight (``meta["weight"]`` of :func:`fp8_dense`): ``q`` (``w``
    over ``scale`` in ``recipe.fwd_dtype``), its transpose ``q_t`` [N, K] (the "tn" layout's
    forward operand; None where the layer does not store it: then it transposes ``q``), the
    dequantize ``scale`` and the ``amax`` of the master weight it was made from (delayed
    scaling pushes it into the kernel's history, as a per-call recipe pushes the amax of the
    weight it quantizes). ``recipe`` (static): the layer's recipe, which says how to make the
    next copy (:func:`stored_weight`)."""

    q: jax.Array
    q_t: jax.Array | None
    scale: jax.Array
    amax: jax.Array
    recipe: object = None


jax.tree_util.register_dataclass(StoredWeight, data_fields=["q", "q_t", "scale", "amax"],
                                 meta_fields=["recipe"])


def stored_weight(w, recipe, scale=None, transpose: bool = False) -> StoredWeight:
    """The FP8 copy of ``w[K, N]`` that the layer's next call reads (``Recipe.fp8_weights``
    "stored"), made as a per-call recipe's forward pass quantizes it: ``scale`` is the kernel's
    delayed-scaling scale for that call (None: current scaling, from ``w``'s amax now; scale 1
    for ``scaling="none"``); ``transpose`` also stores ``q^T`` (in one pass where the
    cast-transpose kernel runs, ``repro.precision.kernels``). The optimizer step calls it
    right after the update (``repro.precision.layers.apply_gradients``), where it reads the
    master weight it has just written."""
    recipe = validate.recipe_for(recipe, ("fp8",), "stored_weight")
    w = _check_2d_weight(w, "stored_weight")
    fdt = jnp.dtype(recipe.fwd_dtype)
    a = S.amax(w)
    if scale is None:
        scale = (jnp.float32(1.0) if recipe.scaling == "none"
                 else F.compute_scale(a, _fmax(fdt), recipe.margin))
    scale = jnp.asarray(scale, jnp.float32)
    if transpose and recipe.fp8_cast == "native" and kernels.fits(w.shape):
        q, q_t, a, _ = kernels.cast_transpose(w, fdt, scale)
    else:
        cast = _caster(recipe, ("dot",))
        q = cast(w, fdt, scale)
        q_t = cast(w.T, fdt, scale) if transpose else None
    return StoredWeight(q, q_t, scale, a, recipe)


def _stored_operands(stored: StoredWeight, tn: bool):
    """``(q, q^T or None, scale, amax)`` of a stored copy for a product in layout ``tn``."""
    q_t = (stored.q_t if stored.q_t is not None else stored.q.T) if tn else None
    return stored.q, q_t, stored.scale, stored.amax
