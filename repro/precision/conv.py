"""FP8 convolutions (:func:`fp8_conv`): channels-last, the forward product in FP8 on cuDNN's FP8
convolution, the backward pass as quantize-dequantize emulation, through the per-tensor FP8
``custom_vjp`` of :mod:`repro.precision.fp8`.
"""

from __future__ import annotations

import operator

from jax import lax

from repro.precision import validate
from repro.precision.fp8 import _fp8_call
from repro.precision.gemm import _pad_axis


def conv_dimension_numbers(ndim: int) -> lax.ConvDimensionNumbers:
    """Channels-last dimension numbers (NHWC, HWIO, NHWC) for ``ndim``-D inputs."""
    nsp = ndim - 2
    lhs = (0, ndim - 1, *range(1, ndim - 1))
    rhs = (nsp + 1, nsp, *range(nsp))
    return lax.ConvDimensionNumbers(lhs, rhs, lhs)


def static_padding(padding):
    return padding if isinstance(padding, str) else tuple(tuple(int(p) for p in pair)
                                                          for pair in padding)


# Input channels of an FP8 convolution are zero-padded to a multiple of this (see fp8_conv).
CONV_CHANNEL_MULTIPLE = 16


def fp8_conv(x, w, recipe, meta=None, strides=None, padding="SAME"):
    """Channels-last convolution ``x[N, *spatial, C] * w[*window, C, F]`` in FP8.

    Forward: FP8 operands straight into ``lax.conv_general_dilated`` (preferred FP32, scales on
    the output): cuDNN FP8 convolution on Hopper. Backward: quantize-dequantize emulation (the
    e5m2 gradient and the saved e4m3 operands, exact in BF16, through BF16 transposed
    convolutions): the numerics of an FP8 backward pass, the speed of BF16. FP8 convolutions are
    here for the numerics, not for speed: in the H200's ``rl_throughput`` records of the MinAtar
    CNN (``cnn_w0_*`` cells) the FP8 recipes' updates are slower than BF16's.
    """
    recipe = validate.recipe_for(recipe, ("fp8",), "fp8_conv")
    x, w = _check_conv(x, w)
    nsp = x.ndim - 2
    strides = _conv_strides(strides, nsp)
    op = ("conv", strides, _conv_padding(padding, nsp), conv_dimension_numbers(x.ndim))
    # Input channels padded with zeros to a multiple of CONV_CHANNEL_MULTIPLE (exact: the
    # padded products are zero, the amaxes unchanged; pad's gradient slices them off). On the
    # H200 cuDNN has no FP8 plan for SpaceInvaders-MinAtar's 6 input channels under vmap (a
    # grouped convolution: "No supported configs found" at compile time), while 4 channels
    # work; XLA's FP8 conv fallback (openxla/xla#40021) names grouped convs under 16 channels
    # per group.
    x = _pad_axis(x, x.ndim - 1, CONV_CHANNEL_MULTIPLE)
    w = _pad_axis(w, w.ndim - 2, CONV_CHANNEL_MULTIPLE)
    return _fp8_call(x, w, recipe, meta, op, "fp8_conv")


def _check_conv(x, w):
    """Ranks and channels of a channels-last convolution (the zero padding of the channels
    would otherwise hide a mismatch that ``lax.conv`` reports)."""
    x = validate.operand(x, "fp8_conv", "x", min_ndim=3)
    w = validate.operand(w, "fp8_conv", "w", min_ndim=3)
    if w.ndim != x.ndim:
        raise ValueError(f"fp8_conv: x {x.shape} [N, *spatial, C] and w {w.shape} "
                         "[*window, C, F] need the same rank")
    if x.shape[-1] != w.shape[-2]:
        raise ValueError(f"fp8_conv: channel mismatch: x {x.shape} has {x.shape[-1]} input "
                         f"channels, w {w.shape} expects {w.shape[-2]}")
    return x, w


def _conv_strides(strides, nsp: int) -> tuple[int, ...]:
    try:
        out = (1,) * nsp if strides is None else tuple(operator.index(v) for v in strides)
    except TypeError:
        out = ()
    if len(out) != nsp or min(out) < 1:
        raise ValueError(f"fp8_conv: strides must be {nsp} positive ints, got {strides!r}")
    return out


def _conv_padding(padding, nsp: int):
    if isinstance(padding, str) and padding in ("SAME", "VALID", "SAME_LOWER"):
        return padding
    try:
        pads = None if isinstance(padding, str) else static_padding(padding)
    except (TypeError, ValueError):
        pads = None
    if pads is None or len(pads) != nsp or not all(len(p) == 2 and min(p) >= 0 for p in pads):
        raise ValueError(f"fp8_conv: padding must be 'SAME', 'VALID', 'SAME_LOWER' or {nsp} "
                         f"(low, high) pairs of ints >= 0, got {padding!r}")
    return pads
