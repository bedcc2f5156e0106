"""GEMM benchmark: timing statistics, records, and numerics against float64."""

import json
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro.config import ConfigError
from repro.experiments.gemm import measure as bench
from repro.studies import lowering, timing


def test_time_fn_statistics_and_rotation():
    calls = []

    def f(x):
        calls.append(x)
        return jnp.asarray(x)

    t = timing.time_fn(f, repeats=5, warmup=2, input_sets=[(1,), (2,), (3,)])
    assert calls == [1, 2, 1, 2, 3, 1, 2]  # warm-up, then the timed calls, rotating
    assert len(t.samples) == 5 and all(s >= 0 for s in t.samples)
    q25, q50, q75 = np.percentile(t.samples, [25, 50, 75])
    assert t.median_s == pytest.approx(q50) and t.iqr_s == pytest.approx(q75 - q25)

    calls.clear()
    timing.time_fn(f, 7, repeats=3, warmup=0)
    assert calls == [7, 7, 7]
    with pytest.raises(ValueError):
        timing.time_fn(f, repeats=0)
    with pytest.raises(ValueError):
        timing.time_fn(f, 1, repeats=1, input_sets=[(1,)])


def test_time_fn_measures_blocking_work():
    t = timing.time_fn(lambda: time.sleep(0.01), repeats=3, warmup=0)
    assert 0.009 < t.median_s < 0.5


def test_gemm_sweep_cpu_records():
    m, k, n = 32, 64, 16
    recs = bench.gemm_sweep([(m, k, n)], repeats=2, warmup=1, profile="smoke")
    assert len(recs) == 2 * len(bench.GEMM_DTYPES)
    by = {(r["recipe"], r["metric"]): r for r in recs}
    for dtype in bench.GEMM_DTYPES:
        tf, ms = by[(dtype, "tflops")], by[(dtype, "time_ms")]
        assert tf["experiment"] == "gemm" and tf["claims"] == ["A2", "B2"]
        assert tf["unit"] == "TFLOP/s" and ms["unit"] == "ms" and tf["profile"] == "smoke"
        assert tf["sizes"] == {"M": m, "K": k, "N": n} and tf["repeats"] == 2
        assert tf["value"] > 0 and tf["spread"] >= 0 and ms["spread"] >= 0
        assert tf["value"] == pytest.approx(2 * m * k * n / (ms["value"] / 1e3) / 1e12)
        assert tf["extra"]["layout"] == "TN" and tf["extra"]["hlo_fp8_gemm"] is False
    # On a CPU the f8 operands are upcast before the dot: emulated, and said so.
    assert by[("fp8", "tflops")]["emulated"] is True
    assert by[("fp8", "tflops")]["extra"]["fp8_lowering"] == "upcast"
    assert not any(by[(d, "tflops")]["emulated"] for d in ("fp32", "tf32", "bf16", "fp16"))
    with pytest.raises(ConfigError, match="valid recipes: fp32, tf32, bf16, fp16, fp8"):
        bench.gemm_sweep([(8, 8, 8)], ["fp9"])


@pytest.mark.parametrize("dtype,rtol", [("fp32", 1e-6), ("bf16", 2e-2), ("fp16", 2e-3)])
def test_gemm_is_a_times_b_transposed(dtype, rtol):
    a, b = bench._random_inputs(jax.random.key(0), 16, 48, 8)
    c = jax.jit(bench.gemm_fn(dtype))(*bench.gemm_operands(dtype, a, b))
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
    assert c.shape == (16, 8)
    assert bench.relative_error(c, ref) < rtol


def test_fp8_gemm_against_float64_of_the_same_fp8_operands():
    rng = np.random.default_rng(0)
    a = (rng.normal(size=(64, 128)) * 30).astype(np.float32)
    b = (rng.normal(size=(32, 128)) * 0.01).astype(np.float32)
    a_q, b_q, sa, sb = bench.gemm_operands("fp8", jnp.asarray(a), jnp.asarray(b))
    assert a_q.dtype == jnp.float8_e4m3fn and b_q.dtype == jnp.float8_e4m3fn
    # Independent quantization reference: per-tensor amax/448 scale, RNE cast by ml_dtypes.
    assert float(sa) == pytest.approx(np.abs(a).max() / 448, rel=1e-6)
    ref_a_q = (a / np.float32(sa)).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(np.asarray(a_q).view(np.uint8), ref_a_q.view(np.uint8))

    c = jax.jit(bench.gemm_fn("fp8"))(a_q, b_q, sa, sb)
    assert c.dtype == jnp.bfloat16 and c.shape == (64, 32)
    da = np.asarray(a_q).astype(np.float64) * float(sa)
    db = np.asarray(b_q).astype(np.float64) * float(sb)
    ref = da @ db.T
    # Exact products accumulated in >= fp32, then two bf16 roundings (scale, output).
    np.testing.assert_allclose(np.asarray(c, np.float64), ref, rtol=2 ** -7,
                               atol=1e-3 * np.abs(ref).max())
    # Against the unquantized operands the error is FP8's, an order above bf16's.
    full = a.astype(np.float64) @ b.astype(np.float64).T
    assert 0.01 < bench.relative_error(c, full) < 0.1


def test_gemm_error_records():
    recs = bench.gemm_error(shape=(32, 64, 16))
    err = {r["recipe"]: r for r in recs}
    assert all(r["metric"] == "rel_error" for r in recs)
    assert err["fp32"]["value"] < 1e-5 < err["fp16"]["value"] < err["bf16"]["value"]
    assert err["bf16"]["value"] < err["fp8"]["value"] < 0.1
    for r in recs:
        assert r["extra"]["rel_error_same_operands"] <= r["value"] * 1.01 + 1e-7


def test_fp8_lowering_from_hlo():
    assert lowering.fp8_lowering("ROOT %x = bf16[4,4] dot(%a, %b)") == "no-f8"
    cublas = 'custom-call(%a, %b), custom_call_target="__cublas$lt$matmul$f8"'
    assert lowering.fp8_lowering("f8e4m3fn " + cublas) == "cublaslt-f8"
    fused = ("%gemm (p0: f8e4m3fn[4,4], p1: f8e4m3fn[4,4]) -> bf16[4,4] {\n"
             "  %p0 = f8e4m3fn[4,4]{1,0} parameter(0)\n  %p1 = f8e4m3fn[4,4]{1,0} parameter(1)\n"
             "  ROOT %d = bf16[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}\n}\n")
    assert lowering.fp8_lowering(fused) == "fused-f8-dot"
    upcast = ("%f (p0: f8e4m3fn[4,4]) -> f32[4,4] {\n  %p0 = f8e4m3fn[4,4]{1,0} parameter(0)\n"
              "  %c = f32[4,4]{1,0} convert(%p0)\n  %c2 = f32[4,4]{1,0} convert(%p0)\n"
              "  ROOT %d = f32[4,4]{1,0} dot(%c, %c2)\n}\n")
    assert lowering.fp8_lowering(upcast) == "upcast"


@pytest.fixture
def tiny_params(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text(
        "profile: smoke\n"
        "gemm:\n"
        "  common: {dtypes: [bf16, fp8]}\n"
        "  smoke: {repeats: 1, shapes: [[16, 16, 16]], error_shape: [16, 16, 16]}\n"
        "  full: {repeats: 1, shapes: [[16, 16, 16]]}\n")
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    return tmp_path


def test_record_gemm_is_resumable(tiny_params):
    from repro import studies

    root = tiny_params / "out"

    def record(**kw):
        return studies.record("gemm", "smoke", root, progress=False, **kw).written

    first = record()
    assert sorted(p.name for p in first) == ["16x16x16.json", "rel_error_16x16x16.json"]
    assert all(p.parent == root / "cpu" / "gemm" for p in first)
    assert record() == []  # finished cells are skipped
    assert len(record(force=True)) == 2
    subset = record(recipes=["bf16"])  # a subset of the dtypes gets cells of its own
    assert sorted(p.name for p in subset) == ["16x16x16_bf16.json", "rel_error_16x16x16_bf16.json"]
    recs = json.loads(subset[0].read_text())
    assert {r["recipe"] for r in recs} == {"bf16"}


def test_record_gemm_rejects_bad_params_before_writing(tiny_params):
    from repro import studies

    (tiny_params / "params.yaml").write_text(
        "gemm:\n  smoke: {dtypes: [bf16, int3], shapes: [[16, 16, 16]]}\n  full: {}\n")
    with pytest.raises(ConfigError, match="int3.*valid recipes"):
        studies.record("gemm", "smoke", tiny_params / "out")
    with pytest.raises(ConfigError, match="unknown GEMM recipe.*fp9"):
        studies.record("gemm", "smoke", tiny_params / "out", recipes=["fp9"])
    assert not (tiny_params / "out").exists()


def test_recipe_emulated_accepts_both_native_fp8_lowerings():
    """On an FP8-capable GPU an FP8 timing is native whether XLA called cuBLASLt's FP8 GEMM or
    its own Triton GEMM on f8 operands (small GEMMs); only an upcast program is emulation."""
    from repro.hardware import lookup
    from repro.studies.lowering import recipe_emulated

    h200 = lookup("h200")
    assert not recipe_emulated("fp8-delayed", "cublaslt-f8", h200)
    assert not recipe_emulated("fp8-delayed", "fused-f8-dot", h200)
    assert recipe_emulated("fp8-delayed", "upcast", h200)
    assert recipe_emulated("fp8-delayed", "cublaslt-f8", lookup("cpu"))
    assert recipe_emulated("nvfp4", "no-f8", h200)  # no FP4 tensor cores on Hopper
    assert not recipe_emulated("bf16", "no-f8", h200)


HLO_MODULE = """HloModule jit_step, entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}

%fused_computation (p: f32[8,4]) -> f32[8,4] {
  %p = f32[8,4]{1,0} parameter(0)
  ROOT %neg = f32[8,4]{1,0} negate(%p)
}

ENTRY %main.9 (Arg_0.1: f32[8,4]) -> (f32[8,4], f32[]) {
  %Arg_0.1 = f32[8,4]{1,0} parameter(0)
  %c = f32[] constant(1)
  %fusion = f32[8,4]{1,0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation
  %custom-call.2 = (bf16[8,4]{1,0}, s8[1024]{0}) custom-call(%fusion, %fusion), custom_call_target="__cublas$lt$matmul"
  %gte = bf16[8,4]{1,0} get-tuple-element(%custom-call.2), index=0
  %copy.1 = f32[8,4]{0,1} copy(%fusion)
  ROOT %tuple = (f32[8,4]{0,1}, f32[]) tuple(%copy.1, %c)
}
"""


def test_entry_ops_counts_launching_ops_of_entry_only():
    # hand-counted: one fusion, one cuBLAS call (tuple-shaped), one copy; the fused
    # computation's negate and the parameters, constant, get-tuple-element and tuple launch
    # nothing
    assert lowering.entry_ops(HLO_MODULE) == {"fusion": 1, "custom-call": 1, "copy": 1}
    assert lowering.entry_ops("no module here") == {}


def test_compiled_facts_report_xla_cost_of_a_matmul():
    m, k, n = 64, 32, 16
    a = jnp.ones((m, k), jnp.float32)
    b = jnp.ones((k, n), jnp.float32)
    facts = lowering.compiled_facts(jax.jit(jnp.dot).lower(a, b).compile())
    assert facts["hlo_flops"] == 2 * m * k * n  # one multiply-add per (i, j, l)
    assert facts["hlo_bytes_accessed"] >= 4 * (m * k + k * n + m * n)  # read both, write once
    assert facts["hlo_kernels"] >= 1


def test_int8_gemm_is_exact_integer_arithmetic_and_labelled():
    rng = np.random.default_rng(1)
    a = (rng.normal(size=(64, 128)) * 30).astype(np.float32)
    b = (rng.normal(size=(32, 128)) * 0.01).astype(np.float32)
    a_q, b_q, sa, sb = bench.gemm_operands("int8", jnp.asarray(a), jnp.asarray(b))
    assert a_q.dtype == b_q.dtype == jnp.int8
    # independent reference: amax / 127 scales, ties to even, no value beyond +-127
    assert float(sa) == np.float32(np.abs(a).max()) / np.float32(127)
    ref_a = np.clip(np.rint((a.astype(np.float64) * np.float64(np.float32(1) / np.float32(sa)))
                            .astype(np.float32)), -127, 127).astype(np.int8)
    assert np.array_equal(np.asarray(a_q), ref_a) and np.abs(ref_a).max() == 127
    c = jax.jit(bench.gemm_fn("int8"))(a_q, b_q, sa, sb)
    acc = (np.asarray(a_q, np.int64) @ np.asarray(b_q, np.int64).T).astype(np.float32)
    want = (acc * (np.float32(sa) * np.float32(sb))).astype(ml_dtypes.bfloat16)
    assert c.dtype == jnp.bfloat16 and np.array_equal(np.asarray(c).view(np.uint16),
                                                      want.view(np.uint16))
    full = a.astype(np.float64) @ b.astype(np.float64).T
    assert 0.001 < bench.relative_error(c, full) < 0.03  # INT8's error, between BF16's and FP8's
    recs = {(r["recipe"], r["metric"]): r for r in bench.gemm_sweep(
        [(16, 32, 8)], ["bf16", "int8"], repeats=2, warmup=1, profile="smoke")}
    rec = recs[("int8", "tflops")]
    assert rec["extra"]["int8_lowering"] == "s8-gemm"  # XLA keeps s8 x s8 -> s32
    assert rec["emulated"] is True  # ... but a CPU has no INT8 matrix units
    assert recs[("bf16", "tflops")]["emulated"] is False
    from repro.hardware import lookup

    v5e = lookup("tpu-v5e")
    assert bench._emulated("int8", {"int8_lowering": "s8-gemm"}, v5e) is False
    assert bench._emulated("int8", {"int8_lowering": "s8-other"}, v5e) is True
