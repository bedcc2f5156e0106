"""Per-tensor FP8 scaling with Transformer Engine semantics: current and delayed.

Scales follow ``repro.precision.formats``: a scale is the DEQUANTIZE multiplier
(x ~= q * scale), i.e. TE's ``scale_inv``.

* Current scaling: the scale comes from this tensor's amax, right now.
* Delayed scaling: the scale comes from a history of amaxes of previous steps,
  so the quantization of step t can be fused without a reduction over the
  tensor first. After each step the new amax is pushed and the scale updated.

Two layouts of the history (``Recipe.amax_history``), the same scales bit for bit:

* "shift" (:class:`DelayedScalingState`, :func:`delayed_update`): one history per tensor,
  newest first, shifted by one in every step inside each layer's backward pass (TE's layout).
* "ring" (:class:`AmaxRing`, :func:`ring_update`): every tensor's history in one
  ``[history_len, n]`` array, written in place at row ``step mod history_len`` by one
  dynamic-update-slice for all ``n`` tensors of the model, after the backward pass; each
  layer keeps only its newest amax and its scale (:class:`AmaxSlot`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from repro.precision.formats import compute_scale

AMAX_ALGOS = ("max", "most_recent")


class DelayedScalingState(NamedTuple):
    amax_history: jax.Array  # [history_len] float32, index 0 is the newest
    scale: jax.Array  # scalar float32 dequantize scale to use for the next step


def init_delayed(history_len=1024) -> DelayedScalingState:
    """Empty history (zeros) and scale 1.0, as TE initialises its FP8 meta."""
    if history_len < 1:
        raise ValueError(f"init_delayed: history_len must be >= 1, got {history_len}")
    return DelayedScalingState(jnp.zeros((history_len,), jnp.float32), jnp.float32(1.0))


def amax(x):
    """max |x| as float32. NaN propagates (a NaN anywhere gives NaN), on purpose."""
    return jnp.max(jnp.abs(jnp.asarray(x))).astype(jnp.float32)


def current_scale(x, fmax, margin=0):
    """Current scaling: dequantize scale from this tensor's amax now."""
    return compute_scale(amax(x), fmax, margin)


def delayed_update(state, amax, fmax, algo="max", margin=0) -> DelayedScalingState:
    """Push `amax` into the history (index 0 = newest) and recompute the scale.

    algo="max" uses the max over the whole history, "most_recent" its newest
    entry. As in TE (``_default_sf_compute``), if that amax is 0 or not finite
    the PREVIOUS scale is kept rather than reset, so one bad step does not
    throw away a calibrated scale. NaN amaxes stay in the history (and
    dominate "max") until they roll out: they are a signal, not noise.
    """
    if algo not in AMAX_ALGOS:
        raise ValueError(f"delayed_update: algo must be one of {AMAX_ALGOS}, got {algo!r}")
    amax = jnp.asarray(amax, jnp.float32)
    # the newest in front of all but the oldest: one concatenation. (``roll`` then ``.at[0].set``
    # is the same history, but XLA's GPU compiler runs that in-place update asynchronously, and
    # its scheduler then kept several layers' FP8 operands alive to overlap it, which took
    # memory in a wide PPO update on an H200.)
    hist = jnp.concatenate([amax[None], state.amax_history[:-1]])
    a = jnp.max(hist) if algo == "max" else hist[0]
    ok = jnp.isfinite(a) & (a > 0)
    scale = jnp.where(ok, compute_scale(a, fmax, margin), state.scale)
    return DelayedScalingState(hist, jnp.asarray(scale, jnp.float32))


# ------------------------------------------------------------------ the ring layout


class AmaxSlot(NamedTuple):
    """One tensor's delayed-scaling state in the "ring" layout: the amax of its last step
    (written by the layer's backward pass) and the scale its next step quantizes with; its
    history is a column of the model's :class:`AmaxRing`."""

    amax: jax.Array  # scalar float32
    scale: jax.Array  # scalar float32 dequantize scale


@dataclasses.dataclass(frozen=True)
class AmaxRing:
    """The amax histories of every delayed-scaling tensor of a model, one column each.

    ``history[i, j]`` is tensor ``j``'s amax of some earlier step; row ``pos`` is written next
    (the oldest entry, once the ring has filled). ``pos`` is a float32 holding an integer below
    ``history_len`` (float, so that the ring can sit among the variables a loss is
    differentiated by; exact up to 2**24). Static: ``names`` (which tensor each column is),
    ``fmax`` (each column's largest format value), ``algo`` and ``margin``."""

    history: jax.Array  # [history_len, n] float32
    pos: jax.Array  # scalar float32
    names: tuple = ()
    fmax: tuple[float, ...] = ()
    algo: str = "max"
    margin: int = 0


jax.tree_util.register_dataclass(AmaxRing, data_fields=["history", "pos"],
                                 meta_fields=["names", "fmax", "algo", "margin"])


def init_ring(names, fmax, history_len=1024, algo="max", margin=0) -> AmaxRing:
    """An empty ring (zeros, as :func:`init_delayed`) for the tensors ``names``, whose
    formats' largest values are ``fmax`` (one per name)."""
    names, fmax = tuple(names), tuple(float(f) for f in fmax)
    if history_len < 1:
        raise ValueError(f"init_ring: history_len must be >= 1, got {history_len}")
    if algo not in AMAX_ALGOS:
        raise ValueError(f"init_ring: algo must be one of {AMAX_ALGOS}, got {algo!r}")
    if len(names) != len(fmax) or not names:
        raise ValueError(f"init_ring: one fmax per tensor name needed, got {len(names)} "
                         f"name(s) and {len(fmax)} fmax value(s)")
    return AmaxRing(jnp.zeros((history_len, len(names)), jnp.float32), jnp.float32(0.0),
                    names, fmax, algo, int(margin))


def ring_update(ring: AmaxRing, amaxes, scales) -> tuple[AmaxRing, jax.Array]:
    """Write every tensor's newest amax (``amaxes``, [n]) into row ``pos`` of the ring, one
    dynamic-update-slice, and compute all ``n`` scales at once from the columns, with
    :func:`delayed_update`'s rule: the max over the history (``algo="max"``) or the newest
    amax (``"most_recent"``); where that is 0 or not finite the previous scale (``scales``,
    [n]) is kept; NaN amaxes stay in the history until they are overwritten. Returns the ring
    and the new scales ([n]): for the same amaxes, the scales of :func:`delayed_update` bit for
    bit (the max of the same values, in any order)."""
    amaxes = jnp.asarray(amaxes, jnp.float32)
    n = ring.history.shape[1]
    if amaxes.shape != (n,) or jnp.shape(scales) != (n,):
        raise ValueError(f"ring_update: the ring has {n} tensors; got amaxes of shape "
                         f"{amaxes.shape} and scales of shape {jnp.shape(scales)}")
    hist = lax.dynamic_update_slice(ring.history, amaxes[None, :],
                                    (ring.pos.astype(jnp.int32), jnp.int32(0)))
    a = jnp.max(hist, axis=0) if ring.algo == "max" else amaxes
    ok = jnp.isfinite(a) & (a > 0)
    fmax = jnp.asarray(ring.fmax, jnp.float32)
    new = jnp.where(ok, compute_scale(a, fmax, ring.margin), jnp.asarray(scales, jnp.float32))
    nxt = ring.pos + 1
    pos = jnp.where(nxt >= ring.history.shape[0], jnp.float32(0.0), nxt)
    return dataclasses.replace(ring, history=hist, pos=pos), new
