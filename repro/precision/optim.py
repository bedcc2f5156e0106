"""Optimizer pieces for low-precision training, as optax GradientTransformations.

The pieces (each small, each tested in ``tests/test_optim.py``):

* :func:`kahan_update` / :func:`store_update` -- the LAST transform of a chain when the
  parameters are STORED in low precision (claims A1, A7). Plain optax adds the update to a bf16
  parameter and rounds (``optax.apply_updates`` casts back to the parameter's dtype), so an
  update smaller than half a bf16 ulp is lost every step. The Kahan form keeps a float32
  compensation buffer ``c`` and stores ``p' = round(p + u + c)``, ``c' = (p + u + c) - p'``: the
  rounding error is carried into the next step instead of being dropped. The transform returns
  the exact difference ``p' - p``, so ``optax.apply_updates`` lands on ``p'``.
* Storage formats (``master_weights``): ``fp32`` (no rounding), ``bf16`` (a bfloat16 array),
  ``fp8`` (E4M3 values with a per-tensor power-of-two scale). FP8 storage is held in a bfloat16
  CONTAINER: every scaled E4M3 value is exactly representable in bfloat16 (3 vs 7 mantissa
  bits), so the numerics are those of FP8 storage, but the bytes are bfloat16's. Flax layers
  cannot see a separate scale, which is why the container is used; memory accounting of FP8
  weights is therefore analytic (1 byte per weight), and says so.
* :func:`weight_clip` -- clip parameters to ``[-max_abs, max_abs]`` after the update (A8).
* gradient clipping -- ``optax.clip_by_global_norm`` (A8).
* :func:`dynamic_loss_scale` -- FP16 dynamic loss scaling: the loss is multiplied by
  ``loss_scale(opt_state)`` before the backward pass, this wrapper divides the gradients by it,
  skips the step and halves the scale on inf/NaN, and doubles it after ``period`` good steps.
* :func:`skip_nonfinite` -- ``optax.apply_if_finite``: skip a step whose gradients are not
  finite and count it (``skipped_steps(opt_state)``).
* :func:`with_float32_state` -- the optimizer runs in float32 whatever the parameter dtype:
  gradients are cast to float32 and Adam's moments live in float32 (the rule of every FP8 recipe
  we follow: TE, DeepSeek-V3, NVIDIA's NVFP4 paper), so low-precision storage never changes the
  optimizer state's dtype inside a ``lax.scan``.
* :func:`make_optimizer` -- the chain built from config flags.

    >>> import jax.numpy as jnp, optax
    >>> tx = make_optimizer({"lr": 1e-3, "master_weights": "bf16", "kahan": True})
    >>> p = {"w": jnp.ones(3, jnp.bfloat16)}
    >>> s = tx.init(p)
    >>> u, s = tx.update({"w": jnp.ones(3, jnp.bfloat16)}, s, p)
    >>> optax.apply_updates(p, u)["w"].dtype
    dtype(bfloat16)
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from repro.precision import formats

STORAGES = ("fp32", "bf16", "fp8")

# ----------------------------------------------------------------------------- storage


def _pow2_scale(amax: jax.Array, fmax: float) -> jax.Array:
    """Smallest power of two ``s`` with ``amax / s <= fmax`` (1.0 for a zero/non-finite amax)."""
    amax = jnp.asarray(amax, jnp.float32)
    ok = jnp.isfinite(amax) & (amax > 0)
    a = jnp.where(ok, amax, 1.0)
    # Exponent arithmetic (frexp/ldexp), not log2/exp2: XLA's are inexact on CPU for powers of
    # two, which gave scales 2x too large or not powers of two at all.
    m, e = jnp.frexp(a / jnp.float32(fmax))  # a / fmax = m * 2**e, m in [0.5, 1)
    k = jnp.where(m == 0.5, e - 1, e)  # ceil(log2(a / fmax)) of the rounded quotient
    fm = jnp.float32(fmax)
    k = jnp.where(a > jnp.ldexp(fm, k), k + 1, k)  # correct for the rounding of a / fmax
    k = jnp.where(a <= jnp.ldexp(fm, k - 1), k - 1, k)
    return jnp.where(ok, jnp.ldexp(jnp.float32(1.0), k), 1.0).astype(jnp.float32)


def round_to_storage(x: jax.Array, storage: str) -> jax.Array:
    """``x`` rounded to the storage format, returned in the storage CONTAINER dtype.

    fp32 -> float32; bf16 -> bfloat16 (round to nearest even); fp8 -> bfloat16 container holding
    E4M3 values times a per-tensor power-of-two scale from this tensor's amax (current scaling,
    saturating cast as in Transformer Engine).
    """
    if storage == "fp32":
        return x.astype(jnp.float32)
    if storage == "bf16":
        return formats.cast(x, jnp.bfloat16)  # not x.astype: XLA may fold a round trip
    if storage == "fp8":
        x = x.astype(jnp.float32)
        e4m3 = formats.E4M3
        scale = _pow2_scale(jnp.max(jnp.abs(x)), formats.FP8_MAX[e4m3])
        q = formats.fp8_quantize(x, e4m3, scale)
        # q * scale is exact in float32 and in bfloat16 (power-of-two scale).
        return (q.astype(jnp.float32) * scale).astype(jnp.bfloat16)
    raise ValueError(f"unknown storage {storage!r}; valid: {', '.join(STORAGES)}")


def container_dtype(storage: str) -> jnp.dtype:
    _check_storage(storage)
    return jnp.dtype(jnp.float32 if storage == "fp32" else jnp.bfloat16)


def storage_bytes(storage: str) -> int:
    """Bytes per stored weight of the FORMAT (fp8: 1, although the container is bfloat16)."""
    return {"fp32": 4, "bf16": 2, "fp8": 1}[_check_storage(storage)]


def to_storage(params, storage: str):
    """Cast freshly initialised (float32) parameters to their storage format."""
    _check_storage(storage)
    return jax.tree.map(lambda p: round_to_storage(p, storage), params)


def _check_storage(storage: str) -> str:
    if storage not in STORAGES:
        raise ValueError(f"unknown master_weights storage {storage!r}; valid: "
                         f"{', '.join(STORAGES)}")
    return storage


# ------------------------------------------------------------------ storage-aware update


class KahanState(NamedTuple):
    compensation: Any  # pytree like params, float32 (or comp_dtype)


def kahan_update(storage: str = "bf16", comp_dtype=jnp.float32) -> optax.GradientTransformation:
    """Kahan-compensated update of low-precision stored parameters (last in a chain).

    Given the (float32) update ``u`` of the chain so far, the new stored value is
    ``p' = round(p + (u + c))`` and the compensation ``c' = (p + u + c) - p'`` (float32). The
    returned update is ``p' - p`` (exact), so ``optax.apply_updates(p, ...)`` gives ``p'``.
    """
    _check_storage(storage)
    comp_dtype = jnp.dtype(comp_dtype)

    def init(params):
        return KahanState(jax.tree.map(lambda p: jnp.zeros(p.shape, comp_dtype), params))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("kahan_update needs params (call tx.update(grads, state, params))")
        p32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        target = jax.tree.map(lambda p, u, c: p + (u.astype(jnp.float32) + c.astype(jnp.float32)),
                              p32, updates, state.compensation)
        new_p = jax.tree.map(lambda t: round_to_storage(t, storage).astype(jnp.float32), target)
        comp = jax.tree.map(lambda t, n: (t - n).astype(comp_dtype), target, new_p)
        return jax.tree.map(jnp.subtract, new_p, p32), KahanState(comp)

    return optax.GradientTransformation(init, update)


def store_update(storage: str = "bf16") -> optax.GradientTransformation:
    """The naive counterpart of :func:`kahan_update`: ``p' = round(p + u)``, error dropped.

    For bf16 this is what ``optax.apply_updates`` does anyway; for fp8 it also rounds to the
    scaled E4M3 grid. The returned update is ``p' - p``.
    """
    _check_storage(storage)

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("store_update needs params (call tx.update(grads, state, params))")
        p32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        new_p = jax.tree.map(
            lambda p, u: round_to_storage(p + u.astype(jnp.float32), storage).astype(jnp.float32),
            p32, updates)
        return jax.tree.map(jnp.subtract, new_p, p32), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def weight_clip(max_abs: float) -> optax.GradientTransformation:
    """Clip the parameters after the update to ``[-max_abs, max_abs]``: ``u' = clip(p+u) - p``."""
    if not max_abs > 0:
        raise ValueError(f"weight_clip: max_abs must be > 0, got {max_abs}")

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("weight_clip needs params (call tx.update(grads, state, params))")
        out = jax.tree.map(
            lambda p, u: jnp.clip(p.astype(jnp.float32) + u, -max_abs, max_abs)
            - p.astype(jnp.float32), params, updates)
        return out, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def with_float32_state(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """Run ``inner`` in float32: gradients and params are cast, so its state is float32."""

    def f32(tree):
        return jax.tree.map(lambda x: x.astype(jnp.float32)
                            if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def init(params):
        return inner.init(f32(params))

    def update(updates, state, params=None):
        return inner.update(f32(updates), state, None if params is None else f32(params))

    return optax.GradientTransformation(init, update)


# ---------------------------------------------------------- loss scaling, skipping steps


class DynamicLossScaleState(NamedTuple):
    scale: jax.Array  # float32 scalar the loss is multiplied by
    good_steps: jax.Array  # int32 finite steps since the last change of scale
    skipped: jax.Array  # int32 steps skipped for non-finite gradients
    inner_state: Any


def dynamic_loss_scale(inner: optax.GradientTransformation, init_scale: float = 2.0 ** 15,
                       period: int = 2000, factor: float = 2.0, min_scale: float = 1.0,
                       max_scale: float = 2.0 ** 24) -> optax.GradientTransformation:
    """FP16 dynamic loss scaling around ``inner`` (the jmp / apex scheme).

    The caller multiplies the loss by ``loss_scale(opt_state)`` before differentiating. Here the
    gradients are divided by it; if any is inf/NaN the step is skipped (zero update, ``inner``'s
    state unchanged), the scale is divided by ``factor`` and ``skipped`` counts it; after
    ``period`` consecutive finite steps the scale is multiplied by ``factor``.
    """
    if period < 1 or factor <= 1 or not 0 < min_scale <= init_scale <= max_scale:
        raise ValueError("dynamic_loss_scale: need period >= 1, factor > 1 and "
                         "0 < min_scale <= init_scale <= max_scale")

    def init(params):
        return DynamicLossScaleState(jnp.float32(init_scale), jnp.int32(0), jnp.int32(0),
                                     inner.init(params))

    def update(updates, state, params=None):
        inv = 1.0 / state.scale
        grads = jax.tree.map(lambda g: g.astype(jnp.float32) * inv, updates)
        finite = all_finite(grads)
        new_updates, new_inner = inner.update(grads, state.inner_state, params)
        new_updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)
        new_inner = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new_inner,
                                 state.inner_state)
        good = jnp.where(finite, state.good_steps + 1, 0)
        grow = good >= period
        scale = jnp.where(finite,
                          jnp.where(grow, jnp.minimum(state.scale * factor, max_scale),
                                    state.scale),
                          jnp.maximum(state.scale / factor, min_scale))
        good = jnp.where(grow, 0, good).astype(jnp.int32)
        skipped = state.skipped + jnp.where(finite, 0, 1).astype(jnp.int32)
        return new_updates, DynamicLossScaleState(scale.astype(jnp.float32), good, skipped,
                                                  new_inner)

    return optax.GradientTransformation(init, update)


def skip_nonfinite(inner: optax.GradientTransformation,
                   max_consecutive: int = 2 ** 30) -> optax.GradientTransformation:
    """Skip (zero update, state kept) any step with inf/NaN gradients; counted in the state.

    ``optax.apply_if_finite``. Its two branches must return the same dtypes, so wrap it in
    :func:`with_float32_state` when gradients are not float32 (``make_optimizer`` does). After
    ``max_consecutive`` skips in a row it gives up and applies the update (default: never).
    """
    return optax.apply_if_finite(inner, max_consecutive_errors=max_consecutive)


def all_finite(tree) -> jax.Array:
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _find_states(opt_state, kinds):
    return [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds))
            if isinstance(s, kinds)]


def loss_scale(opt_state) -> jax.Array:
    """The factor to multiply the loss by before differentiating (1.0 without loss scaling)."""
    found = _find_states(opt_state, DynamicLossScaleState)
    return found[0].scale if found else jnp.float32(1.0)


def skipped_steps(opt_state) -> jax.Array:
    """Steps skipped for non-finite gradients (loss-scale overflows and apply_if_finite)."""
    total = jnp.int32(0)
    for s in _find_states(opt_state, (DynamicLossScaleState, optax.ApplyIfFiniteState)):
        total = total + (s.skipped if isinstance(s, DynamicLossScaleState)
                         else s.total_notfinite).astype(jnp.int32)
    return total


# ----------------------------------------------------------------------------- builders


def kahan_adamw(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 1e-4, storage: str = "bf16",
                comp_dtype=jnp.float32) -> optax.GradientTransformation:
    """AdamW (float32 moments) whose update is Kahan-summed into ``storage``-format weights."""
    return with_float32_state(optax.chain(
        optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
        kahan_update(storage, comp_dtype)))


OPTIMIZER_DEFAULTS: dict[str, Any] = {
    "lr": 3e-4,            # float, or pass learning_rate= (an optax schedule)
    "adam_eps": 1e-5,      # PureJaxRL / CleanRL PPO value
    "grad_clip": 0.5,      # global-norm clip; None or 0 disables (A8 ablation)
    "weight_clip": None,   # |w| bound after the update; None or 0 disables (A8 ablation)
    "master_weights": "fp32",  # fp32 | bf16 | fp8 (A1, A6)
    "kahan": False,        # Kahan-compensated update of bf16/fp8 weights (A7)
    "loss_scale": False,   # dynamic loss scaling (FP16)
    "loss_scale_init": 2.0 ** 15,
    "loss_scale_period": 200,
    "skip_nonfinite": True,
}


def optimizer_config(cfg: Mapping[str, Any] | None = None, **overrides) -> dict[str, Any]:
    """``OPTIMIZER_DEFAULTS`` updated with the known keys of ``cfg`` and ``overrides``."""
    out = dict(OPTIMIZER_DEFAULTS)
    for src in (cfg or {}), overrides:
        out.update({k: v for k, v in src.items() if k in OPTIMIZER_DEFAULTS})
    _check_storage(out["master_weights"])
    return out


def make_optimizer(cfg: Mapping[str, Any] | None = None,
                   learning_rate: float | Callable | None = None) -> optax.GradientTransformation:
    """The optimizer chain from config flags (see ``OPTIMIZER_DEFAULTS``).

    ``[loss-scale | skip-nonfinite] ( clip_by_global_norm -> Adam -> lr -> weight_clip ->
    store (Kahan or naive) )``, all inside :func:`with_float32_state`. The store step is only
    there for bf16/fp8 master weights; ``kahan`` is ignored for fp32 (nothing is rounded).
    """
    c = optimizer_config(cfg)
    lr = c["lr"] if learning_rate is None else learning_rate
    parts = []
    if c["grad_clip"]:
        parts.append(optax.clip_by_global_norm(float(c["grad_clip"])))
    parts.append(optax.scale_by_adam(eps=float(c["adam_eps"])))
    parts.append(optax.scale_by_learning_rate(lr))
    if c["weight_clip"]:
        parts.append(weight_clip(float(c["weight_clip"])))
    if c["master_weights"] != "fp32":
        parts.append(kahan_update(c["master_weights"]) if c["kahan"]
                     else store_update(c["master_weights"]))
    tx = optax.chain(*parts)
    if c["loss_scale"]:
        tx = dynamic_loss_scale(tx, init_scale=float(c["loss_scale_init"]),
                                period=int(c["loss_scale_period"]))
    elif c["skip_nonfinite"]:
        tx = skip_nonfinite(tx)
    return with_float32_state(tx)
