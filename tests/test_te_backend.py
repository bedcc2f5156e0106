"""Transformer Engine is optional: absent, its recipes are skipped with a clear note; present,
its flax dot_general is wired into the benchmark. TE is not installable on this CPU machine, so
the 'present' case uses a stand-in module with TE's documented API (make_dot_general_cls)."""

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from repro.experiments.mlp_step import measure as mlpbench
from repro.precision import peers as te_backend
from repro.precision import resolve


@pytest.fixture
def no_te(monkeypatch):
    monkeypatch.setattr(te_backend, "te_available", lambda: False)


@pytest.fixture
def fake_te(monkeypatch):
    made = []

    class Float8CurrentScaling:
        pass

    class MXFP8BlockScaling:
        pass

    def make_dot_general_cls(recipe):
        made.append(type(recipe).__name__)

        class DotGeneral(nn.Module):
            @nn.compact
            def __call__(self, lhs, rhs, dimension_numbers, precision=None,
                         preferred_element_type=None):
                return jax.lax.dot_general(lhs, rhs, dimension_numbers,
                                           preferred_element_type=preferred_element_type)

        return DotGeneral

    te = types.ModuleType("transformer_engine")
    te_jax = types.ModuleType("transformer_engine.jax")
    te_flax = types.ModuleType("transformer_engine.jax.flax")
    te_common = types.ModuleType("transformer_engine.common")
    te_recipe = types.ModuleType("transformer_engine.common.recipe")
    te_flax.make_dot_general_cls = make_dot_general_cls
    te_recipe.Float8CurrentScaling = Float8CurrentScaling
    te_recipe.MXFP8BlockScaling = MXFP8BlockScaling
    te.jax, te_jax.flax, te.common, te_common.recipe = te_jax, te_flax, te_common, te_recipe
    for name, mod in {"transformer_engine": te, "transformer_engine.jax": te_jax,
                      "transformer_engine.jax.flax": te_flax,
                      "transformer_engine.common": te_common,
                      "transformer_engine.common.recipe": te_recipe}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(te_backend, "te_available", lambda: True)
    return made


def test_missing_te_is_one_clear_error(no_te):
    with pytest.raises(ValueError, match="not installed") as e:
        te_backend.te_dot_general_cls(resolve("te-fp8-current"))
    assert "\n" not in str(e.value)


def test_unknown_te_recipe_lists_valid(fake_te):
    with pytest.raises(ValueError, match="fp8/current"):
        te_backend.te_dot_general_cls(resolve("te-fp8-current:gemm=nvfp4"))
    with pytest.raises(ValueError, match="unknown recipe 'te-nvfp9'"):
        resolve("te-nvfp9")


def test_record_skips_te_recipes_without_te(no_te, tmp_path, capsys):
    from repro.studies import runner

    p = mlpbench.Params(profile="smoke", depth=2, recipes=("bf16", "te-fp8-current"), batch=32,
                        widths=(16,), repeats=1)
    runner.run(mlpbench.STUDY, p, tmp_path, force=True, progress=False)
    assert "skipping te-fp8-current" in capsys.readouterr().out
    from repro.evidence import load_records

    assert set(load_records("mlp_step", roots=[tmp_path]).recipe) == {"bf16"}


def test_te_recipe_runs_through_te_dot_general(fake_te):
    step, variables, opt_state, x, y = mlpbench._setup(resolve("te-fp8-current"), 16, 32, 2)
    assert x.dtype == jnp.bfloat16
    first = None
    for _ in range(3):
        variables, opt_state, loss = step(variables, opt_state, x, y)
        first = float(loss) if first is None else first
    assert np.isfinite(float(loss)) and float(loss) < first
    # TE's class is built for every Dense layer each time the model is traced (init, apply).
    assert set(fake_te) == {"Float8CurrentScaling"} and len(fake_te) >= 2
