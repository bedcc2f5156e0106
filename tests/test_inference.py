"""Inference of the decoder LM (claim B6): the KV-cache decoder against the uncached forward
pass, post-training quantization with qwix against hand-computed references, the exact bytes,
the lowering checks on hand-written HLO, the study's plan and the tables the B6 rule reads
(the rule itself: tests/test_verdicts.py)."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pandas as pd
import pytest

from repro.config import ConfigError
from repro.experiments.inference import measure as I
from repro.experiments.inference import speed as S
from repro.experiments.inference import tables as A
from repro.models import lm as M
from repro.models import lm_decode as G
from repro.models import lm_quantize as Q
from repro.precision import export as X
from repro.precision import ops
from repro.precision.recipes import resolve
from repro.studies import lowering as L

qwix = pytest.importorskip("qwix")

TINY = M.get_config("tiny")


@pytest.fixture(scope="module")
def tiny():
    model = M.Decoder(TINY, "bf16")
    tokens = jax.random.randint(jax.random.key(1), (2, 40), 0, 256)
    return model, jax.jit(model.init)(jax.random.key(0), tokens)["params"], tokens


# --------------------------------------------------------------------- dense_dot and qwix


def test_dense_dot_casts_only_when_needed():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 8)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).normal(size=(8, 5)), jnp.float32)
    y = ops.dense_dot(x, w, resolve("bf16"))  # FP32 operands are still cast to BF16
    ref = np.asarray(x.astype(jnp.bfloat16), np.float64) @ np.asarray(w.astype(jnp.bfloat16),
                                                                      np.float64)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=1e-2, atol=1e-2)


def test_qwix_weight_only_int8_through_dense_dot():
    """qwix hands dense_dot its quantized weight (a QArray whose dtype is already BF16); a cast
    of it raised "Unsupported type: QArray" before dense_dot learnt to skip it."""
    from repro.precision.layers import Dense

    layer = Dense(6, recipe=resolve("bf16"), use_bias=False)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(4, 32)), jnp.bfloat16)
    w = np.random.default_rng(3).normal(size=(32, 6)).astype(np.float32)
    qm = qwix.quantize_model(layer, qwix.PtqProvider([qwix.QuantizationRule(
        module_path=".*", weight_qtype=jnp.int8)]))
    abstract = jax.eval_shape(qm.init, jax.random.key(0), x)["params"]
    qp = qwix.quantize_params({"kernel": jnp.asarray(w, jnp.bfloat16)}, abstract)
    y = qm.apply({"params": qp}, x)
    wb = np.asarray(jnp.asarray(w, jnp.bfloat16), np.float64)
    # qwix's symmetric INT8 bound 127.5, one BF16 scale per output column
    scale = np.abs(wb).max(axis=0).astype(ml_dtypes.bfloat16).astype(np.float64) / 127.5
    scale = scale.astype(ml_dtypes.bfloat16).astype(np.float64)
    wq = np.clip(np.round(wb / scale), -128, 127) * scale
    ref = np.asarray(x, np.float64) @ wq
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=1e-2,
                               atol=1e-2 * np.abs(ref).max())


# ----------------------------------------------------------------------------- decoding


def test_prefill_equals_uncached_forward_and_steps_match(tiny):
    model, params, tokens = tiny
    v = {"params": params}
    full = jax.jit(model.apply)(v, tokens)
    cache = G.init_cache(model, 2, 48)
    logits, cache = G.prefill_fn(model)(v, tokens[:, :24], cache)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(jax.jit(model.apply)(
        v, tokens[:, :24])))
    step = jax.jit(lambda v, c, t, s: G.decode_step(model, v, c, t, s))
    for i in range(24, 40):
        out, cache = step(v, cache, tokens[:, i:i + 1], jnp.int32(i))
        np.testing.assert_allclose(np.asarray(out[:, 0]), np.asarray(full[:, i]), atol=2e-2)
    with pytest.raises(ValueError, match="KV cache"):
        model.apply(v, tokens, decode="step", start=0, mutable=["cache"])


def test_fp8_kv_cache_holds_the_e4m3_keys_at_the_prompt_scale_and_saturates(tiny):
    """Block 0's cache after the prefill against ml_dtypes' E4M3 rounding of the exact keys
    (a BF16 cache's) at amax / 448; a decode step past the scale saturates at +-448; the
    logits stay near the BF16 cache's."""
    model, params, tokens = tiny
    v = {"params": params}
    pre = G.prefill_fn(model)
    _, exact = pre(v, tokens[:, :24], G.init_cache(model, 2, 48))
    logits8, c8 = pre(v, tokens[:, :24], G.init_cache(model, 2, 48, fp8=True))
    for name in ("k", "v"):
        x = np.asarray(exact["block0"]["attn"][name][:, :24], np.float32)
        scale = np.float32(np.abs(x).max()) / np.float32(448)
        want = (x * (np.float32(1) / scale)).astype(ml_dtypes.float8_e4m3fn)
        got = np.asarray(c8["block0"]["attn"][name])
        assert got.dtype == ml_dtypes.float8_e4m3fn
        np.testing.assert_array_equal(got[:, :24].view(np.uint8), want.view(np.uint8))
        assert not got[:, 24:].astype(np.float32).any()
        # amax / 448 up to XLA's division by a constant (a multiplication: one ulp)
        assert float(c8["block0"]["attn"][f"{name}_scale"]) == pytest.approx(scale, rel=2e-7)
    step = jax.jit(lambda v, c, t, s: G.decode_step(model, v, c, t, s))
    ref, _ = step(v, exact, tokens[:, 24:25], jnp.int32(24))
    out, _ = step(v, c8, tokens[:, 24:25], jnp.int32(24))
    ref, out = np.asarray(ref, np.float32), np.asarray(out, np.float32)
    assert np.abs(out - ref).max() < 0.1 * np.abs(ref).max()
    tiny_scale = jax.tree.map(lambda x: x, c8)
    tiny_scale["block0"]["attn"]["k_scale"] = jnp.float32(1e-6)
    _, sat = step(v, tiny_scale, tokens[:, 24:25], jnp.int32(24))
    k24 = np.abs(np.asarray(sat["block0"]["attn"]["k"][:, 24], np.float32))
    assert set(np.unique(k24)) <= {0.0, 448.0} and (k24 == 448).any()


def test_generate_greedy_is_the_argmax_of_the_uncached_model(tiny):
    model, params, tokens = tiny
    v = {"params": params}
    out = G.generate(model, v, tokens[:, :16], 6)
    seq = jnp.concatenate([tokens[:, :16], out], axis=1)
    ref = jnp.argmax(jax.jit(model.apply)(v, seq)[:, 15:21], axis=-1)
    assert out.shape == (2, 6)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_temperature_sampling_follows_softmax():
    logits = jnp.log(jnp.asarray([[0.7, 0.2, 0.1]]))
    keys = jax.random.split(jax.random.key(0), 4000)
    draws = jax.vmap(lambda k: G.sample(logits, k, 1.0)[0])(keys)
    freq = np.bincount(np.asarray(draws), minlength=3) / 4000
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.03)  # ~4 standard errors
    cold = jax.vmap(lambda k: G.sample(logits * 50.0, k, 0.5)[0])(keys[:50])
    assert set(np.asarray(cold).tolist()) == {0}
    assert int(G.sample(logits, None, 0.0)[0]) == 0
    with pytest.raises(ValueError, match="temperature"):
        G.sample(logits, keys[0], -1.0)


def test_sampled_generation_is_reproducible_and_differs_from_greedy(tiny):
    model, params, tokens = tiny
    v = {"params": params}
    a = G.generate(model, v, tokens[:, :8], 12, temperature=1.0, key=jax.random.key(7))
    b = G.generate(model, v, tokens[:, :8], 12, temperature=1.0, key=jax.random.key(7))
    g = G.generate(model, v, tokens[:, :8], 12)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(g))  # untrained: near-uniform


# ------------------------------------------------------------------------------- export


def _stablehlo_dots(ex, tokens):
    import re

    txt = jax.jit(ex.model.apply).lower(ex.variables, tokens).as_text()
    return re.findall(r"stablehlo.dot_general[^\n]*\((tensor<[^)]*)\) -> (tensor<[^>]*>)", txt)


@pytest.mark.parametrize("fmt,operand,out", [("fp8", "f8E4M3FN", "bf16"),
                                             ("fp8-tensor", "f8E4M3FN", "bf16"),
                                             ("int8", "i8", "i32")])
def test_fp8_int8_products_on_the_block_linear_layers_only(tiny, fmt, operand, out):
    model, params, tokens = tiny
    dots = _stablehlo_dots(Q.export_lm(TINY, params, fmt), tokens)
    quant = [d for d in dots if d[0].count(operand) == 2]
    assert len(quant) == 4 * TINY.n_layers  # qkv, out, wi, wo per block; not QK^T, AV, head
    assert all(d[1].endswith(f"x{out}>") for d in quant)


def test_int8_weights_match_a_per_channel_reference(tiny):
    _, params, _ = tiny
    ex = Q.export_lm(TINY, params, "int8-w")
    qa = ex.variables["params"]["block0"]["mlp"]["wi"]["kernel"].array
    w = np.asarray(jnp.asarray(params["block0"]["mlp"]["wi"]["kernel"], jnp.bfloat16),
                   np.float64)
    bf16 = ml_dtypes.bfloat16
    # absmax / 127.5 per output column, the scale and the quotient in BF16, round to nearest
    scale = (np.abs(w).max(axis=0, keepdims=True) / 127.5).astype(bf16).astype(np.float64)
    q = np.clip(np.round((w / scale).astype(bf16).astype(np.float64)), -128, 127)
    assert X.transposed(qa)  # stored [N, K]
    got = np.asarray(qa.qvalue, np.float64).T
    assert qa.qvalue.dtype == jnp.int8 and qa.scale.shape == (1, w.shape[1])
    np.testing.assert_array_equal(np.asarray(qa.scale, np.float64), scale)
    np.testing.assert_array_equal(got, q)


def test_nvfp4_scales_are_e4m3_times_a_power_of_two(tiny):
    _, params, _ = tiny
    ex = Q.export_lm(TINY, params, "nvfp4-w")
    w = np.asarray(jnp.asarray(params["block1"]["attn"]["qkv"]["kernel"], jnp.bfloat16),
                   np.float64)
    qa = ex.variables["params"]["block1"]["attn"]["qkv"]["kernel"].array
    assert qa.qvalue.dtype == jnp.float4_e2m1fn
    assert qa.scale.shape == (w.shape[0] // 16, w.shape[1])  # 1x16 along the contraction
    s = 2.0 ** math.ceil(math.log2(np.abs(w).max() / (448 * 6)))
    block = np.asarray(qa.scale, np.float64) / s
    assert block.max() <= 448
    np.testing.assert_array_equal(block.astype(ml_dtypes.float8_e4m3fn).astype(np.float64),
                                  block)
    deq = np.asarray(qwix.dequantize(qa), np.float64)
    per_block = np.repeat(np.asarray(qa.scale, np.float64), 16, axis=0)
    assert np.all(np.abs(deq - w) <= per_block + 1e-12)  # E2M1 steps are <= 2: half is 1


def test_weight_bytes_by_hand(tiny):
    _, params, _ = tiny
    d, f, v, n = TINY.d_model, TINY.d_ff, TINY.vocab_size, TINY.n_layers
    kernels = [(d, 3 * d), (d, d), (d, 2 * f), (f, d)] * n
    other = 2 * v * d + (2 * n + 1) * d  # embedding, head, norms: BF16
    bf16 = 2 * (other + sum(a * b for a, b in kernels))
    fp8 = 2 * other + sum(a * b + 2 * b for a, b in kernels)  # + a BF16 scale per column
    fp8_tensor = 2 * other + sum(a * b + 2 for a, b in kernels)  # + one BF16 scale
    nvfp4 = 2 * other + sum(a * b / 2 + (a // 16) * b + 4 for a, b in kernels)
    for fmt, want in (("bf16", bf16), ("fp8-w", fp8), ("int8", fp8), ("nvfp4-w", nvfp4),
                      ("fp8-tensor", fp8_tensor)):
        got = X.weight_bytes(Q.export_lm(TINY, params, fmt))
        assert got["bytes"] == want and got["bf16_bytes"] == bf16, fmt
        assert got["ratio_to_bf16"] == pytest.approx(want / bf16)


# --------------------------------------------------------------------- fp8-tensor


def _bf16_at_least(v: float) -> float:
    """The smallest BF16 number >= v > 0, by ml_dtypes."""
    b = np.asarray(v, np.float32).astype(ml_dtypes.bfloat16)
    if float(b) < v:
        b = (b.view(np.uint16) + np.uint16(1)).view(ml_dtypes.bfloat16)
    return float(b)


def _e4m3(a):
    """Saturating round-to-nearest-even to E4M3 by ml_dtypes, as float64."""
    return np.clip(a, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def test_fp8_tensor_weights_have_one_scale_amax_over_448(tiny):
    _, params, _ = tiny
    ex = Q.export_lm(TINY, params, "fp8-tensor")
    for a, b in (("attn", "qkv"), ("mlp", "wo")):
        w = np.asarray(jnp.asarray(params["block1"][a][b]["kernel"], jnp.bfloat16), np.float64)
        qa = ex.variables["params"]["block1"][a][b]["kernel"].array
        scale = float(np.float64(np.abs(w).max() / 448).astype(ml_dtypes.bfloat16))
        assert qa.scale.shape == (1, 1) and qa.scale.dtype == jnp.bfloat16
        assert float(qa.scale[0, 0]) == scale
        assert X.transposed(qa)  # stored [N, K]
        assert qa.qvalue.dtype == jnp.float8_e4m3fn and qa.qvalue.shape == w.T.shape
        np.testing.assert_array_equal(np.asarray(qa.qvalue, np.float64).T, _e4m3(w / scale))


def test_per_tensor_quantizer_saturates_at_448_and_keeps_zero_tensors():
    # amax / 448 rounds DOWN to BF16 here: the largest value lands just past 448, clipped
    amax = float(np.float32(448 * 1.0078125 * 1.001))
    w = jnp.asarray([[amax, -amax / 3], [1e-3, 0.0]], jnp.float32).astype(jnp.bfloat16)
    qa = X.quantize_per_tensor(w)
    s = float(qa.scale[0, 0])
    wf = np.asarray(w, np.float64)
    assert s < np.abs(wf).max() / 448 and np.abs(wf).max() / s > 448
    q = np.asarray(qa.qvalue, np.float64)
    assert q[0, 0] == 448 and np.isfinite(q).all()
    np.testing.assert_array_equal(q, _e4m3(wf / s))
    zero = X.quantize_per_tensor(jnp.zeros((4, 4), jnp.bfloat16))
    assert float(zero.scale[0, 0]) == 1.0 and not np.asarray(zero.qvalue, np.float32).any()


def test_fp8_tensor_product_against_a_numpy_emulation():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 5, 64)) * 0.3
    x[1, 2, 7] = 17.0  # an outlier sets the activation's scale
    x = jnp.asarray(x, jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(64, 48)) * 0.05, jnp.bfloat16)
    qa = X.quantize_per_tensor(w)
    y = X.fp8_tensor_dot(x, qa, (((2,), (0,)), ((), ())))
    assert y.shape == (2, 5, 48) and y.dtype == jnp.bfloat16
    xf, sw = np.asarray(x, np.float64), float(qa.scale[0, 0])
    s = _bf16_at_least(float(np.float32(np.abs(xf).max() / 448) * np.float32(sw)))
    sx = np.float32(s) / np.float32(sw)
    assert np.abs(xf).max() / sx <= 448 * (1 + 2 ** -20)  # nothing saturates
    xq = _e4m3(np.asarray(x, np.float32) * (np.float32(1) / sx))  # the hardware's cast
    wq = np.asarray(qa.qvalue, np.float64)
    ref = (xq.reshape(10, 64) @ wq * s).reshape(2, 5, 48)
    mag = (np.abs(xq.reshape(10, 64)) @ np.abs(wq) * s).reshape(2, 5, 48)
    # two BF16 roundings (half an ulp each, at most 2^-8): the product, its product with s
    err = np.abs(np.asarray(y, np.float64) - ref)
    assert (err <= 2.0 ** -7 * np.abs(ref) + 1e-6 * mag).all()
    # the product scales x ~ xq * sx, so y ~ x @ w
    direct = xf.reshape(10, 64) @ np.asarray(w, np.float64)
    assert np.abs(np.asarray(y, np.float64).reshape(10, 48) - direct).max() <= \
        0.1 * np.abs(direct).max()


def test_fp8_tensor_hlo_scales_the_f8_dot_by_one_bf16_scalar(tiny):
    import re

    _, params, tokens = tiny
    ex = Q.export_lm(TINY, params, "fp8-tensor")
    txt = jax.jit(ex.model.apply).lower(ex.variables, tokens).as_text()
    dots = re.findall(r"(%\d+) = stablehlo\.dot_general [^\n]*\(tensor<[^>]*xf8E4M3FN>, "
                      r"tensor<[^>]*xf8E4M3FN>\) -> tensor<\d+x\d+xbf16>", txt)
    assert len(dots) == 4 * TINY.n_layers  # 2-D products with BF16 outputs, no FP32 one
    for d in dots:
        m = re.search(rf"= stablehlo\.multiply {d}, (%\d+)", txt)
        assert m, d
        assert re.search(rf"{m.group(1)} = stablehlo\.broadcast_in_dim %\w+, dims = \[\] "
                         r": \(tensor<bf16>\)", txt), d


def test_fp8_tensor_logits_are_close_to_bf16(tiny):
    model, params, tokens = tiny
    ref = np.asarray(jax.jit(model.apply)({"params": X.to_bf16(params)}, tokens))
    for fmt in ("fp8-tensor", "fp8"):
        ex = Q.export_lm(TINY, params, fmt)
        out = np.asarray(ex.model.apply(ex.variables, tokens))
        err = np.abs(out - ref).max()
        assert 0 < err <= 0.05 * np.abs(ref).max(), (fmt, err)


def test_format_fields_are_checked():
    with pytest.raises(ValueError, match="per-tensor"):
        X.ExportFormat("x", "int8", "int8", granularity="tensor")
    with pytest.raises(ValueError, match="weight-only FP8 / INT8"):
        X.ExportFormat("x", "nvfp4", kernel="xla")
    with pytest.raises(ValueError, match="kernel must be one of"):
        X.ExportFormat("x", "int8", kernel="cuda")
    with pytest.raises(ValueError, match="transposed weights"):
        X.ExportFormat("x", "int8", weight_layout="nk")  # qwix's product reads [K, N]
    assert X.resolve_format("fp8-tensor").gemm == "fp8"


@pytest.mark.parametrize("fmt", ["fp8-tensor", "fp8-w", "int8-w"])
def test_transposed_weights_give_the_logits_of_the_stored_layout(tiny, fmt):
    """fp8-tensor and the weight-only formats store each quantized kernel transposed
    ([N, K]); the model computes what it computes with them stored as the layer holds them
    ([K, N]), for a prompt (the GEMM path) and for one token of decode (the reduction path),
    and the program has no transpose of a 1-byte array."""
    import dataclasses

    _, params, tokens = tiny
    ex = Q.export_lm(TINY, params, fmt)
    kn = Q.export_lm(TINY, params, dataclasses.replace(
        ex.fmt, weight_layout="kn", kernel=ex.fmt.kernel and "xla"))
    arrays = [X._qarray(a) for a in jax.tree.leaves(ex.variables["params"],
                                                    is_leaf=X._is_quantized)
              if X._is_quantized(a)]
    assert len(arrays) == 4 * TINY.n_layers and all(X.transposed(a) for a in arrays)
    ref = {X._qarray(a).shape for a in jax.tree.leaves(kn.variables["params"],
                                                       is_leaf=X._is_quantized)
           if X._is_quantized(a)}
    assert {a.qvalue.shape[::-1] for a in arrays} == ref == {a.shape for a in arrays}
    assert X.weight_bytes(ex) == X.weight_bytes(kn)
    for t in (tokens, tokens[:, :1]):
        a = np.asarray(ex.model.apply(ex.variables, t), np.float32)
        b = np.asarray(kn.model.apply(kn.variables, t), np.float32)
        np.testing.assert_allclose(a, b, rtol=2.0 ** -7, atol=1e-3 * np.abs(b).max())
    hlo = jax.jit(ex.model.apply).lower(ex.variables, tokens[:, :1]).compile().as_text()
    assert not re.search(r"(f8e4m3fn|s8)\[[0-9,]+\]\{[0-9,]+\} transpose\(", hlo)


@pytest.mark.parametrize("fmt", ["int8", "fp8-tensor", "fp8-w"])
def test_save_load_round_trip(tiny, tmp_path, fmt):
    _, params, tokens = tiny
    ex = Q.export_lm(TINY, params, fmt)
    assert X.save(tmp_path / "q", ex) > 0
    back = X.load(tmp_path / "q", ex)
    np.testing.assert_array_equal(np.asarray(back.model.apply(back.variables, tokens)),
                                  np.asarray(ex.model.apply(ex.variables, tokens)))


def test_flax_fp8_calibration_records_the_kernel_amax(tiny):
    from repro.precision.layers import FP8_META

    _, params, tokens = tiny
    with pytest.raises(ValueError, match="calib_batches"):
        Q.export_lm(TINY, params, "flax-fp8")
    ex = Q.export_lm(TINY, params, "flax-fp8", calib_batches=[tokens])
    meta = ex.variables[FP8_META]["block0"]["mlp"]["wo"]["Fp8DirectDotGeneralOp_0"]
    w = jnp.asarray(params["block0"]["mlp"]["wo"]["kernel"], jnp.bfloat16)
    assert float(meta["kernel_amax_history"][0]) == float(jnp.max(jnp.abs(w)))


def test_unknown_format_and_unmatched_rule(tiny):
    model, params, _ = tiny
    with pytest.raises(ValueError, match="unknown inference format 'fp6'"):
        X.resolve_format("fp6")
    with pytest.raises(ValueError, match="matched no product"):
        X.export(model, params, "int8", (1, 8), module_path="nothing/here")


# ----------------------------------------------------------------------------- lowering


_CUBLAS_S8 = """
ENTRY %main {
  %p0 = s8[64,512]{1,0} parameter(0)
  %p1 = s8[256,512]{1,0} parameter(1)
  %custom-call.1 = (s32[64,256]{1,0}, s8[0]{0}) custom-call(%p0, %p1), custom_call_target="__cublas$gemm"
}
"""
_S8_TO_S8 = """
ENTRY %main {
  %p0 = s8[64,512]{1,0} parameter(0)
  %p1 = s8[512,256]{1,0} parameter(1)
  ROOT %dot.1 = s8[64,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
_FUSED_DEQUANT = """
%fused_computation {
  %param_0 = s8[512,256]{1,0} parameter(0)
  %param_1 = bf16[64,512]{1,0} parameter(1)
  %convert.1 = bf16[512,256]{1,0} convert(%param_0)
  ROOT %dot.2 = bf16[64,256]{1,0} dot(%param_1, %convert.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main {
  %p0 = s8[512,256]{1,0} parameter(0)
}
"""
_SEPARATE_DEQUANT = """
%fused_convert {
  %param_0 = s8[512,256]{1,0} parameter(0)
  ROOT %convert.1 = bf16[512,256]{1,0} convert(%param_0)
}

ENTRY %main {
  %p0 = bf16[64,512]{1,0} parameter(0)
  %f = bf16[512,256]{1,0} fusion(%p1), kind=kLoop, calls=%fused_convert
  ROOT %dot.3 = bf16[64,256]{1,0} dot(%p0, %f), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

_PALLAS_DEQUANT = """
%body {
  %state = (bf16[16,512]{1,0}, f8e4m3fn[512,256]{1,0}, bf16[1,256]{1,0}) parameter(0)
  %x = bf16[16,512]{1,0} get-tuple-element(%state), index=0
  %w = f8e4m3fn[512,256]{1,0} get-tuple-element(%state), index=1
  %s = bf16[1,256]{1,0} get-tuple-element(%state), index=2
  %custom-call.1 = bf16[16,256]{1,0} custom-call(%x, %w, %s), custom_call_target="__gpu$xla.gpu.triton"
}
"""

# dequant_gemm's one-row product: a reduce over the transposed 1-byte weight, no dot
_REDUCE_DEQUANT = """
%fused_reduce {
  %param_0 = f8e4m3fn[256,512]{1,0} parameter(0)
  %param_1 = f32[1,512]{1,0} parameter(1)
  %convert.1 = f32[256,512]{1,0} convert(%param_0)
  %b = f32[256,512]{1,0} broadcast(%param_1), dimensions={0,1}
  %m = f32[256,512]{1,0} multiply(%b, %convert.1)
  %c = f32[] constant(0)
  ROOT %r = f32[256]{0} reduce(%m, %c), dimensions={1}, to_apply=%add
}
"""


def test_lowering_checks_on_hand_written_hlo():
    assert L.int8_lowering_gpu(_CUBLAS_S8) == "s8-gemm"
    assert L.int8_lowering_gpu(_S8_TO_S8) == "s8-other"
    assert L.int8_lowering_gpu("ROOT %d = bf16[2,2]{1,0} dot(%a, %b)") == "no-s8"
    assert L.dequant_lowering_gpu(_FUSED_DEQUANT) == "fused"
    assert L.dequant_lowering_gpu(_SEPARATE_DEQUANT) == "separate"
    assert L.dequant_lowering_gpu(_PALLAS_DEQUANT) == "pallas"
    assert L.dequant_lowering_gpu(_REDUCE_DEQUANT) == "reduce"
    # a reduce of widened weights written by another kernel is not the fused reduction
    assert L.dequant_lowering_gpu(_REDUCE_DEQUANT.replace("f8e4m3fn[256,512]{1,0} parameter",
                                                      "f32[256,512]{1,0} parameter")
                              + _SEPARATE_DEQUANT) == "separate"
    # a Pallas kernel that reads only wide arrays leaves a separate widening
    assert L.dequant_lowering_gpu(_PALLAS_DEQUANT.replace(", %w, %s)", ", %s)")) == "separate"
    assert L.dequant_lowering_gpu("ROOT %d = bf16[2,2]{1,0} dot(%a, %b)") == "none"


def test_speed_is_emulated_off_tensor_cores():
    from repro.hardware import lookup

    h200, cpu = lookup("h200"), lookup("cpu")
    fp8, int8, w8, nv = (X.resolve_format(n) for n in ("fp8", "int8", "int8-w", "nvfp4-w"))
    assert not S.speed_emulated(fp8, "cublaslt-f8", h200)
    assert S.speed_emulated(fp8, "upcast", h200)
    assert not S.speed_emulated(int8, "s8-gemm", h200)
    assert S.speed_emulated(int8, "s8-other", h200)
    assert not S.speed_emulated(w8, "separate", h200)
    assert S.speed_emulated(nv, "fused", h200)
    assert S.speed_emulated(fp8, "cublaslt-f8", cpu)


# -------------------------------------------------------------------------------- study


def _params(**over):
    p = {"profile": "smoke", "model": "tiny", "formats": ["bf16", "int8", "fp8-w"],
         "priority": ["fp8-w"], "seeds": [0, 1],
         "train": {"steps": 4, "batch_size": 4, "lr": 0.003, "warmup_steps": 1,
                   "eval_every": 2, "eval_batches": 1},
         "eval_windows": 1, "calib_batches": 1,
         "speed": {"repeats": 1, "prompt_len": 8, "decode_steps": 2, "decode_batches": [1],
                   "configs": {"tiny": {"preset": "tiny", "prefill_batch": 1},
                               "other": {"preset": "tiny", "d_model": 32, "n_heads": 2,
                                         "formats": ["int8"]}}}}
    p.update(over)
    return p


def test_cells_order_gives_a_verdict_early():
    names = [c.name for c in I.cells(_params())]
    assert names == ["quality_s0", "speed_tiny_fp8-w", "quality_s1", "speed_tiny_int8",
                     "speed_other_int8"]


@pytest.mark.parametrize("over,match", [
    ({"formats": ["int8"]}, "must include bf16"),
    ({"formats": ["bf16", "int3"]}, "unknown format"),
    ({"model": "huge"}, "unknown model"),
    ({"train": {"stepz": 3}}, "unknown train field"),
    ({"speed": {"repeats": 0}}, "speed.repeats"),
])
def test_check_names_the_bad_parameter(over, match):
    with pytest.raises(ConfigError, match=match):
        I.check(_params(**over))


def test_best_step_is_the_lowest_heldout_loss():
    hist = [{"step": 10, "eval_loss": 2.0}, {"step": 20, "eval_loss": 1.5},
            {"step": 30, "eval_loss": 1.5}, {"step": 40, "eval_loss": 1.7}]
    assert I.best_step(hist) == 20


def test_train_best_loads_the_checkpoint_of_the_best_step(tmp_path, monkeypatch):
    from repro.models import lm_train as T

    tc = I.train_config(_params()).replace(steps=4, eval_every=2)
    monkeypatch.setattr(I, "best_step", lambda history: 2)  # as if step 2 were the best
    variables, history, best = I.train_best(TINY, tc, tmp_path / "run", None)
    assert best == 2 and [h["step"] for h in history] == [2, 4]
    ref = T.train(TINY, tc, "bf16", stop_at=2, keep_variables=True, progress=False)
    got, want = variables["params"], ref.variables["params"]
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_study_writes_records_the_analysis_reads(tmp_path, monkeypatch):
    from repro import evidence
    from repro.studies import runner

    p = _params(seeds=[0], formats=["bf16", "int8"])
    p["checkpoints"] = str(tmp_path / "ckpt")
    p["speed"]["configs"] = {"tiny": {"preset": "tiny", "prefill_batch": 1}}
    out = runner.run(I.STUDY, p, tmp_path / "res", progress=False)
    assert sorted(path.stem for path in out.written) == ["quality_s0", "speed_tiny_int8"]
    df = evidence.load_records("inference", roots=[tmp_path / "res"])
    acc, mem, spd = A.accuracy_table(df), A.bytes_table(df), A.speed_table(df)
    assert set(acc["format"]) == {"bf16", "int8"}
    assert acc.set_index("format").loc["bf16", "rel_gap"] == 0.0
    assert set(spd["phase"]) == {"prefill", "decode"} and spd["emulated"].all()
    assert mem.set_index("format").loc["int8", "ratio_to_bf16"] < 1
    assert not any(f.is_file() for f in (tmp_path / "ckpt").rglob("*"))


# ------------------------------------------------------------------------------- tables


def test_accuracy_table_pairs_seeds():
    recs = []
    for seed, (loss, base) in enumerate([(1.01, 1.00), (1.03, 1.00), (1.02, 1.00)]):
        for fmt, val in (("fp8", loss), ("bf16", base)):
            recs.append({"hardware": "h200", "profile": "full", "recipe": fmt,
                         "metric": "heldout_loss", "value": val, "emulated": False,
                         "timestamp": "t", "size_model": "20m", "size_seed": seed,
                         "extra": {"loss_bf16": base, "best_step": 100}})
    t = A.accuracy_table(pd.DataFrame(recs)).set_index("format")
    assert t.loc["fp8", "rel_gap"] == pytest.approx(0.02)
    half = 4.302653 * 0.01 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n)
    assert t.loc["fp8", "rel_hi"] == pytest.approx(0.02 + half, rel=1e-5)
    assert t.loc["bf16", "rel_gap"] == 0.0


def test_best_evidence_prefers_the_full_profile_then_a_gpu():
    t = pd.DataFrame([{"hardware": hw, "profile": prof, "format": "fp8"}
                      for hw, prof in (("cpu", "smoke"), ("h200", "smoke"), ("cpu", "full"),
                                       ("h200", "full"))])
    assert best_evidence_rows(t) == [("h200", "full")]
    assert best_evidence_rows(t.iloc[:3]) == [("cpu", "full")]
    assert best_evidence_rows(t.iloc[:2]) == [("h200", "smoke")]
    assert A.best_evidence(t.iloc[:0]).empty


def best_evidence_rows(t):
    return list(A.best_evidence(t)[["hardware", "profile"]].itertuples(index=False, name=None))


def test_key_numbers_take_best_evidence_and_tensor_core_speed_at_each_formats_widest_config():
    acc = pd.DataFrame([{"hardware": "h200", "profile": "full", "format": f, "rel_gap": g,
                         "rel_hi": h} for f, g, h in (("bf16", 0.0, 0.0), ("fp8", 0.002, 0.004))]
                       + [{"hardware": "cpu", "profile": "smoke", "format": "fp8", "rel_gap": 0.5,
                           "rel_hi": 0.9}])
    mem = pd.DataFrame([{"hardware": "h200", "profile": "full", "format": "int8-w",
                         "ratio_to_bf16": 0.51}])
    spd = pd.DataFrame([{"hardware": "h200", "profile": "full", "format": f, "d_model": d,
                         "phase": ph, "batch": b, "speedup": s, "emulated": e}
                        for f, d, ph, b, s, e in (("fp8", 4096, "prefill", 8, 1.4, False),
                                                  ("fp8", 256, "prefill", 64, 0.9, False),
                                                  ("nvfp4-w", 4096, "decode", 1, 0.3, True),
                                                  ("int8-w", 4096, "decode", 1, 1.6, False),
                                                  ("int8-w", 8192, "decode", 1, 1.7, False),
                                                  ("nvfp4-w", 8192, "decode", 1, 0.2, True))])
    # fp8 was timed at 4096 at most, int8-w at 8192: each at its own widest; emulated left out
    assert A.key_numbers(acc, mem, spd) == {
        "fp8": {"rel_gap": 0.002, "rel_hi": 0.004, "prefill_b8_speedup": 1.4,
                "speed_d_model": 4096},
        "int8-w": {"ratio_to_bf16": 0.51, "decode_b1_speedup": 1.7, "speed_d_model": 8192}}
    empty = A.accuracy_table(pd.DataFrame())
    assert A.key_numbers(empty, A.bytes_table(pd.DataFrame()), A.speed_table(pd.DataFrame())) == {}
