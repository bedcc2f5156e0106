"""GRPO of a language model with FP8 rollouts and FP8 training (claim A12).

    repro record grpo --profile full                   # every (arm, seed) cell
    repro record grpo --profile full --only 'fp8-e2e_*'

One cell per (arm, seed): ``repro.models.grpo.make_train`` with the section's ``grpo``
settings and the arm's overrides (``arms``: the rollout engine's precision, ``rollout_fp8``,
the trainer's ``recipe``, the importance-sampling cap ``is_cap``; ``null``: no correction).
Every arm of a seed starts from the same base model (the same key, the same supervised
warm-up in ``sft_recipe``) and draws the same problems. Records per cell:
``heldout_accuracy`` (greedy exact match of the rollout engine on held-out problems after
GRPO) and ``base_accuracy`` (the same before it), with in ``extra`` the held-out accuracy
every ``eval_every`` steps (``curve``, at ``curve_steps``), the rollouts' mean reward, the
token KL between rollout engine and trainer (``mismatch_kl``) and the share of tokens whose
importance weight was capped (``is_capped_frac``) per step. FP8 here is emulated
(quantize-dequantize, then the GEMM in the recipe's compute dtype): Hopper has no block-FP8
GEMM in this code, and on a CPU every FP8 product is emulated; such records say
``emulated: true``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from repro import results
from repro.config import Section, positive
from repro.models import grpo as R
from repro.precision.recipes import resolve
from repro.studies.runner import Cell, Study

EXPERIMENT = "grpo"


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``grpo`` section: ``grpo`` holds GRPOConfig fields shared by every
    arm, ``arms`` each arm's overrides of them (arm names as A12's rule writes them);
    ``seeds`` cells per arm (seeds 0 .. seeds - 1); ``compiler_options`` go to every
    compilation (the smoke profile lowers XLA's CPU optimisation)."""

    seeds: int = positive()
    arms: dict[str, dict[str, Any] | None]
    grpo: dict[str, Any]
    compiler_options: dict[str, Any] | None = None


def arm_config(p: Params, arm: str) -> R.GRPOConfig:
    """The GRPO configuration of ``arm``'s cells (one-line ConfigError)."""
    return R.validate({**dict(p.grpo), **dict(p.arms[arm] or {})})


def is_emulated(c: R.GRPOConfig) -> bool:
    """Whether a run of ``c`` emulates FP8 (block-FP8 rollouts always; a trainer recipe with
    FP8 GEMMs where this platform has no native FP8 path)."""
    from repro.precision import ops

    return bool(c.rollout_fp8 or ops.is_emulated(resolve(c.recipe)))


def _floats(x) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in np.asarray(x, np.float64)]


def train_cell(arm: str, seed: int, p: Params) -> list[dict[str, Any]]:
    c = arm_config(p, arm)
    t0 = time.perf_counter()
    compiled = jax.jit(R.make_train(c)).lower(jax.random.key(seed)).compile(
        compiler_options=dict(p.compiler_options or {}) or None)
    t1 = time.perf_counter()
    out = jax.device_get(compiled(jax.random.key(seed)))
    wall = time.perf_counter() - t1
    m = {k: np.asarray(v) for k, v in out["metrics"].items()}
    before, after = (float(x) for x in np.asarray(out["heldout_reward"]))
    every = c.eval_every or c.steps
    curve = np.asarray(out.get("heldout_curve", [before, after]))
    model = {k: getattr(c, k) for k in ("d_model", "n_layers", "n_heads", "d_ff")}
    sizes = {"arm": arm, "seed": seed, **model, "n_digits": c.n_digits, "steps": c.steps,
             "prompts_per_step": c.prompts_per_step, "group_size": c.group_size,
             "eval_problems": c.eval_problems}
    extra = {"arm": arm, "config": {k: getattr(c, k) for k in c.__dataclass_fields__},
             "rollout": "block-fp8" if c.rollout_fp8 else c.rollout_recipe,
             "trainer": c.recipe, "is_cap": c.is_cap,
             "curve": _floats(curve), "curve_steps": list(range(0, c.steps + 1, every)),
             "reward": _floats(m["reward"]), "mismatch_kl": _floats(m["mismatch_kl"]),
             "is_capped_frac": _floats(m["is_capped_frac"]),
             "clip_frac": _floats(m["clip_frac"]), "length": _floats(m["length"]),
             "sft_loss": _floats(out["sft_loss"][[0, -1]]) if "sft_loss" in out else None,
             "compile_s": t1 - t0, "wall_s": wall}
    common = dict(claims=["A12"], recipe=c.recipe, sizes=sizes, emulated=is_emulated(c),
                  profile=p.profile, extra=extra)
    return [results.make_record(EXPERIMENT, "heldout_accuracy", after, "share", **common),
            results.make_record(EXPERIMENT, "base_accuracy", before, "share", **common)]


def program(config: dict[str, Any]):
    """What a cell's records measure (:mod:`repro.program`): the whole trained function,
    ``make_train`` of the arm's GRPO ``config`` (warm-up, GRPO and held-out evaluations), and
    its kit, :func:`train_cell` (the statistics the records hold)."""
    from repro.program import Program

    return Program(R.make_train(config), (jax.eval_shape(lambda: jax.random.key(0)),),
                   kit=(train_cell,))


def program_settings(rec: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`program`'s settings from a record: the whole GRPO config it keeps in ``extra``."""
    config = (rec.get("extra") or {}).get("config")
    return {"config": dict(config)} if isinstance(config, dict) else None


def check(p: Params) -> None:
    """Every arm's configuration, before the first cell runs (one-line ValueError)."""
    if not p.arms:
        raise ValueError(f"params.yaml: grpo.{p.profile}.arms: names no arm")
    for arm in p.arms:
        try:
            c = arm_config(p, arm)
        except ValueError as e:
            raise ValueError(f"params.yaml: grpo.{p.profile}.arms.{arm}: {e}") from None
        if not c.eval_problems:
            raise ValueError(f"params.yaml: grpo.{p.profile}.arms.{arm}: eval_problems must "
                             "be > 0 (the cells record held-out accuracy)")


def cell_name(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


def cells(p: Params) -> list[Cell]:
    """Seed by seed, every arm (a partial run holds whole seeds of paired arms). A cell's
    recipe tag is its trainer's recipe (``--recipe fp8-current`` keeps the FP8-trained arms)."""
    def programs(arm):
        return lambda: {"": program(dataclasses.asdict(arm_config(p, arm)))}

    return [Cell(cell_name(arm, s), lambda _b, a=arm, s=s: train_cell(a, s, p),
                 (arm_config(p, arm).recipe,), programs=programs(arm))
            for s in range(p.seeds) for arm in p.arms]


STUDY = Study(EXPERIMENT, ("A12",), cells, check,
              about="GRPO held-out accuracy per rollout/trainer precision", params=Params)
