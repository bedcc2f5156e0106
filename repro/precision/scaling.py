"""Per-tensor FP8 scaling with Transformer Engine semantics: current and delayed.

Scales follow ``repro.precision.formats``: a scale is the DEQUANTIZE multiplier
(x ~= q * scale), i.e. TE's ``scale_inv``.

* Current scaling: the scale comes from this tensor's amax, right now.
* Delayed scaling: the scale comes from a history of amaxes of previous steps,
  so the quantization of step t can be fused without a reduction over the
  tensor first. After each step the new amax is pushed and the scale updated.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

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
