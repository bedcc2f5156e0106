"""What every quantized GEMM of a layer shares (:mod:`repro.precision.ops` dispatches to them):
the dimension numbers of a layer's three products, the operand checks, the bias-and-activation
epilogue that runs inside each ``custom_vjp`` and its gradient, and the scalar tokens that
carry an operand's dtype through the residuals.
"""

from __future__ import annotations

import jax.numpy as jnp

from repro.precision import validate


# dot_general dimension numbers of the three GEMMs (2-D operands).
_DN_FWD = (((1,), (0,)), ((), ()))  # x[M,K] . w[K,N] -> [M,N]
_DN_DGRAD = (((1,), (1,)), ((), ()))  # g[M,N] . w[K,N] -> [M,K]
_DN_WGRAD = (((0,), (0,)), ((), ()))  # x[M,K] . g[M,N] -> [K,N]
_DN_TN = (((1,), (1,)), ((), ()))  # a[M,K] . b[N,K] -> [M,N]


def _fmax(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def _token(x):
    """A scalar carrying x's dtype through custom_vjp residuals (cotangents need it)."""
    return jnp.zeros((), x.dtype)


def _check_2d_weight(w, what):
    w = validate.operand(w, what, "w")
    if w.ndim != 2:
        raise ValueError(f"{what}: w must be 2-D [K, N], got shape {w.shape}")
    return w


def _flatten_lhs(x, w, what):
    x = validate.operand(x, what, "x")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"{what}: contraction mismatch, x {x.shape} vs w {w.shape}: the "
                         "last axis of x must be w's first")
    return x.reshape(-1, x.shape[-1])


ACTIVATIONS = (None, "relu", "tanh")


def _epilogue(y, b, act):
    """``act(y + b)`` in ``y``'s dtype and the activation's residual: a bit-packed mask
    (relu: 1 bit per element), the output (tanh) or None."""
    if b is not None:
        y = y + b.astype(y.dtype)
    if act == "relu":
        return jnp.maximum(y, 0), jnp.packbits(y > 0, axis=-1)
    if act == "tanh":
        y = jnp.tanh(y)
        return y, y
    return y, None


def _epilogue_grad(g, act_res, act, n):
    """The gradient before the activation (``g * act'``) from the output gradient ``g``."""
    if act == "relu":
        return jnp.where(jnp.unpackbits(act_res, axis=-1, count=n).astype(bool), g,
                         jnp.zeros((), g.dtype))
    if act == "tanh":
        return (g.astype(jnp.float32) * (1 - jnp.square(act_res.astype(jnp.float32)))
                ).astype(g.dtype)
    return g


def _pad_axis(x, axis, multiple):
    r = (-x.shape[axis]) % multiple
    if r == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, r)
    return jnp.pad(x, pad)
