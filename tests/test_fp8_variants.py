"""The FP8 recipe variants ``amax_history="ring"`` and ``fp8_weights="stored"`` compute what the
recipes they vary compute, bit for bit, and their programs have the structure they are for
(CPU).

* Ring: every tensor's amax history in one ``[history_len, n]`` array written by ONE
  dynamic-update-slice per step (``repro.precision.scaling.ring_update``) gives the scales of
  the per-tensor shift-register history it replaces (``delayed_update``), over more steps than
  the history holds, with amaxes of 0, inf, NaN, subnormal and near FP32's maximum.
* Stored: the FP8 weight copy written by the optimizer step (``ops.stored_weight``) is the one
  the per-call recipe quantizes in its next forward pass; the layers then never read the FP32
  master weight.

Reference: the unchanged recipes (``fp8-delayed``, ``fp8-current``, ``fp8-noscale``), whose own
numerics ``tests/test_ops.py`` and ``tests/test_scaling.py`` check against ml_dtypes and
float64. Equality is bitwise (float32 bit patterns; NaN where both are NaN)."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro.experiments.mlp_step import measure as mlp_step
from repro.precision import layers, ops, resolve
from repro.precision import scaling as S
from repro.precision.layers import AMAX_RING, FP8_META

E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
E5M2_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def same(a, b) -> bool:
    """Bitwise equality of float arrays (any NaN matches any NaN: XLA may pick the payload)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a)
    return a.shape == b.shape and bool(np.all(nan == np.isnan(b))) and bool(
        np.all(bits(np.where(nan, 0, a)) == bits(np.where(nan, 0, b))))


def amax_sequence(steps=23, n=5, seed=0):
    """Per-step amaxes of ``n`` tensors: log-normal, with 0, inf, NaN, a subnormal and a value
    near FP32's maximum at different steps and tensors."""
    v = np.random.default_rng(seed).lognormal(0.0, 3.0, (steps, n)).astype(np.float32)
    v[3, 0] = 0.0
    v[4, 1] = np.inf
    v[6, 2] = np.nan
    v[9, 3] = 1e-42  # subnormal: its scale would underflow, compute_scale gives 1.0
    v[10, 4] = 3.4e38
    v[11:13, 0] = 0.0  # two steps in a row
    return v


# ------------------------------------------------------------------ scaling: ring vs shift


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 3])
@pytest.mark.parametrize("jit", [False, True])
def test_ring_gives_the_shift_history_scales_bit_for_bit(algo, margin, jit):
    """Op by op, and compiled (where XLA turns the division by a constant FP8 maximum into a
    multiplication by its reciprocal, in both layouts alike)."""
    H, amaxes = 4, amax_sequence()
    n = amaxes.shape[1]
    fmax = [E4M3_MAX, E4M3_MAX, E5M2_MAX, E4M3_MAX, E5M2_MAX]
    shift = [S.init_delayed(H) for _ in range(n)]
    ring = S.init_ring([f"t{i}" for i in range(n)], fmax, H, algo, margin)
    scales = jnp.ones(n, jnp.float32)

    def push(states, a):
        return [S.delayed_update(s, a[i], fmax[i], algo, margin) for i, s in enumerate(states)]

    push_all, update = (jax.jit(push), jax.jit(S.ring_update)) if jit else (push, S.ring_update)
    kept = 0
    for t, a in enumerate(amaxes):
        shift = push_all(shift, a)
        before = scales
        ring, scales = update(ring, a, scales)
        ref = np.array([np.asarray(s.scale) for s in shift])
        assert same(scales, ref), (t, ref, np.asarray(scales))
        kept += int(np.sum(bits(scales) == bits(before)))
        # the ring holds the last H amaxes of each tensor: row t mod H is step t's
        assert same(np.asarray(ring.history)[t % H], a)
        assert float(ring.pos) == (t + 1) % H
    assert kept > 0  # steps with amax 0 / inf / NaN kept a previous scale (the rule is hit)


def test_ring_nan_stays_until_overwritten_and_keeps_the_scale():
    H = 3
    ring = S.init_ring(["a"], [E4M3_MAX], H)
    s = jnp.ones(1, jnp.float32)
    ring, s = S.ring_update(ring, jnp.array([2.0]), s)
    good = float(s[0])
    np.testing.assert_allclose(good, 2.0 / E4M3_MAX, rtol=2e-7)
    ring, s = S.ring_update(ring, jnp.array([np.nan]), s)
    for _ in range(H - 1):  # the NaN is in the history: max is NaN, the scale is kept
        assert float(s[0]) == good
        ring, s = S.ring_update(ring, jnp.array([1.0]), s)
    assert float(s[0]) == good
    ring, s = S.ring_update(ring, jnp.array([1.0]), s)  # the NaN is overwritten now
    np.testing.assert_allclose(float(s[0]), 1.0 / E4M3_MAX, rtol=2e-7)


def test_ring_checks():
    with pytest.raises(ValueError, match="history_len"):
        S.init_ring(["a"], [1.0], 0)
    with pytest.raises(ValueError, match="one fmax per tensor"):
        S.init_ring(["a", "b"], [1.0])
    with pytest.raises(ValueError, match="algo"):
        S.init_ring(["a"], [1.0], algo="mean")
    ring = S.init_ring(["a", "b"], [1.0, 1.0], 4)
    with pytest.raises(ValueError, match="2 tensors"):
        S.ring_update(ring, jnp.ones(3), jnp.ones(3))


# ---------------------------------------------------------------- the MLP train step

WIDTH, BATCH, DEPTH = 128, 64, 3


def train(recipe, steps=7, inputs=None):
    """Losses and final variables of ``steps`` steps of mlp_step's train step; step i's
    input is ``x * (1 + i)`` (changing amaxes) unless ``inputs`` maps i to another."""
    step, v, o, x, y = mlp_step._setup(resolve(recipe), WIDTH, BATCH, DEPTH)
    losses = []
    for i in range(steps):
        xi = (inputs or {}).get(i, x * (1 + i))
        v, o, loss = step(v, o, xi.astype(x.dtype), y)
        losses.append(np.asarray(loss))
    return losses, v


def scales_of(meta):
    flat = {"/".join(k): v for k, v in jax.tree_util.tree_flatten_with_path(meta)[0]
            for k in [tuple(str(getattr(p, "key", getattr(p, "name", p))) for p in k)]}
    return {k: np.asarray(v) for k, v in flat.items() if k.endswith("_scale")}


def assert_same_run(ref, var):
    """Equal losses, parameters and (delayed scaling) scales of every FP8 tensor."""
    (la, va), (lb, vb) = ref, var
    assert all(same(a, b) for a, b in zip(la, lb)), (la, lb)
    pa, pb = jax.tree.leaves(va["params"]), jax.tree.leaves(vb["params"])
    assert len(pa) == len(pb) and all(same(a, b) for a, b in zip(pa, pb))
    if FP8_META in va:  # delayed scaling: its state
        sa, sb = scales_of(va[FP8_META]), scales_of(vb[FP8_META])
        assert sa and sa.keys() == sb.keys() and all(same(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("variant", ["amax_history=ring", "fp8_weights=stored",
                                     "amax_history=ring,fp8_weights=stored"])
def test_mlp_step_variants_of_fp8_delayed_train_bit_for_bit(variant):
    base = "fp8-delayed:amax_history_len=4"  # 7 steps: the histories wrap around
    ref = train(base)
    assert len({float(x) for x in ref[0]}) > 3  # the run moves (a stuck run proves nothing)
    assert_same_run(ref, train(f"{base},{variant}"))


def test_mlp_step_ring_with_zero_and_inf_inputs_keeps_scales_as_the_shift_history():
    base = "fp8-delayed:amax_history_len=2"
    x = jax.random.normal(jax.random.key(5), (BATCH, WIDTH))
    inputs = {2: x * 0.0, 3: x * 0.0, 5: x.at[0, 0].set(jnp.inf)}  # amax 0 twice, then inf
    ref = train(base, inputs=inputs)
    var = train(f"{base},amax_history=ring", inputs=inputs)
    ring = var[1][AMAX_RING]["ring"]
    first_input = ring.names.index(("MLP", "Dense_0", "input_amax")) if ("MLP", "Dense_0", \
        "input_amax") in ring.names else ring.names.index(("Dense_0", "input_amax"))
    assert np.isinf(np.asarray(ring.history)[5 % 2, first_input])  # step 5's amax: inf
    assert_same_run(ref, var)


@pytest.mark.parametrize("base", ["fp8-current", "fp8-noscale",
                                  "fp8-delayed:fp8_layout=tn,amax_history_len=4"])
def test_mlp_step_stored_weights_train_bit_for_bit(base):
    sep = "," if ":" in base else ":"
    assert_same_run(train(base, steps=4), train(f"{base}{sep}fp8_weights=stored", steps=4))


# ------------------------------------------------------------------- program structure


def step_jaxpr(recipe) -> str:
    p = mlp_step.program(recipe, WIDTH, BATCH, DEPTH)
    return str(jax.make_jaxpr(p.fn)(*p.args))


def test_ring_is_one_dynamic_update_slice_of_every_layer_where_shift_has_one_per_tensor():
    H, n = 1024, 3 * DEPTH  # input, kernel and output-gradient of every layer
    shift = step_jaxpr("fp8-delayed")
    ring = step_jaxpr("fp8-delayed:amax_history=ring")
    per_tensor = re.findall(rf"f32\[{H}\] = concatenate", shift)
    assert len(per_tensor) == n  # the reference: one shifted history per tensor
    assert re.findall(rf"f32\[{H}\] = concatenate", ring) == []
    dus = re.findall(r":(\S+) = dynamic_update_slice", ring)
    assert dus == [f"f32[{H},{n}]"], dus
    assert "dynamic_update_slice" not in shift


def test_ring_state_lives_in_one_array_and_is_the_only_history():
    _, v, *_ = mlp_step._setup(resolve("fp8-delayed:amax_history=ring"), WIDTH, BATCH, DEPTH)
    ring = v[AMAX_RING]["ring"]
    assert ring.history.shape == (1024, 3 * DEPTH) and ring.history.dtype == jnp.float32
    assert len(ring.names) == 3 * DEPTH and len(set(ring.names)) == 3 * DEPTH
    assert ring.fmax.count(E5M2_MAX) == DEPTH  # output gradients: E5M2
    shapes = [a.shape for a in jax.tree.leaves(v[FP8_META])]
    assert shapes and all(s == () for s in shapes)  # per layer: scalars only
    _, ref, *_ = mlp_step._setup(resolve("fp8-delayed"), WIDTH, BATCH, DEPTH)
    assert AMAX_RING not in ref  # other recipes: the variables as they were
    assert layers.init_amax_ring(ref, resolve("fp8-delayed")) is ref


def test_stored_weights_are_float8_in_the_variables_and_the_forward_reads_no_master():
    recipe = "fp8-delayed:fp8_weights=stored"
    model = mlp_step.MLP(WIDTH, DEPTH, resolve(recipe))
    x = jax.random.normal(jax.random.key(0), (BATCH, WIDTH)).astype(jnp.bfloat16)
    v = model.init(jax.random.key(1), x)
    stored = [s for s in jax.tree.leaves(v[FP8_META], is_leaf=lambda a: isinstance(
        a, ops.StoredWeight)) if isinstance(s, ops.StoredWeight)]
    assert len(stored) == DEPTH
    assert all(s.q.dtype == jnp.float8_e4m3fn and s.q.shape == (WIDTH, WIDTH) for s in stored)
    # the same first forward pass as the per-call recipe ...
    ref_model = mlp_step.MLP(WIDTH, DEPTH, resolve("fp8-delayed"))
    ref_v = ref_model.init(jax.random.key(1), x)
    y = model.apply(v, x)
    assert same(y.astype(jnp.float32), ref_model.apply(ref_v, x).astype(jnp.float32))
    # ... with NaN master weights: the forward pass does not read them
    nan_params = jax.tree.map(lambda p: jnp.full_like(p, jnp.nan) if p.ndim == 2 else p,
                              v["params"])
    y_nan = model.apply({**v, "params": nan_params}, x)
    assert same(y_nan.astype(jnp.float32), y.astype(jnp.float32))
    # in the traced forward pass no f32 weight becomes FP8 (the per-call recipe: one per layer)
    def casts(m, vs):
        txt = str(jax.make_jaxpr(m.apply)(vs, x))
        return len(re.findall(rf"f8_e4m3fn\[{WIDTH},{WIDTH}\] = convert_element_type", txt))
    assert casts(ref_model, ref_v) == DEPTH
    assert casts(model, v) == 0


def test_stored_weight_matches_the_per_call_quantization_and_its_transpose():
    w = jax.random.normal(jax.random.key(2), (64, 48)) * 0.3
    for name, scale in (("fp8-current", None), ("fp8-delayed", jnp.float32(0.002))):
        r = resolve(name)
        sw = ops.stored_weight(w, r, scale, transpose=True)
        s = float(sw.scale)
        want = (float(np.max(np.abs(w))) / E4M3_MAX) if scale is None else float(scale)
        np.testing.assert_allclose(s, want, rtol=2e-7)
        ref = np.clip(np.asarray(w, np.float32) / np.float32(s), -E4M3_MAX, E4M3_MAX).astype(
            ml_dtypes.float8_e4m3fn)  # ml_dtypes: round to nearest even, saturated
        assert np.array_equal(np.asarray(sw.q).view(np.uint8), ref.view(np.uint8))
        assert np.array_equal(np.asarray(sw.q_t).view(np.uint8), ref.T.view(np.uint8))
        assert float(sw.amax) == float(np.max(np.abs(w)))


def test_stored_weights_refused_where_not_implemented():
    x = jnp.ones((2, 8, 8, 4))
    conv = layers.Conv(4, 3, recipe=resolve("fp8-delayed:fp8_weights=stored"))
    with pytest.raises(ValueError, match="Conv: recipe .* fp8_weights='stored'"):
        conv.init(jax.random.key(0), x)
    dg = layers.DenseGeneral(8, recipe=resolve("fp8-current:fp8_weights=stored"))
    with pytest.raises(ValueError, match="DenseGeneral: recipe .* fp8_weights='stored'"):
        dg.init(jax.random.key(0), jnp.ones((2, 8)))
    with pytest.raises(ValueError, match="fp8_dot: recipe .* stored FP8 weight"):
        ops.fp8_dot(jnp.ones((4, 8)), jnp.ones((8, 8)), resolve("fp8-current:fp8_weights=stored"))


def test_ring_of_other_variables_is_refused():
    _, v, *_ = mlp_step._setup(resolve("fp8-delayed:amax_history=ring"), WIDTH, BATCH, 2)
    _, v3, *_ = mlp_step._setup(resolve("fp8-delayed:amax_history=ring"), WIDTH, BATCH, 3)
    with pytest.raises(ValueError, match="amax ring has 6 tensors but the FP8 state has 9"):
        layers.update_amax_ring(v3[FP8_META], v[AMAX_RING])


# ------------------------------------------------------------ PPO and the LM, end to end


def test_ppo_update_with_both_variants_is_the_fp8_delayed_update():
    from repro.experiments.rl_throughput import measure as rl

    def updated(recipe):
        c = rl.throughput_config("mlp", 64, recipe, 8, _rl_params())
        update, args = rl.update_step(c)
        variables, _ = update(*args)
        return variables

    ref = updated("fp8-delayed:amax_history_len=2")
    var = updated("fp8-delayed:amax_history_len=2,amax_history=ring,fp8_weights=stored")
    pa, pb = jax.tree.leaves(ref["params"]), jax.tree.leaves(var["params"])
    assert len(pa) == len(pb) and all(same(a, b) for a, b in zip(pa, pb))
    sa, sb = scales_of(ref[FP8_META]), scales_of(var[FP8_META])
    assert sa and sa.keys() == sb.keys() and all(same(sa[k], sb[k]) for k in sa)
    assert any(float(s) != 1.0 for s in sa.values())  # the update moved the scales


def _rl_params():
    import types

    return types.SimpleNamespace(networks={"mlp": "CartPole-v1"}, depth=2, num_steps=8,
                                 updates=1, update_epochs=2, num_minibatches=2)


def test_lm_step_with_both_variants_is_the_fp8_delayed_step():
    from repro.models import lm as M
    from repro.models import lm_train as T

    cfg = M.get_config("tiny", n_layers=1)
    tc = T.TrainConfig(batch_size=2)
    tokens = jax.random.randint(jax.random.key(1), (2, cfg.seq_len), 0, 256)

    def run(recipe):
        init, step, _ = T._raw_functions(cfg, resolve(recipe), T._static_key(tc))
        v, o = jax.jit(init)(jnp.int32(0), tokens[:1])
        step = jax.jit(step)
        losses = []
        for i in range(2):
            v, o, loss = step(v, o, tokens, tokens, jnp.int32(0), jnp.int32(i))
            losses.append(np.asarray(loss))
        return losses, v

    ref = run("fp8-delayed")
    var = run("fp8-delayed:amax_history=ring,fp8_weights=stored")
    assert AMAX_RING in var[1] and AMAX_RING not in ref[1]
    assert_same_run(ref, var)


# ------------------------------------------------------------------ the studies' cells


def test_mlp_step_times_the_variants_in_cells_of_their_own(monkeypatch, tmp_path):
    from repro import results, studies
    from repro.studies import runner

    params = mlp_step.Params(profile="smoke", batch=8, depth=2, repeats=1, widths=(32, 16),
                             recipes=("bf16", "fp8-delayed"),
                             levers=("fp8-delayed:fp8_layout=natural",), lever_widths=(32,),
                             variants=("fp8-delayed:amax_history=ring",
                                       "fp8-current:fp8_weights=stored"),
                             variant_widths=(16,))
    calls = []

    def fake_cell(width, batch, depth, recipes, repeats, profile=None):
        calls.append((width, tuple(recipes)))
        return [results.make_record(mlp_step.EXPERIMENT, "step_time_ms", 1.0, "ms",
                                    recipe=r, sizes={"width": width}) for r in recipes]

    monkeypatch.setattr(mlp_step, "bench_cell", fake_cell)
    written = runner.run(mlp_step.STUDY, params, tmp_path, progress=False).written
    assert [p.name for p in written] == ["w32_b8_d2.json", "w16_b8_d2.json",
                                         "w32_b8_d2_levers.json", "w16_b8_d2_variants.json"]
    # each variant beside bf16 and the recipe it varies, in one process
    assert calls[-1] == (16, ("bf16", "fp8-delayed", "fp8-current",
                              "fp8-delayed:amax_history=ring", "fp8-current:fp8_weights=stored"))
    # the full profile: the variant cells come after the main and lever cells, which keep
    # their names and recipes
    full = studies.params("mlp_step", "full")
    names = [c.name for c in mlp_step.cells(full)]
    main = [f"w{w}_b65536_d3" for w in (4096, 2048, 1024, 512, 256)]
    assert names == main + ["w4096_b65536_d3_levers", "w1024_b65536_d3_levers"] + [
        f"{m}_variants" for m in main]
    for v in full.variants:
        r = resolve(v)
        assert r.amax_history == "ring" or r.fp8_weights == "stored", v


def test_rl_throughput_variant_cells_are_paired_cells_of_their_own():
    from repro import studies
    from repro.experiments.rl_throughput import measure as X

    full = studies.params("rl_throughput", "full")
    cells = {c.name: c for c in X.cells(full)}
    v = cells["mlp_w4096_e2048_variants"]
    assert v.recipes == full.variant_recipes and v.group == "mlp_w4096_e2048_variants"
    assert {"fp16", "fp8-delayed"} <= set(v.recipes)  # A2's baseline and the default
    assert [n for n in cells if n.endswith("_variants")] == ["mlp_w4096_e2048_variants"]
    assert cells["mlp_w4096_e2048_paired"].recipes == ("fp16", "bf16", "fp8-delayed",
                                                       "fp8-current")
    p = X.Params(profile="smoke", recipes=("fp16",), widths=(16,), num_envs=(4, 8),
                 networks={"mlp": "CartPole-v1"}, num_steps=8, updates=1, repeats=1,
                 variant_recipes=("fp16", "fp8-delayed:amax_history=ring"),
                 variant_widths=(16,))
    assert [c.name for c in X.cells(p) if "variants" in c.name] == [
        "mlp_w16_e4_variants", "mlp_w16_e8_variants"]  # every num_envs by default


def test_mlp_step_table_counts_the_defaults_of_a_variant_cell_once():
    import pandas as pd

    from repro.experiments.mlp_step import tables as T

    def rec(source, recipe, ms):
        return {"hardware": "h200", "metric": "step_time_ms", "recipe": recipe, "value": ms,
                "size_width": 4096, "size_batch": 65536, "source": source, "emulated": False,
                "spread": 0.0, "extra": {"fp8_lowering": "cublaslt-f8"}}

    ring = "fp8-delayed:amax_history=ring"
    rows = [rec("w4096_b65536_d3.json", "bf16", 26.0),
            rec("w4096_b65536_d3.json", "fp8-delayed", 15.0),
            rec("w4096_b65536_d3_variants.json", "bf16", 27.0),
            rec("w4096_b65536_d3_variants.json", "fp8-delayed", 15.5),
            rec("w4096_b65536_d3_variants.json", ring, 15.0)]
    steps = T.step_table(pd.DataFrame(rows))
    main = steps[steps.main]
    assert sorted(main.recipe) == sorted(["bf16", "fp8-delayed", ring])  # one row each
    v = steps.set_index("recipe").loc[ring]
    assert v.speedup == pytest.approx(27.0 / 15.0)  # over the BF16 of its own cell
    assert T.lever_delta(steps, "h200", ring, "fp8-delayed", 4096, 65536)[0] == \
        pytest.approx(-0.5)
