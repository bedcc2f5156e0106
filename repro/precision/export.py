"""Post-training quantization for inference with qwix: a trained model's weights exported to
FP8, INT8 or NVFP4, with their exact bytes.

    from repro.precision import export
    ex = export.export(model, params, "fp8", (1, 16), module_path=r"block\\d+/mlp/.*")
    logits = ex.model.apply(ex.variables, tokens)     # FP8 weights x FP8 activations
    export.weight_bytes(ex)                           # {"bytes": ..., "ratio_to_bf16": ...}
    export.save("build/q/fp8", ex); ex2 = export.load("build/q/fp8", ex)

A format (:data:`repro.precision.export_formats.FORMATS`) says what the GEMMs of the matched
layers read:

* ``fp8`` / ``int8``: weights AND activations quantized (E4M3 / INT8; weights per output
  channel, activations per token, dynamic: each token's own absmax). qwix computes the
  product on the quantized values: ``dot(f8, f8) -> bf16`` or ``dot(s8, s8) -> s32``, the
  scales multiplied into the output. Whether a GPU runs these as FP8 / INT8 tensor-core GEMMs
  is for the compiled program to say (``repro.experiments.inference.measure`` checks every
  speed record). A scale per token is a vector along the GEMM's rows, which cuBLASLt's scalar
  scales cannot take: it costs a pass over the output.
* ``fp8-tensor``: E4M3 weights and activations with ONE scale per tensor: the weight's,
  ``amax / 448`` in BF16, stored with it; the activation's from its own absmax at run time
  (current scaling; chosen so that the product of the two scales is a BF16 number, rounded
  up: nothing saturates). The product is ``dot(f8, f8) -> bf16`` times that scalar
  (:func:`fp8_tensor_dot`), the form XLA's GEMM rewriter folds into cuBLASLt's FP8 GEMM.
  The weights are stored transposed (``weight_layout="nk"``): cuBLASLt's FP8 GEMM on Hopper
  reads both operands with the contraction axis minor, and XLA would transpose a ``[K, N]``
  weight on every call (``scripts/probe_dequant_gemm.py`` times both layouts).
* ``fp8-w`` / ``int8-w`` / ``nvfp4-w``: weight-only. FP8 / INT8 (a scale per output channel):
  ``(x @ q) * scale`` with the scale after the product (exact for per-channel scales), no
  dequantized BF16 weight (:mod:`repro.precision.dequant_gemm`, in the form
  :data:`WEIGHT_ONLY_KERNEL` names: "gemv", one row through a Pallas GEMV tuned per device
  and weight shape, or as a reduction over the weight where no tiling is known, and more
  rows through XLA's GEMM; or "reduce", "xla", or the Pallas GEMM kernel "pallas"), the
  weights stored transposed as for ``fp8-tensor`` (one row then reads contiguous bytes), for
  up to K / 2 rows of activations (decode); with more (prefill, compute-bound) the weight is
  dequantized first, as qwix does. What is saved is memory traffic, not arithmetic. NVFP4 (qwix
  dequantizes it to BF16 before a BF16 GEMM):
  E2M1 elements with an E4M3 scale per 16 along the contraction axis, and a per-tensor
  scale, here a power of two (``2^ceil(log2(amax / (448 * 6)))``): dividing by it first lets
  the block scales use E4M3's whole range, as NVIDIA's two-level scaling does, and keeps
  every stored scale exactly an E4M3 value times that power of two. No FP4 tensor cores on
  Hopper: accuracy only.
* ``flax-fp8``, ``fp8-current``: a training recipe of ``repro.precision.recipes`` used as it
  is for inference (flax's ``Fp8DirectDotGeneralOp`` with per-tensor delayed scaling, its
  scales calibrated by :func:`calibrate` on a few batches; this repository's per-tensor
  current-scaling FP8). Weights stay BF16 (quantized on every call).

Parameters are cast to BF16 before quantizing (the BF16 model computes with those values),
which also keeps every quantized array's dequantized dtype BF16, the dtype the layers'
``repro.precision.ops.dense_dot`` computes in.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from repro.precision import dequant_gemm
from repro.precision import formats as F
from repro.precision.export_formats import FORMATS as FORMATS  # handed on: callers read them here
from repro.precision.export_formats import NVFP4_TILE as NVFP4_TILE
from repro.precision.export_formats import WEIGHT_ONLY_KERNEL as WEIGHT_ONLY_KERNEL
from repro.precision.export_formats import (E2M1_MAX, E4M3_MAX, QTYPES, ExportFormat,
                                            resolve_format)

def _qwix():
    try:
        import qwix
    except ImportError:
        raise ImportError("post-training quantization needs qwix: pip install '.[infer]' "
                          "(qwix==0.1.8)") from None
    return qwix


def rules(fmt: ExportFormat, module_path: str) -> list:
    """The qwix rule of a quantized format: the layers whose path matches ``module_path``.
    A per-tensor format's rule names no activation type: its product
    (:func:`fp8_tensor_dot`) quantizes the activations itself, qwix would do it per token."""
    if not fmt.qwix:
        return []
    act = QTYPES[fmt.act] if fmt.act and fmt.granularity == "channel" else None
    return [_qwix().QuantizationRule(module_path=module_path, weight_qtype=QTYPES[fmt.weight],
                                     act_qtype=act, tile_size=fmt.tile_size)]


# ------------------------------------------------------------------ products for qwix


def _bf16_at_least(v):
    """The smallest BF16 number >= ``v`` (a positive finite FP32 scalar)."""
    b = v.astype(jnp.bfloat16)
    up = lax.bitcast_convert_type(lax.bitcast_convert_type(b, jnp.uint16) + jnp.uint16(1),
                                  jnp.bfloat16)
    return jnp.where(b.astype(jnp.float32) < v, up, b)


def quantize_per_tensor(w, qtype=jnp.float8_e4m3fn):
    """``w`` as a qwix ``QArray`` with ONE scale: ``amax / 448`` rounded to ``w``'s dtype (1
    for an all-zero tensor), the values ``w / scale`` rounded to E4M3 (saturating at 448,
    where the rounded scale is a little under ``amax / 448``)."""
    if jnp.dtype(qtype) != jnp.float8_e4m3fn:
        raise ValueError(f"quantize_per_tensor: E4M3 only, got {qtype}")
    wf = jnp.asarray(w).astype(jnp.float32)
    amax = jnp.max(jnp.abs(wf))
    scale = jnp.where(amax > 0, amax / E4M3_MAX, 1.0).astype(w.dtype)
    q = jnp.clip(wf / scale.astype(jnp.float32), -E4M3_MAX, E4M3_MAX).astype(qtype)
    return _qwix().QArray(q, scale.reshape((1,) * w.ndim), qtype=qtype)


@functools.cache
def _transposed_class():
    qwix = _qwix()

    @flax.struct.dataclass
    class TransposedQArray(qwix.QArray):
        """A qwix ``QArray`` of a ``[K, N]`` weight whose values are stored transposed,
        ``qvalue[N, K]`` (the contraction axis minor); ``shape`` is the weight's, ``scale``
        as qwix's (``[1, N]`` per output channel, ``[1, 1]`` per tensor). Only this module's
        products (:func:`fp8_tensor_dot`, :func:`weight_only_dot`) read it."""

        shape = property(lambda self: self.qvalue.shape[::-1])

    return TransposedQArray


def transposed(qa) -> bool:
    """Whether a qwix array holds its values transposed (:func:`_transposed_class`)."""
    return type(qa).__name__ == "TransposedQArray"


def _qwix_dot(lhs, rhs, dimension_numbers, **kwargs):
    if transposed(rhs):
        raise ValueError(f"export: a transposed weight {rhs.shape} in a product other than "
                         f"x @ w ({dimension_numbers})")
    return _qwix().dot_general(lhs, rhs, dimension_numbers, **kwargs)


def _x_at_w(lhs, rhs, dimension_numbers) -> bool:
    """Whether a product is ``x[..., K] @ w[K, N]``: an array times a 2-D QArray contracted
    on its first axis, without batch axes."""
    qwix = _qwix()
    (lc, rc), (lb, rb) = dimension_numbers
    return (isinstance(rhs, qwix.QArray) and not isinstance(lhs, qwix.QArray)
            and rhs.ndim == 2 and rhs.zero_point is None and tuple(rc) == (0,)
            and tuple(lc) == (lhs.ndim - 1,) and not tuple(lb) and not tuple(rb))


def fp8_tensor_dot(lhs, rhs, dimension_numbers, **kwargs):
    """The product of ``fp8-tensor``: ``x[..., K]`` (BF16) times a per-tensor E4M3 weight
    (:func:`quantize_per_tensor`). The activation is scaled by its absmax now, the scale
    ``sx`` chosen so that ``s = sx * sw`` (``sw``: the weight's) is a BF16 number: the
    smallest one >= ``amax / 448 * sw``, so no activation saturates and ``x ~ q * sx``
    holds to FP32 rounding. Then ``dot(xq, wq) -> bf16`` on the two FP8 arrays (2-D, x's
    leading axes flattened) times ``s``: a GEMM output times a broadcast scalar, which XLA's
    GEMM rewriter folds into the cuBLASLt FP8 call (as ``repro.precision.ops`` relies on for
    the training recipes); a transposed weight (``[N, K]``) is read as it is stored, without
    a transpose per call. Other products go to qwix."""
    if not (_x_at_w(lhs, rhs, dimension_numbers) and math.prod(rhs.scale.shape) == 1
            and rhs.qvalue.dtype == jnp.float8_e4m3fn):
        return _qwix_dot(lhs, rhs, dimension_numbers, **kwargs)
    k, n = rhs.shape
    x = lhs.reshape(-1, k)
    sw = rhs.scale.reshape(()).astype(jnp.float32)
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    s = _bf16_at_least(jnp.where(amax > 0, amax / E4M3_MAX, 1.0) * sw)
    xq = F.fp8_cast(x, jnp.float8_e4m3fn, s.astype(jnp.float32) / sw)
    acc = lax.dot_general(xq, rhs.qvalue, (((1,), (1 if transposed(rhs) else 0,)), ((), ())),
                          preferred_element_type=lhs.dtype)
    return (acc * s.astype(acc.dtype)).reshape(*lhs.shape[:-1], n)


def weight_only_dot(impl: str):
    """The product of a weight-only FP8 / INT8 format with a scale per output channel:
    :func:`repro.precision.dequant_gemm.dot` in form ``impl``. Other products go to qwix."""
    def dot(lhs, rhs, dimension_numbers, **kwargs):
        if (_x_at_w(lhs, rhs, dimension_numbers) and rhs.scale.shape == (1, rhs.shape[1])
                and jnp.dtype(rhs.qvalue.dtype).itemsize == 1):
            return dequant_gemm.dot(lhs, rhs.qvalue, rhs.scale.reshape(-1), impl,
                                    transposed=transposed(rhs))
        return _qwix_dot(lhs, rhs, dimension_numbers, **kwargs)

    return dot


class _PerTensorQArrays:
    """qwix's ``qarray`` module with :func:`quantize_per_tensor` as its ``quantize`` (the
    hook ``PtqProvider`` and ``quantize_params`` take for other quantizers)."""

    def __getattr__(self, name):
        from qwix._src.core import qarray

        return getattr(qarray, name)

    @staticmethod
    def quantize(array, how):
        return quantize_per_tensor(array, how.qtype)


def _qarray_module(fmt: ExportFormat):
    if fmt.granularity == "tensor":
        return _PerTensorQArrays()
    from qwix._src.core import qarray

    return qarray


def provider(fmt: ExportFormat, module_path: str):
    """qwix's ``PtqProvider`` for ``fmt`` with this module's products: per-tensor FP8
    (:func:`fp8_tensor_dot`, weights quantized by :func:`quantize_per_tensor`) and the fused
    weight-only product (:func:`weight_only_dot`); qwix's own otherwise."""
    qwix = _qwix()
    kw = {"_qarray_module": _qarray_module(fmt)}
    if fmt.granularity == "tensor":
        kw["_dot_general_fn"] = fp8_tensor_dot
    elif fmt.kernel is not None:
        kw["_dot_general_fn"] = weight_only_dot(fmt.kernel)
    return qwix.PtqProvider(rules(fmt, module_path), **kw)


@dataclass
class Exported:
    """A model ready to serve: ``model.apply(variables, ...)``. For qwix formats ``model`` is
    the qwix-wrapped model and the matched kernels in ``variables["params"]`` are qwix
    arrays (quantized values and scales)."""

    fmt: ExportFormat
    model: nn.Module
    variables: dict[str, Any]


def to_bf16(tree):
    """Every floating leaf of ``tree`` in BF16."""
    def cast(a):
        return a.astype(jnp.bfloat16) if jnp.issubdtype(a.dtype, jnp.floating) else a
    return jax.tree.map(cast, tree)


def _is_quantized(x) -> bool:
    return type(x).__name__ in ("WithAux", "QArray", "TransposedQArray")


def _qarray(x):
    return x.array if type(x).__name__ == "WithAux" else x


def pow2_tensor_scale(w) -> jax.Array:
    """NVFP4's per-tensor scale ``amax / (448 * 6)`` rounded up to a power of two (1 for an
    all-zero tensor)."""
    amax = jnp.max(jnp.abs(w.astype(jnp.float32)))
    s = jnp.exp2(jnp.ceil(jnp.log2(amax / (E4M3_MAX * E2M1_MAX))))
    return jnp.where(amax > 0, s, 1.0)


def _quantize_params(params, abstract, fmt: ExportFormat):
    """qwix's ``quantize_params`` with ``fmt``'s quantizer, NVFP4 kernels with their
    power-of-two tensor scale taken out first and multiplied back into the block scales
    (exact: powers of two)."""
    qwix = _qwix()
    flat, flat_abs = (flax.traverse_util.flatten_dict(t) for t in (params, abstract))
    scales = {}
    for path, a in flat_abs.items():
        if _is_quantized(a) and a.how.qtype == "nvfp4":
            scales[path] = pow2_tensor_scale(flat[path])
            flat[path] = (flat[path] / scales[path]).astype(flat[path].dtype)
    q = flax.traverse_util.flatten_dict(
        qwix.quantize_params(flax.traverse_util.unflatten_dict(flat), abstract,
                             _qarray_module=_qarray_module(fmt)))
    for path, s in scales.items():
        qa = q[path].array
        q[path] = q[path].replace(array=qa.replace(scale=(qa.scale * s).astype(qa.scale.dtype)))
    if fmt.weight_layout == "nk":
        cls = _transposed_class()
        for path, a in q.items():
            if _is_quantized(a) and _qarray(a).ndim == 2:
                qa = _qarray(a)
                q[path] = a.replace(array=cls(qa.qvalue.T, qa.scale, qa.zero_point, qa.qtype))
    return flax.traverse_util.unflatten_dict(q)


@functools.lru_cache(maxsize=64)
def serving_model(model: nn.Module, fmt: str | ExportFormat, module_path: str) -> nn.Module:
    """The module that serves ``model`` as ``fmt`` (a name of :data:`FORMATS` or a format):
    qwix's wrapper of the BF16 model (qwix formats) or the model under the format's recipe;
    cached, so compiled functions of it are shared by every export of the same model and
    format."""
    f = resolve_format(fmt) if isinstance(fmt, str) else fmt
    if not f.qwix:
        return model.clone(recipe=f.recipe)
    return _qwix().quantize_model(model.clone(recipe="bf16"), provider(f, module_path))


@functools.lru_cache(maxsize=64)
def _abstract(smodel: nn.Module, shape: tuple[int, ...]):
    """Shapes (and qwix's how-to-quantize) of every variable collection of ``smodel``."""
    return jax.eval_shape(smodel.init, jax.random.key(0), jnp.zeros(shape, jnp.int32))


@functools.lru_cache(maxsize=64)
def _init_state(smodel: nn.Module, shape: tuple[int, ...]):
    """A jitted init of the collections other than params (XLA drops the params' init)."""
    def init(key):
        v = smodel.init(key, jnp.zeros(shape, jnp.int32))
        return {c: x for c, x in v.items() if c != "params"}
    return jax.jit(init)


@functools.lru_cache(maxsize=64)
def _quantizer(smodel: nn.Module, shape: tuple[int, ...], fmt: ExportFormat):
    """A jitted ``params -> quantized params`` (BF16 first) for a qwix serving model."""
    abstract = _abstract(smodel, shape)["params"]
    return jax.jit(lambda params: _quantize_params(to_bf16(params), abstract, fmt))


def export(model: nn.Module, params, fmt: str | ExportFormat, sample_shape: tuple[int, ...],
           *, module_path: str, calib_batches=None, key=None) -> Exported:
    """``model`` (a flax module with a ``recipe`` field, trained in any recipe) and its
    ``params`` as ``fmt`` for inference. ``sample_shape``: the shape of an integer input of
    the model (for qwix to trace which products ``module_path`` matches); ``calib_batches``:
    inputs that calibrate delayed-scaling state (``flax-fp8``; required there)."""
    fmt = resolve_format(fmt) if isinstance(fmt, str) else fmt
    shape = tuple(int(d) for d in sample_shape)
    smodel = serving_model(model, fmt, module_path)
    abstract = _abstract(smodel, shape)
    if fmt.qwix:
        if not any(_is_quantized(x) for x in jax.tree.leaves(abstract["params"],
                                                             is_leaf=_is_quantized)):
            raise ValueError(f"export {fmt.name}: module_path {module_path!r} matched no "
                             "product of the model")
        return Exported(fmt, smodel, {"params": _quantizer(smodel, shape, fmt)(params)})
    variables = {"params": to_bf16(params)}
    if set(abstract) - {"params"}:  # delayed-scaling state: initialised, then calibrated
        if not calib_batches:
            raise ValueError(f"export {fmt.name}: its delayed-scaling state needs "
                             "calib_batches to calibrate")
        variables.update(_init_state(smodel, shape)(jax.random.key(0) if key is None else key))
        variables = calibrate(smodel, variables, calib_batches)
    return Exported(fmt, smodel, variables)


@functools.lru_cache(maxsize=64)
def _calibration_step(model: nn.Module):
    from repro.precision.layers import FP8_META

    def total(meta, rest, x):
        out = model.apply({**rest, FP8_META: meta}, x)
        return jnp.sum(out.astype(jnp.float32))

    return jax.jit(jax.grad(total))


def calibrate(model: nn.Module, variables, batches):
    """Delayed-scaling FP8 state (the ``FP8_META`` collection of flax's FP8 ops and of
    ``repro.precision.layers``) after forward passes over ``batches``: each pass pushes the
    current amaxes into the histories, delivered as the gradient of that state (flax's
    overwrite-with-gradient mechanism); the next forward pass scales by the largest amax of
    its history."""
    from repro.precision.layers import FP8_META

    step = _calibration_step(model)
    rest = {k: v for k, v in variables.items() if k != FP8_META}
    meta = variables[FP8_META]
    for x in batches:
        meta = step(meta, rest, x)
    return {**variables, FP8_META: meta}


def _bits(dtype) -> int:
    dt = jnp.dtype(dtype)
    return jnp.finfo(dt).bits if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).bits


def _quantized_bytes(qa, fmt: ExportFormat) -> float:
    """Stored bytes of one quantized array: its elements at the qtype's bits; NVFP4's block
    scales as E4M3 (exact, see the module docstring) plus an FP32 tensor scale; other scales
    at their own dtype."""
    n, n_scale = math.prod(qa.qvalue.shape), math.prod(qa.scale.shape)
    scale_bits = 8 if fmt.weight == "nvfp4" else _bits(qa.scale.dtype)
    return (n * _bits(qa.qvalue.dtype) + n_scale * scale_bits) / 8 + (
        4 if fmt.weight == "nvfp4" else 0)


def weight_bytes(ex: Exported) -> dict[str, float]:
    """Exact bytes of the exported parameters. ``bytes``: each array at its format's width
    (4-bit elements two to a byte); ``in_memory``: the arrays as they run (``nbytes``: qwix
    keeps scales in BF16, 4-bit elements one to a byte where the backend does);
    ``bf16_bytes``: the same parameters in BF16; ``*_quantized``: over the quantized arrays
    only (the format's own ratio)."""
    out = {"bytes": 0.0, "in_memory": 0.0, "bf16_bytes": 0.0, "bytes_quantized": 0.0,
           "bf16_bytes_quantized": 0.0, "quantized_arrays": 0}
    for leaf in jax.tree.leaves(ex.variables["params"], is_leaf=_is_quantized):
        if _is_quantized(leaf):
            qa = _qarray(leaf)
            b, b16 = _quantized_bytes(qa, ex.fmt), math.prod(qa.qvalue.shape) * 2
            out["in_memory"] += sum(x.nbytes for x in jax.tree.leaves(qa))
            out["bytes_quantized"] += b
            out["bf16_bytes_quantized"] += b16
            out["quantized_arrays"] += 1
        else:
            b, b16 = math.prod(leaf.shape) * _bits(leaf.dtype) / 8, math.prod(leaf.shape) * 2
            out["in_memory"] += leaf.nbytes
        out["bytes"] += b
        out["bf16_bytes"] += b16
    out["ratio_to_bf16"] = out["bytes"] / out["bf16_bytes"]
    out["ratio_to_bf16_quantized"] = (out["bytes_quantized"] / out["bf16_bytes_quantized"]
                                      if out["quantized_arrays"] else 1.0)
    return out


def save(directory: str | Path, ex: Exported) -> int:
    """Write ``ex.variables`` as an orbax checkpoint in ``directory`` (replaced if it exists);
    returns its bytes on disk (arrays, metadata, as orbax lays them out)."""
    import shutil

    import orbax.checkpoint as ocp

    directory = Path(directory).resolve()
    shutil.rmtree(directory, ignore_errors=True)
    ck = ocp.StandardCheckpointer()
    ck.save(directory, ex.variables)
    ck.wait_until_finished()
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def load(directory: str | Path, like: Exported) -> Exported:
    """The checkpoint :func:`save` wrote, restored into the structure of ``like`` (an export
    of the same model and format, e.g. from ``jax.eval_shape``)."""
    import orbax.checkpoint as ocp

    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, like.variables)
    variables = ocp.StandardCheckpointer().restore(Path(directory).resolve(), target)
    return dataclasses.replace(like, variables=variables)
