"""Other libraries' quantized GEMMs as dense layers: the peers the benchmarks compare against.

A registry entry with ``backend`` "flax", "te" or "jax" runs its GEMMs here instead of in
``repro.precision.ops``; :func:`repro.precision.layers.dense` picks the module.

* "flax": ``flax.linen.fp8_ops.Fp8DirectDotGeneralOp`` (delayed scaling, FP8 operands straight
  into ``dot_general``) inside ``flax.linen.Dense``.
* "te": Transformer Engine's flax ``dot_general`` (``make_dot_general_cls``), where TE is
  installed (``pip install '.[te]'`` on a CUDA machine; TE's JAX package compiles against
  CUDA). Only TE recipes without extra flax state are offered (current scaling, MXFP8), so the
  same train step serves every backend.
* "jax": ``jax.nn.scaled_dot_general`` with the ``nvfp4`` config in all three GEMMs (GPU only:
  it has no CPU lowering), per-tensor global scales, round to nearest, no RHT.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops
from jax import lax

from repro import hardware
from repro.precision.recipes import Recipe

# (gemm, scaling) -> Transformer Engine recipe class in transformer_engine.common.recipe
_TE_RECIPES = {("fp8", "current"): "Float8CurrentScaling", ("mxfp8", "block"): "MXFP8BlockScaling"}


@functools.cache
def te_available() -> bool:
    try:
        import transformer_engine.jax.flax  # noqa: F401
    except Exception:  # ImportError, or a TE build that fails to load its CUDA library
        return False
    return True


def te_dot_general_cls(recipe: Recipe):
    """The flax module class TE provides for ``recipe`` (pass an instance as
    ``nn.Dense(dot_general=...)``)."""
    key = (recipe.gemm, recipe.scaling)
    if key not in _TE_RECIPES:
        raise ValueError(f"recipe {recipe.name!r}: Transformer Engine has no flax recipe for "
                         f"gemm={recipe.gemm}, scaling={recipe.scaling} here; valid: "
                         + ", ".join(f"{g}/{s}" for g, s in _TE_RECIPES))
    if not te_available():
        raise ValueError(f"recipe {recipe.name!r} needs Transformer Engine, which is not "
                         "installed (pip install '.[te]' on a CUDA machine)")
    from transformer_engine.common import recipe as te_recipe
    from transformer_engine.jax import flax as te_flax

    return te_flax.make_dot_general_cls(getattr(te_recipe, _TE_RECIPES[key])())


def _jax_nvfp4_gemm(a, b, dims):
    """One GEMM through ``jax.nn.scaled_dot_general`` with the ``nvfp4`` config.

    The built-in's per-tensor global scale is a constant of its config (default 1.0), and its
    own VJP takes the gradient's global scale before the gradient exists. NVFP4 needs
    ``amax / (448 * 6)`` per tensor (else small gradients underflow the E4M3 block scales), so
    each operand is divided by its global scale here and the product multiplied back: the same
    arithmetic the built-in does with a global scale in its config.
    """
    def gscale(t):
        amax = jnp.max(jnp.abs(t.astype(jnp.float32)))
        return lax.stop_gradient(jnp.where(amax > 0, amax / (448.0 * 6.0), 1.0))

    ga, gb = gscale(a), gscale(b)
    cfg = jax.nn.get_scaled_dot_general_config("nvfp4")
    out = jax.nn.scaled_dot_general(a.astype(jnp.float32) / ga, b.astype(jnp.float32) / gb,
                                    dims, preferred_element_type=jnp.float32,
                                    configs=[cfg, cfg, cfg])
    return out * (ga * gb)


@jax.custom_vjp
def jax_nvfp4_dot(x, w):
    """``x[M, K] @ w[K, N]`` with JAX's built-in NVFP4 in all three GEMMs (1x16 blocks along
    each GEMM's contraction axis, per-tensor global scales, round-to-nearest, no RHT). GPU
    only (:func:`check_jax_nvfp4_available`)."""
    check_jax_nvfp4_available()
    return _jax_nvfp4_gemm(x, w, (((1,), (0,)), ((), ()))).astype(x.dtype)


def _jax_nvfp4_fwd(x, w):
    return jax_nvfp4_dot(x, w), (x, w)


def _jax_nvfp4_bwd(res, g):
    x, w = res
    dx = _jax_nvfp4_gemm(g, w, (((1,), (1,)), ((), ())))  # g[M,N] . w[K,N] -> [M,K]
    dw = _jax_nvfp4_gemm(x, g, (((0,), (0,)), ((), ())))  # x[M,K] . g[M,N] -> [K,N]
    return dx.astype(x.dtype), dw.astype(w.dtype)


jax_nvfp4_dot.defvjp(_jax_nvfp4_fwd, _jax_nvfp4_bwd)


def check_jax_nvfp4_available() -> None:
    """The JAX peer is a GPU reference: on another platform ``jax.nn.scaled_dot_general``
    either has no lowering or runs a decomposition that is neither JAX's GPU kernel nor this
    repository's recipe, so it is refused with a one-line error naming the platform needed."""
    if hardware.platform() != "gpu":
        raise RuntimeError(
            f"recipe 'jax-nvfp4' needs a GPU (an NVIDIA GPU through jax[cuda]); this is a "
            f"{hardware.platform().upper()} backend (the repository's own NVFP4 recipe, "
            "'nvfp4', runs everywhere)")


class JaxNVFP4Dense(nn.Module):
    """A linear layer through :func:`jax_nvfp4_dot` (BF16 activations)."""

    features: int
    use_bias: bool = False
    kernel_init: Callable = nn.initializers.normal(0.02)
    bias_init: Callable = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x):
        check_jax_nvfp4_available()
        w = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        x2 = x.astype(jnp.bfloat16).reshape(-1, x.shape[-1])
        y = jax_nvfp4_dot(x2, w).reshape(*x.shape[:-1], self.features)
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,), jnp.float32
                               ).astype(y.dtype)
        return y


def dense(features: int, recipe: Recipe, *, use_bias: bool = True,
          kernel_init: Callable | None = None, name: str | None = None) -> nn.Module:
    """The peer layer of ``recipe.backend`` ("flax", "te" or "jax")."""
    kw = {} if kernel_init is None else {"kernel_init": kernel_init}
    if recipe.backend == "jax":
        return JaxNVFP4Dense(features, use_bias=use_bias, name=name, **kw)
    common = dict(dtype=recipe.dtype, param_dtype=jnp.float32, use_bias=use_bias, name=name,
                  **kw)
    if recipe.backend == "flax":
        return nn.Dense(features, dot_general_cls=fp8_ops.Fp8DirectDotGeneralOp, **common)
    if recipe.backend == "te":
        return nn.Dense(features, dot_general=te_dot_general_cls(recipe)(), **common)
    raise ValueError(f"recipe {recipe.name!r}: backend {recipe.backend!r} is not a peer")
