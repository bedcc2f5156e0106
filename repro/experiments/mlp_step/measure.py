"""The whole training step of a ReLU MLP (forward, backward, Adam with FP32 master weights),
timed per precision recipe in the same process, interleaved, on the same device.

Recipes: any name of the precision registry (``repro.precision``), the peers included:
``flax-fp8`` (``flax.linen.fp8_ops.Fp8DirectDotGeneralOp``, delayed scaling) and the Transformer
Engine entries ``te-*`` where TE is installed (skipped with a note elsewhere). A cell is
one (width, batch, depth): all its recipes are timed together in rounds (recipe A, B, C, A, B,
C, ...), so a speedup is always a ratio of two timings from the same run.

    repro record mlp_step --profile full      # the H200 study, resumable per width
    repro record mlp_step --profile full --recipe int8   # int8 beside bf16, one cell per
                                                         # width: w4096_b65536_d3_bf16-int8

Each record says how its program ran (``repro.studies.lowering``): ``extra.fp8_lowering``, for
an INT8 recipe ``extra.int8_lowering`` (``s8-gemm``: ``s8 x s8 -> s32`` products), and
``emulated`` where the device ran the format by other arithmetic.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from repro import results
from repro.config import Section, from_cli, positive, recipe_names
from repro.precision import layers, peers
from repro.precision.recipes import Recipe, resolve
from repro.program import Program
from repro.studies import lowering
from repro.studies.runner import Cell, Study
from repro.studies.lowering import compiled_facts, recipe_emulated
from repro.studies.timing import quartiles, stepper, time_interleaved

EXPERIMENT = "mlp_step"


class MLP(nn.Module):
    """``depth`` Dense layers of ``width`` with ReLU between them."""

    width: int
    depth: int
    recipe: Recipe

    @nn.compact
    def __call__(self, x):
        for i in range(self.depth):
            act = "relu" if i < self.depth - 1 else None
            x = layers.dense(self.width, self.recipe, activation=act)(x)
        return x


def make_train_step(model: MLP, tx: optax.GradientTransformation):
    def loss_fn(variables, x, y):
        pred = model.apply(variables, x)
        return jnp.mean(jnp.square(pred.astype(jnp.float32) - y))

    def step(variables, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(variables, x, y)
        variables, opt_state = layers.apply_gradients(variables, grads, tx, opt_state)
        return variables, opt_state, loss

    return step


def step_flops(batch: int, width: int, depth: int) -> float:
    """Forward (2BW^2) plus data and weight gradients (4BW^2) per layer."""
    return 6.0 * batch * width * width * depth


def _setup(recipe: Recipe, width: int, batch: int, depth: int, seed: int = 0,
           lr: float = 1e-4):
    model = MLP(width, depth, recipe)
    kx, ky, kp = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (batch, width), jnp.float32).astype(recipe.dtype)
    y = jax.random.normal(ky, (batch, width), jnp.float32)
    variables = model.init(kp, x[:8])  # shapes only: no eager GEMM of the whole batch
    variables = layers.init_amax_ring(variables, recipe)  # a "ring" recipe's amax histories
    tx = optax.adam(lr)
    opt_state = tx.init(variables["params"])
    step = jax.jit(make_train_step(model, tx), donate_argnums=(0, 1))
    return step, variables, opt_state, x, y


def program(recipe: str, width: int, batch: int, depth: int, lr: float = 1e-4) -> Program:
    """What a cell's record of ``recipe`` measures: the train step of :func:`_setup` on
    abstract arguments of the cell's shapes, and the kit that times it."""
    recipe = resolve(recipe)
    model = MLP(width, depth, recipe)
    x = jax.ShapeDtypeStruct((batch, width), recipe.dtype)
    y = jax.ShapeDtypeStruct((batch, width), jnp.float32)
    variables = jax.eval_shape(lambda k, x8: layers.init_amax_ring(model.init(k, x8), recipe),
                               jax.random.key(0), jax.ShapeDtypeStruct((8, width), x.dtype))
    tx = optax.adam(lr)
    opt_state = jax.eval_shape(tx.init, variables["params"])
    return Program(make_train_step(model, tx), (variables, opt_state, x, y),
                   kit=(stepper, time_interleaved, quartiles, compiled_facts, step_flops))


def program_settings(rec: dict) -> dict | None:
    """:func:`program`'s settings of a record: its recipe and sizes."""
    sizes = rec.get("sizes") or {}
    if not rec.get("recipe") or not all(k in sizes for k in ("width", "batch", "depth")):
        return None
    return {"recipe": rec["recipe"], "width": int(sizes["width"]),
            "batch": int(sizes["batch"]), "depth": int(sizes["depth"])}


def _compile(step, variables, opt_state, x, y):
    """Compile once; return the executable and what it says about itself."""
    compiled = step.lower(variables, opt_state, x, y).compile()
    return compiled, compiled_facts(compiled)


def _log(msg: str) -> None:
    """One progress line on stderr (compiles of wide FP8 steps can take a while on a GPU)."""
    print(f"mlp_step: {msg}", file=sys.stderr, flush=True)


def bench_cell(width: int, batch: int, depth: int, recipes: list[str], repeats: int,
               steps_per_sample: int = 5, profile: str | None = None) -> list[dict]:
    """Time every recipe's train step for one shape, interleaved; one record per metric."""
    facts_of, runners = {}, {}
    resolved = {r: resolve(r) for r in recipes}
    for r in recipes:
        t0 = time.perf_counter()
        step, variables, opt_state, x, y = _setup(resolved[r], width, batch, depth)
        t1 = time.perf_counter()
        _log(f"w{width} {r}: compiling")
        step, facts = _compile(step, variables, opt_state, x, y)
        facts.update(lowering.int8_facts(resolved[r], step))
        t2 = time.perf_counter()
        variables, opt_state, loss = step(variables, opt_state, x, y)  # warm up
        jax.block_until_ready(loss)
        _log(f"w{width} {r}: init {t1 - t0:.1f} s, compile {t2 - t1:.1f} s, first step "
             f"{time.perf_counter() - t2:.2f} s, lowering "
             f"{lowering.narrow_lowering(resolved[r], facts)}")
        facts_of[r], runners[r] = facts, stepper(step, variables, opt_state, x, y)
    samples_of = time_interleaved(runners, repeats, steps_per_sample, f" at width {width}")

    records = []
    sizes = {"batch": batch, "width": width, "depth": depth}
    run_id = f"{time.time():.0f}"
    for r in recipes:
        facts, s = facts_of[r], samples_of[r]
        q1, med, q3 = quartiles(s)
        # flax's FP8 op or a Transformer Engine recipe: not one of this repository's recipes
        emulated = (jax.default_backend() != "gpu" if resolved[r].backend != "repro"
                    else recipe_emulated(resolved[r], facts))
        common = dict(claims=["A2", "A4"], recipe=r, sizes=sizes, repeats=len(s),
                      emulated=emulated, profile=profile,
                      extra={"run_id": run_id, "samples_ms": (s * 1e3).round(4).tolist(),
                             "steps_per_sample": steps_per_sample, **facts})
        records.append(results.make_record(EXPERIMENT, "step_time_ms", med * 1e3, "ms",
                                           spread=(q3 - q1) * 1e3, **common))
        flops = step_flops(batch, width, depth)
        records.append(results.make_record(EXPERIMENT, "tflops", flops / med / 1e12, "TFLOP/s",
                                           spread=flops / q1 / 1e12 - flops / q3 / 1e12,
                                           **common))
        if facts["memory_bytes"] is not None:
            records.append(results.make_record(EXPERIMENT, "step_memory_bytes",
                                               facts["memory_bytes"], "bytes", **common))
    return records


@dataclass(frozen=True, kw_only=True)
class Params(Section):
    """``params.yaml``'s ``mlp_step`` section: ``recipes`` form the main cell of each width;
    ``levers`` (``base:field=value`` ablations) a second cell per width of ``lever_widths``,
    timed with bf16 and the recipes they ablate; ``variants`` (candidate recipes, e.g. a
    ``base:field=value`` variant of a default) a third cell per width of ``variant_widths``,
    timed likewise with bf16 and the recipes they vary. ``selected``: ``--recipe``, recipes
    timed beside bf16 in cells of their own (``w4096_b65536_d3_bf16-int8``), which never mask
    the main cells."""

    depth: int = positive()
    batch: int = positive()
    widths: tuple[int, ...] = positive()
    repeats: int = positive()
    recipes: tuple[str, ...] = recipe_names()
    levers: tuple[str, ...] = recipe_names(())
    lever_widths: tuple[int, ...] | None = positive(None)
    variants: tuple[str, ...] = recipe_names(())
    variant_widths: tuple[int, ...] | None = positive(None)
    selected: tuple[str, ...] | None = from_cli()


def narrow(p: Params, recipes) -> Params:
    """``--recipe``: the named recipes (each must resolve), bf16 first, one cell per width."""
    for r in recipes:
        resolve(r)  # a one-line error naming the valid recipes
    return replace(p, selected=tuple(dict.fromkeys(["bf16", *recipes])))


def _usable(names) -> list[str]:
    """The names, Transformer Engine entries left out (with a note) where TE is missing."""
    out = []
    for r in names:
        if resolve(r).backend == "te" and not peers.te_available():
            print(f"mlp_step: skipping {r}: Transformer Engine is not installed")
            continue
        out.append(r)
    return out


def _beside_bases(names: list[str]) -> list[str]:
    """bf16, the recipes ``names`` vary (the part before ``:``), then ``names``: a cell that
    times each beside what it varies."""
    return list(dict.fromkeys(["bf16", *(r.split(":", 1)[0] for r in names)])) + names


def cells(p: Params) -> list[Cell]:
    """The main cell of every width first, then the lever cells: each lever ablation is
    timed with bf16 and the base recipe it ablates, in one process; then the variant cells,
    each variant likewise beside bf16 and the recipe it varies."""
    if p.selected:
        chosen = _usable(p.selected)
        plan = [(w, "_" + "-".join(chosen), chosen) for w in p.widths]
        return _cells(p, plan)
    recipes, levers, variants = _usable(p.recipes), _usable(p.levers), _usable(p.variants)
    plan = [(w, "", recipes) for w in p.widths]
    plan += [(w, "_levers", _beside_bases(levers)) for w in (p.lever_widths or p.widths)
             if levers]
    plan += [(w, "_variants", _beside_bases(variants)) for w in (p.variant_widths or p.widths)
             if variants]
    return _cells(p, plan)


def _cells(p: Params, plan) -> list[Cell]:
    """One cell per ``(width, name suffix, recipes)`` of ``plan``."""

    def one(width, names):
        return lambda _budget: bench_cell(width, p.batch, p.depth, names, p.repeats,
                                          profile=p.profile)

    def programs(width, names):
        return lambda: {r: program(r, width, p.batch, p.depth) for r in names}

    return [Cell(f"w{w}_b{p.batch}_d{p.depth}{suffix}", one(w, names),
                 programs=programs(w, names)) for w, suffix, names in plan]


STUDY = Study(EXPERIMENT, ("A2", "A4"), cells, about="the MLP train step per recipe",
              params=Params, narrow=narrow)
