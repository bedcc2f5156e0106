"""The FP8 speed levers (``Recipe.fp8_gemm_out``, ``Recipe.fp8_layout``, one weight
quantization per step) compute the same function as the plain ``fp8_dot``, and the recipe
variant syntax ``"base:field=value,..."`` that names the ablations (CPU).

"Plain" is the path before the levers: ``fp8_gemm_out="float32"`` (the GEMM writes FP32, then
scale and cast) and ``fp8_layout="natural"`` (XLA inserts the transposes).

Tolerances, stated:
- ``fp8_layout="tn"`` changes layouts only: bit-identical outputs, gradients and meta.
- ``fp8_gemm_out="compute"`` (BF16 GEMM output, the dequantize scale rounded to BF16 and
  multiplied in BF16): each element within ``1.01 * 2**-6`` relative of the plain one (three
  BF16 roundings of at most 2**-8 each against one), i.e. within 2 BF16 ulps; the weight gradient
  (FP32 output either way) is bit-identical. Both stay within the FP8 error of an independent
  float64 reference (``FP8_FWD_TOL``/``FP8_GRAD_TOL``, as in tests/test_ops.py).
"""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro.config import stage_params
from repro.experiments.mlp_step import measure as mlpbench
from repro.precision import fp8, ops
from repro.precision import scaling as scaling_lib
from repro.precision.layers import FP8_META
from repro.precision.recipes import REGISTRY, Recipe, resolve

E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
FP8_FWD_TOL = 0.08
FP8_GRAD_TOL = 0.1
COMPUTE_OUT_RTOL = 1.01 * 2.0 ** -6  # 4 BF16 unit roundoffs (2**-8 each)
M, K, N = 96, 64, 48  # all different, so shapes identify operands


def randn(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def plain(base):
    return resolve(f"{base}:fp8_gemm_out=float32,fp8_layout=natural")


def run(recipe, x, w, c, meta):
    """y, dx, dw and the meta "gradient" of sum(fp8_dot(x, w) * c), jitted."""
    recipe = resolve(recipe)

    def loss(x, w, meta):
        y = ops.fp8_dot(x, w, recipe, meta)
        return jnp.sum(y.astype(jnp.float32) * c), y

    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
        x, w, meta)
    return (y, *grads)


def inputs(scaling, seed=0):
    x = jnp.asarray(randn(seed, (M, K), 2.0), jnp.bfloat16)
    w = jnp.asarray(randn(seed + 1, (K, N), 0.1))
    c = jnp.asarray(randn(seed + 2, (M, N), 1e-3))
    meta = None
    if scaling == "delayed":  # a calibrated state: scales from a previous step's amaxes
        meta = ops.init_meta(4)
        meta = {k: scaling_lib.delayed_update(m, a, 448.0 if k != "output_grad" else 57344.0)
                for (k, m), a in zip(meta.items(), (10.0, 0.4, 5e-3))}
    return x, w, c, meta


def np_fp8(a, dtype, scale):
    fmax = float(ml_dtypes.finfo(dtype).max)
    y = np.clip(np.asarray(a, np.float32) / np.float32(scale), -fmax, fmax)
    return y.astype(dtype).astype(np.float64) * np.float64(scale)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def assert_same(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(u, np.float32), np.asarray(v, np.float32))


def assert_within_compute_rounding(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.abs(a - b) <= COMPUTE_OUT_RTOL * np.abs(b) + 1e-30), \
        np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30))


# ------------------------------------------------------------------ recipe variant syntax


def test_variant_syntax_coerces_fields_and_names_the_variant():
    r = resolve("fp8-delayed:fp8_gemm_out=float32, amax_history_len=16,margin=1")
    assert r.name == "fp8-delayed:fp8_gemm_out=float32, amax_history_len=16,margin=1"
    assert (r.fp8_gemm_out, r.amax_history_len, r.margin) == ("float32", 16, 1)
    assert isinstance(r.amax_history_len, int)
    assert r.replace(name="fp8-delayed", fp8_gemm_out="compute", amax_history_len=1024,
                     margin=0) == REGISTRY["fp8-delayed"]
    assert resolve("nvfp4:rht=false,stochastic_rounding=0").rht is False
    assert resolve("nvfp4:rht=True").rht is True
    assert resolve("fp8-current:compute_dtype=float32").dtype == jnp.float32
    assert resolve(r.name) == r  # the name round-trips
    assert resolve("fp8-current:fp8_layout=tn", margin=2).margin == 2  # overrides still work


@pytest.mark.parametrize("spec, words", [
    ("fp8-delayed:fp8_gemm_outt=float32", "unknown field 'fp8_gemm_outt'"),
    ("fp8-delayed:fp8_gemm_out=float16", "is not one of ['float32', 'compute']"),
    ("fp8-delayed:fp8_layout=nt", "is not one of ['auto', 'natural', 'tn']"),
    ("fp8-delayed:amax_history_len=1k", "is not an int"),
    ("nvfp4:rht=maybe", "is not a bool"),
    ("fp8-delayed:scaling=sometimes", "is not one of"),
    ("fp9:margin=1", "unknown recipe 'fp9'"),
    ("fp8-delayed:", "nothing after ':'"),
    ("fp8-delayed:margin", "is not 'field=value'"),
    ("fp8-delayed:margin=1,margin=2", "given twice"),
    ("fp8-delayed:name=other", "unknown field 'name'"),
])
def test_variant_syntax_errors_are_one_line(spec, words):
    with pytest.raises(ValueError) as e:
        resolve(spec)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_recipe_rejects_bad_lever_values():
    with pytest.raises(ValueError, match="fp8_layout must be one of"):
        Recipe("x", gemm="fp8", fp8_layout="nt")
    with pytest.raises(ValueError, match="fp8_gemm_out must be one of"):
        resolve("fp8-current").replace(fp8_gemm_out="bf16")


def test_full_mlp_step_lists_every_lever_ablation():
    p = stage_params("mlp_step", "full")
    recipes = p["recipes"] + p["levers"]
    assert recipes[0] == "bf16" and "flax-fp8" in recipes and "fp8-auto" in recipes
    parsed = [resolve(r) for r in recipes  # all valid names; peers are not our recipes
              if resolve(r).backend == "repro"]
    assert {"fp8-current", "fp8-delayed"} <= {r.name for r in parsed}
    delayed = [r for r in parsed if r.gemm == "fp8" and r.scaling == "delayed"]
    # each lever switched back alone, the others at their defaults
    default = resolve("fp8-delayed")
    for field, ablated in (("fp8_layout", "natural"), ("fp8_epilogue", "separate"),
                           ("fp8_cast", "rounding")):
        assert any(getattr(r, field) == ablated and r.replace(**{field: getattr(default, field),
                                                                 "name": default.name}) == default
                   for r in delayed), field
    # the scaling lever: current scaling with the other levers at their defaults
    assert any(r.scaling == "current" and r.fp8_gemm_out == "compute"
               and r.fp8_layout == "auto" for r in parsed)
    assert p["repeats"] <= 10  # the whole run fits a few minutes on an H200


# ---------------------------------------------------------- same function as plain fp8_dot


@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_tn_layout_is_bit_identical_to_natural(scaling):
    x, w, c, meta = inputs(scaling)
    base = f"fp8-{scaling}"
    for out in ("float32", "compute"):
        ref = run(f"{base}:fp8_gemm_out={out},fp8_layout=natural", x, w, c, meta)
        got = run(f"{base}:fp8_gemm_out={out},fp8_layout=tn", x, w, c, meta)
        assert_same(got, ref)


@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_compute_dtype_gemm_output_within_bf16_rounding_of_plain(scaling):
    x, w, c, meta = inputs(scaling, seed=3)
    y0, dx0, dw0, m0 = run(plain(f"fp8-{scaling}"), x, w, c, meta)
    y1, dx1, dw1, m1 = run(f"fp8-{scaling}", x, w, c, meta)  # the default: compute output
    assert y1.dtype == y0.dtype == jnp.bfloat16 and dx1.dtype == jnp.bfloat16
    assert_within_compute_rounding(y1, y0)
    assert_within_compute_rounding(dx1, dx0)
    assert_same(dw1, dw0)  # the weight gradient stays FP32 out: identical
    assert_same(m1, m0)  # same amaxes, same updated delayed-scaling state
    # and it is not the same array: the lever does change the rounding
    assert not np.array_equal(np.asarray(y1, np.float32), np.asarray(y0, np.float32))


@pytest.mark.parametrize("recipe", ["fp8-current", "fp8-delayed:fp8_layout=tn"])
def test_optimized_path_matches_float64_reference_within_fp8_error(recipe):
    r = resolve(recipe)
    x, w, c, meta = inputs(r.scaling, seed=5)
    y, dx, dw, _ = run(r, x, w, c, meta)
    x64, w64, c64 = (np.asarray(a, np.float64) for a in (x, w, c))
    assert rel(y, x64 @ w64) < FP8_FWD_TOL
    assert rel(dx, c64 @ w64.T) < FP8_GRAD_TOL
    assert rel(dw, x64.T @ c64) < FP8_GRAD_TOL
    if r.scaling == "current":  # the exact quantized product, rounded to BF16 (3 roundings)
        sx = np.float32(np.abs(x64).max()) / np.float32(448.0)
        sw = np.float32(np.abs(w64).max()) / np.float32(448.0)
        ref = np_fp8(x, E4M3, sx) @ np_fp8(w, E4M3, sw)
        assert_within_compute_rounding(y, ref)


def test_fp32_compute_dtype_is_unchanged_by_the_output_lever():
    x, w, c, _ = inputs("current", seed=7)
    x = x.astype(jnp.float32)
    ref = run("fp8-current:compute_dtype=float32,fp8_gemm_out=float32", x, w, c, None)
    got = run("fp8-current:compute_dtype=float32", x, w, c, None)
    assert_same(got, ref)


def test_fp16_keeps_fp32_gemm_output_so_unscaled_products_cannot_overflow():
    # The unscaled FP8 product reaches K * 448 * 448 here, beyond FP16's 65504.
    r = resolve("fp8-current:compute_dtype=float16")
    x = jnp.full((16, 512), 3.0, jnp.float16)
    w = jnp.full((512, 16), 0.5, jnp.float32)
    text = jax.jit(lambda x, w: ops.fp8_dot(x, w, r)).lower(x, w).as_text()
    assert re.search(r"stablehlo\.dot_general.*-> tensor<16x16xf32>", text)
    y = np.asarray(ops.fp8_dot(x, w, r), np.float32)
    np.testing.assert_allclose(y, 512 * 1.5, rtol=1e-3)


# ------------------------------------------------------------------------------ HLO checks

_DOT = re.compile(r"stablehlo\.dot_general .*contracting_dims = \[(\d)\] x \[(\d)\].*"
                  r": \(tensor<([^>]*)>, tensor<([^>]*)>\) -> tensor<([^>]*)>")


def _dots(recipe, scaling):
    x, w, c, meta = inputs(scaling)
    r = resolve(recipe)

    def loss(x, w, meta):
        return jnp.sum(ops.fp8_dot(x, w, r, meta).astype(jnp.float32) * c)

    text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(x, w, meta).as_text()
    return [m.groups() for m in _DOT.finditer(text)]


@pytest.mark.parametrize("recipe", ["fp8-current", "fp8-delayed", "fp8-delayed:fp8_layout=tn",
                                    "fp8-current:fp8_gemm_out=float32"])
def test_hlo_keeps_fp8_operands_in_all_three_gemms(recipe):
    r = resolve(recipe)
    dots = _dots(r, r.scaling)
    assert len(dots) == 3, dots
    for *_, a, b, _out in dots:
        assert "xf8E" in a and "xf8E" in b, (a, b)
    outs = sorted(d[4].rsplit("x", 1)[1] for d in dots)
    wgrad_out = [d[4] for d in dots if d[4].startswith(f"{K}x{N}x")]
    assert wgrad_out == [f"{K}x{N}xf32"]  # the weight gradient is FP32 out, always
    if r.fp8_gemm_out == "compute":
        assert outs == ["bf16", "bf16", "f32"]
    else:
        assert outs == ["f32", "f32", "f32"]
    if r.fp8_layout == "tn":  # cuBLASLt's TN form written out: contract dim 1 of both
        assert all((ca, cb) == ("1", "1") for ca, cb, *_ in dots), dots


def test_mlp_train_step_hlo_has_fp8_operands_in_every_gemm():
    step, variables, opt_state, x, y = mlpbench._setup(resolve("fp8-delayed"), 32, 64, 3)
    text = step.lower(variables, opt_state, x, y).as_text()
    dots = [m.groups() for m in _DOT.finditer(text)]
    assert len(dots) == 8  # 3 layers x 3 GEMMs, minus the input's unused data gradient
    assert all("xf8E" in a and "xf8E" in b for *_, a, b, _ in dots)


# --------------------------------------------------------- one weight quantization per step


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        for p in e.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else [p]):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from _eqns(getattr(inner, "jaxpr", inner))


@pytest.mark.parametrize("recipe, copies", [("fp8-delayed", 1), ("fp8-current", 1),
                                            ("fp8-delayed:fp8_layout=tn", 2)])
def test_weight_is_quantized_once_and_reused_by_the_data_gradient(recipe, copies):
    r = resolve(recipe)
    x, w, c, meta = inputs(r.scaling)

    def loss(x, w, meta):
        return jnp.sum(ops.fp8_dot(x, w, r, meta).astype(jnp.float32) * c)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, w, meta).jaxpr
    eqns = list(_eqns(jaxpr))
    f8 = (jnp.float8_e4m3fn, jnp.float8_e5m2)
    w_casts = [e for e in eqns if e.primitive.name == "convert_element_type"
               and e.params["new_dtype"] in f8 and e.invars[0].aval.shape in ((K, N), (N, K))]
    # natural: one FP8 copy of the weight; tn: the same values in both layouts. Nothing in
    # the backward pass quantizes the weight again (the dgrad uses the saved copy).
    assert len(w_casts) == copies
    assert {e.invars[0].aval.shape for e in w_casts} == ({(K, N)} if copies == 1
                                                           else {(K, N), (N, K)})
    if r.scaling in ("current", "delayed"):  # the weight's amax comes from the FP32 master
        w_amax = [e for e in eqns if e.primitive.name == "reduce_max"
                  and e.invars[0].aval.shape == (K, N)]
        assert len(w_amax) == 1 and w_amax[0].invars[0].aval.dtype == jnp.float32


@pytest.mark.parametrize("layout", ["natural", "tn"])
def test_backward_residuals_are_fp8_not_bf16(layout):
    r = resolve(f"fp8-delayed:fp8_layout={layout}")
    x, w, _, meta = inputs("delayed")
    op = ("dot_tn",) if layout == "tn" else ("dot",)
    _, res = fp8._fp8_fwd(x, w, None, meta, r, op, None)
    x_res, wq = res[0], res[1]
    assert x_res.dtype == jnp.float8_e4m3fn and wq.dtype == jnp.float8_e4m3fn
    assert x_res.shape == ((K, M) if layout == "tn" else (M, K))  # x^T saved for "tn"
    big = [a for a in jax.tree.leaves(res) if a.size >= M * N // 2]
    assert all(a.dtype.itemsize == 1 for a in big)  # no activation-sized BF16 residual


# ------------------------------------------------------------------- whole MLP train step


def _grads(recipe, width=32, batch=64, depth=3):
    """Loss and gradients of the benchmark MLP; delayed scaling with calibrated state (the
    FP8_META "gradient" of a first call), so its scales are not the initial 1.0."""
    model = mlpbench.MLP(width, depth, recipe)
    kx, ky, kp = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (batch, width)).astype(jnp.bfloat16)
    y = jax.random.normal(ky, (batch, width))
    variables = model.init(kp, x)

    def loss(v):
        return jnp.mean(jnp.square(model.apply(v, x).astype(jnp.float32) - y))

    f = jax.jit(jax.value_and_grad(loss))
    if FP8_META in variables:
        variables = {**variables, FP8_META: f(variables)[1][FP8_META]}
    return f(variables)


@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_mlp_step_variants_compute_the_same_function(scaling):
    base = f"fp8-{scaling}"
    loss0, g0 = _grads(plain(base).name)
    loss_tn, g_tn = _grads(f"{base}:fp8_gemm_out=float32,fp8_layout=tn")
    assert_same((loss_tn, g_tn), (loss0, g0))  # layout: bit-identical end to end
    loss1, g1 = _grads(base)  # the default, all levers on
    lossb, gb = _grads("bf16")
    assert abs(float(loss1) - float(loss0)) < 1e-2 * float(loss0)
    # Through three layers a BF16 rounding difference can flip FP8 roundings downstream, so
    # end to end the lever is held to the FP8 tolerance: it is no further from the BF16
    # gradients than the plain FP8 path is (15% + 0.01 slack), and within 0.15 of plain.
    for a, b, ref in zip(*(jax.tree.leaves(g["params"]) for g in (g1, g0, gb))):
        assert rel(a, ref) <= 1.15 * rel(b, ref) + 0.01
        assert rel(a, b) < 0.15


def test_regression_task_with_cast_transpose_layout_trains_like_bf16():
    """As tests/test_mlp_step.py: the same loss as BF16 within 5% after 60 steps."""

    def train(r):
        step, variables, opt_state, x, y = mlpbench._setup(resolve(r), 32, 128, 2, lr=3e-3)
        for _ in range(60):
            variables, opt_state, loss = step(variables, opt_state, x, y)
        return float(loss)

    ref, got = train("bf16"), train("fp8-delayed:fp8_layout=tn")
    assert abs(got - ref) < 0.05 * ref


def test_no_fp8_and_emulated_rows_keep_their_record_and_say_so():
    """A policy that kept every GEMM in BF16 keeps its record's emulated flag (it is no FP8
    result) and is labelled as BF16; it does not make its hardware look emulated. An FP8 row
    the hardware emulated is labelled so in every table."""
    import pandas as pd

    from repro.experiments.mlp_step import tables as T

    def rec(recipe, ms, lowering, emulated, hw="h200"):
        return {"hardware": hw, "metric": "step_time_ms", "recipe": recipe, "value": ms,
                "size_width": 256, "size_batch": 65536, "source": f"{hw}.json",
                "emulated": emulated, "extra": {"fp8_lowering": lowering}}

    df = pd.DataFrame([rec("bf16", 1.0, "no-f8", False), rec("fp8-auto", 0.99, "no-f8", True),
                       rec("fp8-delayed", 0.8, "f8-dot", False),
                       rec("bf16", 1.0, "no-f8", False, "tpu-v5e"),
                       rec("fp8-delayed", 1.2, "f8-dot", True, "tpu-v5e"),
                       rec("flax-fp8", 0.95, "f8-dot", True, "tpu-v5e")])
    steps = T.step_table(df).set_index(["hardware", "recipe"])
    auto = steps.loc[("h200", "fp8-auto")]
    assert auto.emulated and auto.no_fp8 and auto.label == f"fp8-auto ({T.NO_FP8})"
    assert auto.speedup == 1.0 / 0.99
    assert steps.loc[("tpu-v5e", "fp8-delayed"), "label"] == f"fp8-delayed ({T.EMULATED})"
    assert steps.loc[("tpu-v5e", "flax-fp8"), "label"] == f"flax-fp8 ({T.EMULATED})"
    assert steps.loc[("h200", "fp8-delayed"), "label"] == "fp8-delayed"
    assert steps.loc[("tpu-v5e", "bf16"), "label"] == "bf16"
    assert set(T.native(T.step_table(df)).hardware) == {"h200"}


def test_a_row_that_ran_no_fp8_gemm_is_labelled_and_meets_no_fp8_target():
    """fp8-auto below its fp8_min_dim keeps every GEMM in BF16 (``no-f8``): its "speedup" is
    BF16 against BF16. The tables label it, the targets and the crossover come from the
    defaults, and the policy shows beside them without meeting a target or making FP8 pay."""
    import pandas as pd

    from repro.experiments.mlp_step import tables as T

    def rec(width, recipe, ms, lowering, emulated=False, calls=8):
        return {"hardware": "h200", "metric": "step_time_ms", "recipe": recipe, "value": ms,
                "size_width": width, "size_batch": 65536, "source": f"w{width}.json",
                "emulated": emulated, "spread": 0.0,
                "extra": {"fp8_lowering": lowering, "fp8_gemm_calls": calls}}

    rows = []
    for w, auto, delayed, current in ((256, 0.99, 1.2, 1.25), (1024, 0.8, 0.82, 0.9)):
        rows += [rec(w, "bf16", 1.0, "no-f8", calls=0),
                 rec(w, "fp8-delayed", delayed, "cublaslt-f8"),
                 rec(w, "fp8-current", current, "cublaslt-f8")]
        rows.append(rec(w, "fp8-auto", auto, *(("no-f8", True, 0) if w < 1024
                                               else ("cublaslt-f8",))))
    steps = T.step_table(pd.DataFrame(rows))
    auto = steps[steps.recipe == "fp8-auto"].set_index("width")
    assert auto.no_fp8.tolist() == [True, False]
    assert auto.label[256] == f"fp8-auto ({T.NO_FP8})" and auto.label[1024] == "fp8-auto"
    assert auto.kind.unique().tolist() == ["policy"]
    assert not steps[steps.recipe != "fp8-auto"].no_fp8.any()  # bf16 is no FP8 recipe

    t = T.targets_table(steps, pd.DataFrame(), {256: 1.0, 1024: 1.2}, 65536).set_index("width")
    # at 256 only the policy's BF16 step beats the target: the defaults miss it
    assert t.loc[256, "met by"] == "neither" and not t.loc[256, "met"]
    assert t.loc[256, "fp8-auto ran"] == T.NO_FP8
    assert pd.isna(t.loc[256, "fp8-auto (policy)"])  # BF16 against BF16: no FP8 number
    assert t.loc[1024, "met by"] == "fp8-delayed" and t.loc[1024, "fp8-auto ran"] == "FP8"

    c = T.crossover(steps, 65536).set_index("recipe")
    assert c.loc["fp8-delayed", "FP8 pays from width"] == 1024
    assert c.loc["fp8-auto", "FP8 pays from width"] == 1024  # not 256: BF16 there
    assert c.loc["fp8-auto", "no FP8 GEMM at widths"] == "256"
    assert c.loc["fp8-auto", "kind"] == "policy"


def test_ran_no_fp8_reads_the_lowering_before_the_cublas_count():
    from repro.experiments.mlp_step.tables import ran_no_fp8

    assert ran_no_fp8("fp8-auto", {"fp8_lowering": "no-f8", "fp8_gemm_calls": 0})
    # XLA's Triton GEMM with f8 operands is an FP8 GEMM that the cuBLASLt count misses
    assert not ran_no_fp8("fp8-delayed", {"fp8_lowering": "fused-f8-dot", "fp8_gemm_calls": 0})
    assert ran_no_fp8("fp8-delayed", {"fp8_gemm_calls": 0})  # an older record: the count only
    assert not ran_no_fp8("bf16", {"fp8_lowering": "no-f8"})
    assert not ran_no_fp8("fp8-delayed", None)


# ------------------------------------------------------------ where a step's memory goes

_ASSIGNMENT = """\
allocation 0: size 16, page 0, parameter 0, shape |f32[4]| at ShapeIndex {}:
 value: <1 p @0> (size=16,offset=0): f32[4]{0}
allocation 3: size 300, page 0, preallocated-temp:
 value: <5 a @0> (size=100,offset=0): f32[25]{0}
 value: <6 b{0} @0> (size=100,offset=100): f32[25]{0}
 value: <7 c @0> (size=100,offset=200): f32[25]{0}
 value: <8 d @0> (size=100,offset=0): f32[25]{0}
allocation 4: size 4, page 0, constant:
 value: <9 k @0> (size=4,offset=0): f32[]
"""
_LIVE_RANGE = """\
HloLiveRange (max 4):
  InstructionSequence:
    0:p
    1:a
    2:b
    3:c
    4:d
  BufferLiveRange:
    p{}:0-4
    a{}:1-2
    b{0}:2-3
    c{}:3-4
    d{}:4-4
    k{}:0-4
"""


def test_temp_timeline_sums_only_the_temporary_values_live_at_each_instruction():
    """By hand: live temporaries 100, 200 (a, b), 200 (b, c), 200 (c, d); the first peak is
    at instruction 2; c ends at offset 300 although no more than 200 bytes are ever live (the
    parameter p and the constant k are not temporaries)."""
    from repro.experiments.mlp_step import tables as T

    extent, peak, at, name, live = T.temp_timeline(_ASSIGNMENT, _LIVE_RANGE)
    assert (extent, peak, at, name) == (300, 200, 2, "b")
    assert live == [("a{}", 0, 100, "f32[25]{0}"), ("b{0}", 100, 100, "f32[25]{0}")]
