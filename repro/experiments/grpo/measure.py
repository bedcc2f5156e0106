"""GRPO of a language model with FP8 rollouts and FP8 training (claim A12).

    repro record grpo --profile full                   # every (arm, seed) cell
    repro record grpo --profile full --only 'fp8-e2e_*'

One cell per (arm, seed): ``repro.models.grpo.make_train`` with the section's ``grpo``
settings and the arm's overrides (``arms``: the rollout engine's precision, ``rollout_fp8``,
the trainer's ``recipe``, the importance-sampling cap ``is_cap``; ``null``: no correction).
Every arm of a seed starts from the same base model: the supervised warm-up (``sft_recipe``)
is its own program, run once per seed and handed to each arm (:func:`base_model`; its digest
is in every record's ``extra.base``), and every arm draws the same problems. Records per cell:
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
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from repro import results
from repro.config import Section, positive, recipe_names
from repro.models import grpo as R
from repro.precision.recipes import resolve
from repro.studies.runner import Cell, Study
from repro.studies.lowering import compiled_facts, recipe_emulated
from repro.studies.timing import time_rounds

EXPERIMENT = "grpo"


@dataclass(frozen=True, kw_only=True)
class Speed:
    """``speed``: one cell timing a GRPO step's two phases for every recipe of ``recipes``
    (the trainer's and the rollout engine's precision both), compiled first, then in
    ``rounds`` interleaved rounds; ``grpo``: GRPOConfig overrides of the section's ``grpo``
    (the widths timed)."""

    recipes: tuple[str, ...] = recipe_names(("bf16", "fp8-current"))
    rounds: int = positive(10)
    grpo: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``grpo`` section: ``grpo`` holds GRPOConfig fields shared by every
    arm, ``arms`` each arm's overrides of them (arm names as A12's rule writes them);
    ``seeds`` cells per arm (seeds 0 .. seeds - 1); ``compiler_options`` go to every
    compilation (the smoke profile lowers XLA's CPU optimisation)."""

    seeds: int = positive()
    arms: dict[str, dict[str, Any] | None]
    grpo: dict[str, Any]
    speed: Speed | None = None
    compiler_options: dict[str, Any] | None = None


def arm_config(p: Params, arm: str) -> R.GRPOConfig:
    """The GRPO configuration of ``arm``'s cells (one-line ConfigError)."""
    return R.validate({**dict(p.grpo), **dict(p.arms[arm] or {})})


def is_emulated(c: R.GRPOConfig) -> bool:
    """Whether a run of ``c`` emulates FP8 (block-FP8 rollouts and an FP8 KV cache always; a
    trainer recipe with FP8 GEMMs where this platform has no native FP8 path)."""
    from repro.precision import ops

    return bool(c.rollout_fp8 or c.rollout_kv_fp8 or ops.is_emulated(resolve(c.recipe)))


def _floats(x) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in np.asarray(x, np.float64)]


_BASES: dict[tuple[int, str], tuple[Any, dict[str, float]]] = {}


def base_model(train, seed: int, opts: dict[str, Any] | None):
    """``(start, facts)``: ``train.base`` of ``seed``'s key, compiled and run once per seed and
    warm-up program (the lowered text keys the cache), so that every arm of a seed starts from
    the same bits whatever its own program; ``facts``: ``digest`` of the parameters,
    ``compile_s`` and ``wall_s`` of the run that made them."""
    key = jax.random.key(seed)
    lowered = jax.jit(train.base).lower(key)
    tag = (seed, hashlib.sha256(lowered.as_text().encode()).hexdigest())
    if tag not in _BASES:
        _BASES.clear()  # cells run seed by seed: one base model at a time
        t0 = time.perf_counter()
        compiled = lowered.compile(compiler_options=opts)
        t1 = time.perf_counter()
        start = jax.block_until_ready(compiled(key))
        digest = hashlib.sha256(b"".join(
            np.asarray(x).tobytes() for x in jax.tree.leaves(start["params"]))).hexdigest()
        _BASES[tag] = start, {"digest": digest[:16], "compile_s": t1 - t0,
                              "wall_s": time.perf_counter() - t1}
    return _BASES[tag]


def train_cell(arm: str, seed: int, p: Params) -> list[dict[str, Any]]:
    c = arm_config(p, arm)
    opts = dict(p.compiler_options or {}) or None
    train = R.make_train(c)
    start, base = base_model(train, seed, opts)
    t0 = time.perf_counter()
    compiled = jax.jit(train).lower(jax.random.key(seed), start).compile(
        compiler_options=opts)
    t1 = time.perf_counter()
    out = jax.device_get(compiled(jax.random.key(seed), start))
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
             "compile_s": t1 - t0, "wall_s": wall, "base": base}
    common = dict(claims=["A12"], recipe=c.recipe, sizes=sizes, emulated=is_emulated(c),
                  profile=p.profile, extra=extra)
    return [results.make_record(EXPERIMENT, "heldout_accuracy", after, "share", **common),
            results.make_record(EXPERIMENT, "base_accuracy", before, "share", **common)]


# ------------------------------------------------------------------------- speed


def speed_config(p: Params, recipe: str) -> R.GRPOConfig:
    """The timed configuration under ``recipe``: the section's ``grpo``, the speed cell's
    widths, ``recipe`` for the trainer and the rollout engine (per-tensor FP8 where FP8: the
    block FP8 rollouts are emulated, never timed), no warm-up and no evaluation."""
    return R.validate({**dict(p.grpo), **dict(p.speed.grpo), "recipe": recipe,
                       "rollout_recipe": recipe, "rollout_fp8": False, "sft_steps": 0,
                       "eval_problems": 0, "eval_every": 0})


def _phase_args(c: R.GRPOConfig, arrays: bool):
    """A step's inputs: ``(variables, opt_state, key)`` and the rollout ``collect`` returns,
    as arrays (``arrays``) or abstract shapes."""
    ph = R.make_train(c).phases
    key = jax.random.key(0)
    if arrays:
        variables, opt = jax.jit(ph.init)(key)
        return ph, variables, opt, key, jax.jit(ph.collect)(variables["params"], key)
    variables, opt = jax.eval_shape(ph.init, key)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return ph, variables, opt, key, jax.eval_shape(ph.collect, variables["params"], key)


def speed_cell(p: Params) -> list[dict[str, Any]]:
    """Every recipe of ``speed.recipes``: both phases compiled, then timed in
    ``speed.rounds`` rounds (per round each recipe's rollout, then each one's update;
    :func:`repro.studies.timing.time_rounds`). Records per recipe: ``rl_step_s`` (median over
    rounds of rollout + update), ``rollout_tokens_per_s`` and ``update_s``, with the samples
    in round order, ``timing: "paired"``, each phase's compiled facts (FP8 GEMM calls, memory)
    and ``emulated`` where a phase's FP8 ran no FP8 GEMM on this device."""
    import functools
    import uuid

    opts = dict(p.compiler_options or {}) or None
    built, calls = {}, {}
    for r in p.speed.recipes:
        c = speed_config(p, r)
        ph, variables, opt, key, roll = _phase_args(c, arrays=True)
        collect = jax.jit(ph.collect).lower(variables["params"], key).compile(
            compiler_options=opts)
        learn = jax.jit(ph.learn).lower(variables, opt, variables, *roll).compile(
            compiler_options=opts)
        calls[f"{r}/rollout"] = functools.partial(collect, variables["params"], key)
        calls[f"{r}/update"] = functools.partial(learn, variables, opt, variables, *roll)
        built[r] = (c, compiled_facts(collect), compiled_facts(learn))
    samples = time_rounds(calls, p.speed.rounds)
    run_id, recs = uuid.uuid4().hex[:12], []
    for r, (c, f_roll, f_learn) in built.items():
        roll_s, upd_s = samples[f"{r}/rollout"], samples[f"{r}/update"]
        step_s = roll_s + upd_s
        tokens = c.prompts_per_step * c.group_size * c.max_new
        emulated = any(recipe_emulated(r, f["fp8_lowering"]) for f in (f_roll, f_learn))
        model = {k: getattr(c, k) for k in ("d_model", "n_layers", "n_heads", "d_ff")}
        sizes = {"cell": "speed", **model, "n_digits": c.n_digits,
                 "prompts_per_step": c.prompts_per_step, "group_size": c.group_size}
        extra = {"timing": "paired", "run_id": run_id, "paired_with": list(p.speed.recipes),
                 "rounds": p.speed.rounds, "step_samples_s": step_s.tolist(),
                 "rollout_samples_s": roll_s.tolist(), "update_samples_s": upd_s.tolist(),
                 "rollout_tokens": tokens, "rollout_facts": f_roll, "update_facts": f_learn,
                 "config": dataclasses.asdict(c)}
        common = dict(claims=["A12"], recipe=r, sizes=sizes, emulated=emulated,
                      profile=p.profile, extra=extra)
        recs += [results.make_record(EXPERIMENT, "rl_step_s", float(np.median(step_s)), "s",
                                     **common),
                 results.make_record(EXPERIMENT, "rollout_tokens_per_s",
                                     float(np.median(tokens / roll_s)), "tokens/s", **common),
                 results.make_record(EXPERIMENT, "update_s", float(np.median(upd_s)), "s",
                                     **common)]
    return recs


def speed_program(config: dict[str, Any]):
    """What a speed record measures: a step's two phases as timed (the rollout engine's
    ``collect`` and the trainer's ``learn``) on abstract arguments of the timed shapes."""
    from repro.program import Program

    ph, variables, opt, key, roll = _phase_args(R.validate(config), arrays=False)

    def measured(variables, opt, key, roll):
        return ph.collect(variables["params"], key), ph.learn(variables, opt, variables, *roll)

    return Program(measured, (variables, opt, key, roll),
                   kit=(speed_cell, time_rounds, compiled_facts))


def speed_cell_name(p: Params) -> str:
    return f"speed_d{speed_config(p, p.speed.recipes[0]).d_model}"


# ------------------------------------------------------------------------ quality


def program(config: dict[str, Any]):
    """What a cell's records measure (:mod:`repro.program`): the base model's warm-up, compiled
    on its own, then ``make_train`` of the arm's GRPO ``config`` from it (GRPO and held-out
    evaluations), and its kit, :func:`train_cell` and :func:`base_model` (the statistics the
    records hold)."""
    from repro.program import Program

    train = R.make_train(config)

    def measured(rng):
        return train(rng, jax.jit(train.base)(rng))

    return Program(measured, (jax.eval_shape(lambda: jax.random.key(0)),),
                   kit=(train_cell, base_model))


def program_settings(rec: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`program`'s settings from a record: the whole GRPO config it keeps in ``extra``
    (a speed record's program is :func:`speed_program`'s, which ``repro status`` builds from
    the cell)."""
    config = (rec.get("extra") or {}).get("config")
    if (rec.get("sizes") or {}).get("cell") == "speed":
        return None
    return {"config": dict(config)} if isinstance(config, dict) else None


def check(p: Params) -> None:
    """Every arm's configuration, before the first cell runs (one-line ValueError)."""
    for r in (p.speed.recipes if p.speed else ()):
        try:
            speed_config(p, r)
        except ValueError as e:
            raise ValueError(f"params.yaml: grpo.{p.profile}.speed ({r}): {e}") from None
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

    out = [Cell(cell_name(arm, s), lambda _b, a=arm, s=s: train_cell(a, s, p),
                (arm_config(p, arm).recipe,), programs=programs(arm))
           for s in range(p.seeds) for arm in p.arms]
    if p.speed is not None:
        out.append(Cell(speed_cell_name(p), lambda _b: speed_cell(p), tuple(p.speed.recipes),
                        programs=lambda: {r: speed_program(dataclasses.asdict(
                            speed_config(p, r))) for r in p.speed.recipes}))
    return out


STUDY = Study(EXPERIMENT, ("A12",), cells, check,
              about="GRPO held-out accuracy per rollout/trainer precision", params=Params)
