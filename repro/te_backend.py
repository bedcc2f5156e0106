"""Transformer Engine as an optional backend: one more peer in the benchmarks when it imports.

Nothing here is required. ``pip install '.[te]'`` (CUDA machines; TE's JAX package compiles
against CUDA) makes the ``te-*`` recipes of the MLP train-step benchmark available; elsewhere
they are skipped with a note. TE's own flax API is used as its docs show:
``nn.Dense(..., dot_general=te_flax.make_dot_general_cls(recipe)())``. Only TE recipes without
extra flax state are offered (current scaling, MXFP8), so the same train step serves every
backend; TE's DelayedScaling keeps its amax history in a collection of its own.
"""

from __future__ import annotations

import functools

# our name -> TE recipe class in transformer_engine.common.recipe
TE_RECIPES = {"te-fp8-current": "Float8CurrentScaling", "te-mxfp8": "MXFP8BlockScaling"}


@functools.cache
def available() -> bool:
    try:
        import transformer_engine.jax.flax  # noqa: F401
    except Exception:  # ImportError, or a TE build that fails to load its CUDA library
        return False
    return True


def is_te_recipe(name: str) -> bool:
    return name in TE_RECIPES


def dot_general_cls(name: str):
    """The flax module class TE provides for recipe ``name`` (pass an instance as
    ``nn.Dense(dot_general=...)``)."""
    if name not in TE_RECIPES:
        raise ValueError(f"unknown Transformer Engine recipe {name!r}; valid: "
                         f"{', '.join(TE_RECIPES)}")
    if not available():
        raise ValueError(f"recipe {name!r} needs Transformer Engine, which is not installed "
                         "(pip install '.[te]' on a CUDA machine)")
    from transformer_engine.common import recipe as te_recipe
    from transformer_engine.jax import flax as te_flax

    return te_flax.make_dot_general_cls(getattr(te_recipe, TE_RECIPES[name])())
