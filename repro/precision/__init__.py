"""Precision: recipes (the one registry), number formats, scaling, quantized GEMMs, layers and
the optimizer pieces for low-precision weights."""

from repro.precision.recipes import REGISTRY, Recipe, names, resolve

__all__ = ["REGISTRY", "Recipe", "names", "resolve"]
