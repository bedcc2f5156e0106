"""The step-time model: FLOP counts by hand, measured rates returned exactly, a calibration
that recovers the parameters that generated its data, projections that use the target's peaks
and never pose as measurements."""

import dataclasses

import pandas as pd
import pytest

from repro import hardware as hw
from repro import evidence, results
from repro.claims import verdicts
from repro.perfmodel import calibrate as cb
from repro.perfmodel import cost, measured
from repro.perfmodel import project as pj

H200 = hw.lookup("h200")


# ------------------------------------------------------------------------------ FLOP counts


@pytest.mark.parametrize("recipe", ["bf16", "fp8-current", "fp8-delayed", "flax-fp8"])
def test_mlp_flops_by_hand(recipe):
    step = cost.mlp_step_gemms(4, 8, 2, recipe)
    assert step.flops == 6 * 4 * 8 * 8 * 2
    # forward, data gradient, weight gradient of each layer; weight gradient is (W, B, W)
    assert [(g.m, g.k, g.n) for g in step.gemms] == [(4, 8, 8), (4, 8, 8), (8, 4, 8)] * 2
    want = "bf16" if recipe == "bf16" else "fp8"
    assert {g.fmt for g in step.gemms} == {want}
    # Without the input's gradient (what XLA runs): one (B, W, W) GEMM fewer.
    no_input_grad = cost.mlp_step_gemms(4, 8, 2, recipe, input_grad=False)
    assert no_input_grad.flops == 6 * 4 * 64 * 2 - 2 * 4 * 64


def test_mlp_quantization_traffic_by_hand():
    b, w = 4, 8
    e, p = b * w, w * w
    bf16 = cost.mlp_step_gemms(b, w, 2, "bf16")
    cur = cost.mlp_step_gemms(b, w, 2, "fp8-current")
    dly = cost.mlp_step_gemms(b, w, 2, "fp8-delayed")
    # Current scaling: one amax read (2 bytes) of x and of g per layer.
    assert cur.traffic_bytes(["amax"]) == 2 * (2 * e * 2)
    assert dly.traffic_bytes(["amax"]) == 0
    # The first layer's input has no producing pass: quantized on its own (read 2, write 2x1).
    assert cur.traffic_bytes(["quantize"]) == e * (2 + 2)
    # Weights from the FP32 master: read 4 (+4 for the amax) and write both FP8 layouts.
    assert cur.traffic_bytes(["weight_quantize"]) == 2 * p * (8 + 2)
    assert dly.traffic_bytes(["weight_quantize"]) == 2 * p * (4 + 2)
    assert bf16.traffic_bytes(["cast"]) == 2 * p * (4 + 2)
    # Everything else (activations, loss, optimizer) is the same in every recipe.
    common = ["activation", "bias_grad", "optimizer", "loss"]
    assert bf16.traffic_bytes(common) == cur.traffic_bytes(common) == dly.traffic_bytes(common)
    assert bf16.traffic_bytes(["optimizer"]) == 2 * (p + w) * 28


def test_lm_flops_by_hand():
    cfg = cost.DecoderShape("t", hidden=64, n_layers=3, ffn=96, n_heads=4, n_kv_heads=2,
                            vocab=100, seq_len=16, n_bf16_last_blocks=1)
    T, hd = 32, 16
    linear = 64 * (4 + 2 * 2) * hd + 4 * hd * 64 + 64 * 2 * 96 + 96 * 64  # qkv, out, gate+up, down
    attn = 7 * 2 * 16 * hd * 16 * (T // 16) * 4 * 0.5  # 2 fwd + 5 bwd products, causal half
    head = 6 * T * 64 * 100
    want = 3 * (6 * T * linear + attn) + head
    for recipe in ("bf16", "fp8-current", "nvfp4"):
        assert cost.lm_step_gemms(cfg, T, recipe).flops == pytest.approx(want, rel=1e-12)
    fp4 = cost.lm_step_gemms(cfg, T, "nvfp4", "paper").flops_by_format()
    assert fp4["fp4"] == pytest.approx(2 * 6 * T * linear)  # the last block stays BF16
    mlp = cost.lm_step_gemms(cfg, T, "nvfp4", "mlp", other_recipe="fp8-current").flops_by_format()
    assert mlp["fp4"] == pytest.approx(3 * 6 * T * (64 * 2 * 96 + 96 * 64))
    assert mlp["fp8"] == pytest.approx(3 * 6 * T * (64 * (4 + 2 * 2) * hd + 4 * hd * 64))
    # attention and head stay BF16 under every policy
    assert mlp["bf16"] == pytest.approx(3 * attn + head)


def test_lm_attention_bytes_keep_scores_on_chip():
    """Fused (flash) attention never writes the [s, s] scores: each of the 7 products per block
    moves two [s, hd] BF16 tiles per (sequence, head), counted by hand here."""
    cfg = cost.DecoderShape("t", hidden=64, n_layers=3, ffn=96, n_heads=4, n_kv_heads=2,
                            vocab=100, seq_len=16, n_bf16_last_blocks=1)
    T, hd, s = 32, 16, 16
    step = cost.lm_step_gemms(cfg, T, "bf16")
    attn = [g for g in step.gemms if g.role.startswith("attn.")]
    assert len(attn) == 7
    got = sum(g.launch_bytes * g.count for g in attn)
    assert got == 7 * 3 * (T // s) * 4 * (2 * s * hd * 2)
    # a plain GEMM still counts its operands and output
    g = cost.Gemm(8, 4, 2, fmt="bf16")
    assert g.launch_bytes == (8 * 4 + 4 * 2 + 8 * 2) * 2
    assert cost.Gemm(8, 4, 2, batch=3, hbm_bytes=10.0).launch_bytes == 30.0


def test_llama_shapes():
    c = cost.llama3_8b_config()
    assert (c.hidden, c.n_layers, c.ffn, c.n_heads, c.n_kv_heads, c.vocab) == (
        4096, 32, 14336, 32, 8, 128256)
    assert 7.9e9 < c.params < 8.2e9  # Llama 3 8B: 8.03B parameters
    c = cost.llama3_405b_config()
    assert (c.hidden, c.n_layers, c.ffn, c.n_heads, c.n_kv_heads) == (16384, 126, 53248, 128, 8)
    assert 4.0e11 < c.params < 4.1e11


# ----------------------------------------------------------------- synthetic measurements

SWEEP = [(2048, 64, 64), (4096, 1024, 1024), (8192, 8192, 8192), (65536, 256, 256),
         (65536, 1024, 1024), (65536, 4096, 4096)]
OVERHEAD_S = 40e-6  # per-call overhead in the synthetic sweep


def _true_time(m, k, n, fmt):
    """A smooth 'hardware': latency-throughput GEMM law plus the sweep's call overhead."""
    f = 2.0 * m * k * n
    peak = {"bf16": 700e12, "fp8": 1300e12}[fmt]
    return f / peak + 4e-6 + OVERHEAD_S


def _gemm_records(info=H200):
    recs = []
    for m, k, n in SWEEP:
        for fmt in ("bf16", "fp8"):
            t = _true_time(m, k, n, fmt)
            recs.append(results.make_record("gemm", "tflops", 2.0 * m * k * n / t / 1e12,
                                            "TFLOP/s", recipe=fmt,
                                            sizes={"M": m, "K": k, "N": n}, hardware=info))
    return recs


def _frame(recs):
    return pd.DataFrame(recs)


def test_interpolation_is_exact_at_measured_shapes(tmp_path):
    recs = _gemm_records()
    results.write_records(recs, "gemm", "synthetic", root=tmp_path / "results")
    df = evidence.load_records("gemm", roots=tmp_path / "results")
    table = measured.RateTable.from_records(df, H200)
    by_shape = {(r["recipe"], r["sizes"]["M"], r["sizes"]["K"], r["sizes"]["N"]): r["value"]
                for r in recs}
    for (fmt, m, k, n), tflops in by_shape.items():
        assert table.measured_rate(m, k, n, fmt, H200) == pytest.approx(tflops, rel=1e-12)
    # The overhead: the smallest excess of a measured time over its datasheet roofline (here
    # set by the tiny and the memory-bound shapes: the call overhead plus at most the latency).
    assert OVERHEAD_S - 1e-6 < table.overhead_s["bf16"] < OVERHEAD_S + 4e-6
    # At a measured shape the model's GEMM time is the measured time less that overhead.
    cal = cb.Calibration(H200, cb.ModelParams(), table, True)
    m, k, n = 65536, 4096, 4096
    t_meas = 2.0 * m * k * n / (by_shape[("bf16", m, k, n)] * 1e12)
    assert cb.gemm_time(cost.Gemm(m, k, n), cal) == pytest.approx(
        t_meas - table.overhead_s["bf16"], rel=1e-9)
    # Off the sweep: a rate between its measured neighbours (in flops), scaled by the factor.
    lo = cb.gemm_time(cost.Gemm(65536, 1024, 1024), cal)
    hi = cb.gemm_time(cost.Gemm(65536, 4096, 4096), cal)
    mid = cost.Gemm(65536, 2048, 2048)
    t_mid = cb.gemm_time(mid, cal)
    rate = mid.flops / t_mid
    assert 65536 * 1024 * 1024 * 2 / lo < rate < 65536 * 4096 * 4096 * 2 / hi
    half = dataclasses.replace(cal, params=dataclasses.replace(cal.params, offsweep_gemm_eff=0.5))
    assert cb.gemm_time(mid, half) == pytest.approx(2 * t_mid, rel=1e-9)
    assert cb.gemm_time(cost.Gemm(m, k, n), half) == pytest.approx(
        t_meas - table.overhead_s["bf16"])


TRUE = cb.ModelParams(offsweep_gemm_eff=0.8, bw_eff=0.7, gap_us=12.0,
                      step_floor_us=150.0)
FIT_SHAPES = [(256, 64, 2), (1024, 128, 2), (65536, 256, 3), (65536, 1024, 3),
              (65536, 4096, 3), (16384, 4096, 4), (8192, 8192, 3), (4096, 1024, 2)]


def _step_records(params, recipe_times=None, info=H200):
    table = measured.RateTable.from_records(_frame(_gemm_records(info)), info)
    cal = cb.Calibration(info, params, table, True)
    recs = []
    for b, w, d in FIT_SHAPES:
        for recipe in ("bf16", "fp8-current", "fp8-delayed"):
            t = cb.predict(cost.mlp_step_gemms(b, w, d, recipe, input_grad=False), cal)["total_s"]
            if recipe_times and recipe in recipe_times:
                t = recipe_times[recipe]
            recs.append(results.make_record("mlp_step", "step_time_ms", t * 1e3, "ms",
                                            recipe=recipe, hardware=info,
                                            sizes={"batch": b, "width": w, "depth": d}))
    return recs


def test_calibration_recovers_known_parameters():
    df = _frame(_gemm_records() + _step_records(TRUE))
    cal = cb.calibrate(df, "h200")
    assert cal.calibrated and set(cal.fitted) == set(cb.ModelParams.FITTED)
    for name in cb.ModelParams.FITTED:
        assert getattr(cal.params, name) == pytest.approx(getattr(TRUE, name), rel=0.03), name
    # ... so the FP8 speedups it was never shown come out right.
    val = cb.validate(df, cal)
    assert len(val) == 2 * len(FIT_SHAPES)
    assert val["error"].abs().max() < 0.01


def test_calibration_never_sees_fp8_step_times():
    honest = _frame(_gemm_records() + _step_records(TRUE))
    absurd = _frame(_gemm_records() + _step_records(TRUE, {"fp8-current": 9.0,
                                                           "fp8-delayed": 1e-6}))
    a, b = cb.calibrate(honest, "h200"), cb.calibrate(absurd, "h200")
    assert a.params == b.params
    # ...and validation does use them.
    assert cb.validate(absurd, b)["error"].abs().min() > 0.5


# ------------------------------------------------------------------------------ projection


def test_projection_uses_target_peaks():
    cal = cb.calibrate(_frame(_gemm_records() + _step_records(TRUE)), "h200")
    big = cost.Gemm(16384, 16384, 16384, fmt="fp8")
    fp4 = dataclasses.replace(big, fmt="fp4")
    for slug in pj.TARGETS:
        tgt = hw.lookup(slug)
        ratio = cb.gemm_time(big, cal, tgt) / cb.gemm_time(fp4, cal, tgt)
        assert ratio == pytest.approx(tgt.peak_tflops["fp4"] / tgt.peak_tflops["fp8"], rel=1e-6)
        # The efficiency is the one measured on the H200 for that shape.
        eff = big.flops / cb.gemm_time(big, cal, tgt) / (tgt.peak_tflops["fp8"] * 1e12)
        h200_eff = big.flops / cb.gemm_time(big, cal) / (H200.peak_tflops["fp8"] * 1e12)
        assert eff == pytest.approx(h200_eff, rel=1e-6)
    with pytest.raises(ValueError, match="no fp4"):
        cb.gemm_time(fp4, cal)  # Hopper has no FP4 tensor cores
    proj = pj.project(cal)
    assert set(proj["target"]) == {"h200", *pj.TARGETS}
    assert not ((proj["target"] == "h200") & (proj["recipe"] == "nvfp4")).any()
    big_lm = proj[(proj["model"] == "llama3-405b") & (proj["comparison"] == "nvfp4_vs_bf16")]
    assert (big_lm["speedup"] > 1.5).all()
    gb = big_lm.set_index("target")["speedup"]
    assert gb["gb300"] > gb["gb200"]  # 15 vs 10 PFLOP/s of FP4, same BF16


def _check_labelled(proj, calibrating, mode, with_self=True):
    """Every projection names the chip its efficiencies come from and the projected chip;
    NVFP4 is never projected onto a chip without FP4 tensor cores."""
    assert len(proj)
    assert set(proj["hardware"]) == {calibrating} and set(proj["mode"]) == {mode}
    assert set(proj["target"]) == ({calibrating} if with_self else set()) | set(pj.TARGETS)
    no_fp4 = {s for s in proj["target"] if not hw.lookup(s).has_fp4}
    assert not (proj["target"].isin(no_fp4) & (proj["recipe"] == "nvfp4")).any()


def test_projections_are_labelled_and_carry_the_published_numbers():
    df = _frame(_gemm_records() + _step_records(TRUE))
    mode, cals = pj.calibrations(df)
    assert mode == "calibrated" and [c.hardware.slug for c in cals] == ["h200"]
    proj = pj.projections(mode, cals)
    _check_labelled(proj, "h200", "calibrated")
    assert proj["calibrated"].all()
    # NVIDIA's posts: 1.59x vs BF16 (Llama 3 8B, B200/GB200), 1.73x vs FP8 (405B MLP GEMMs, GB300)
    pub = proj.set_index(["model", "comparison", "target"])["published_speedup"]
    assert pub[("llama3-8b", "nvfp4_vs_bf16", "gb200")] == 1.59
    assert pub[("llama3-405b", "nvfp4_mlp_vs_fp8", "gb300")] == 1.73
    assert pd.isna(pub[("llama3-8b", "nvfp4_vs_bf16", "gb300")])  # nothing published there
    assert len(cb.validate(df, cals[0])) == 2 * len(FIT_SHAPES)


def test_without_gpu_records_the_projection_is_datasheet_only():
    mode, cals = pj.calibrations(pd.DataFrame())
    assert mode == "datasheet" and len(cals) == 1
    assert not cals[0].calibrated and cals[0].rates is None
    proj = pj.projections(mode, cals)
    _check_labelled(proj, cals[0].hardware.slug, "datasheet", with_self=False)
    assert not proj["calibrated"].any()
    assert cb.validation_table(cb.validate(pd.DataFrame(), cals[0])).empty


def test_fp4_speedups_are_measured_on_fp4_chips_only():
    gb = hw.lookup("gb200")
    recs = [results.make_record("lm", "tokens_per_s", v, "tokens/s", recipe=r, hardware=gb,
                                sizes={"model": "20m", "seed": s})
            for r, v in (("bf16", 100.0), ("nvfp4", 170.0)) for s in (0, 1)]
    m = pj.measured_fp4_speedups(pd.DataFrame(recs))
    assert m["speedup"].tolist() == [pytest.approx(1.7)]
    assert m[["hardware", "model", "baseline"]].values.tolist() == [["gb200", "20m", "bf16"]]
    # Emulated NVFP4 (any chip without FP4 tensor cores) never counts as a measurement.
    hop = [dict(r, hardware="h200", emulated=True) for r in recs]
    assert pj.measured_fp4_speedups(pd.DataFrame(hop)).empty


def test_gemm_rates_without_steps_are_not_a_calibration():
    mode, cals = pj.calibrations(_frame(_gemm_records()))
    assert mode == "rates_only" and [c.hardware.slug for c in cals] == ["h200"]
    assert not cals[0].calibrated and cals[0].params == cb.ModelParams()
    proj = pj.projections(mode, cals)
    _check_labelled(proj, "h200", "rates_only")
    assert not proj["calibrated"].any()


def test_projection_setup_from_params():
    setup, targets = pj.projection_setup({"model_names": ["llama3-8b"], "targets": ["gb300"],
                                          "models": {"llama3-8b": {"batch_tokens": 4096,
                                                                   "shape": "ignored"}}})
    assert list(setup) == ["llama3-8b"] and targets == ["gb300"]
    assert setup["llama3-8b"]["batch_tokens"] == 4096
    assert setup["llama3-8b"]["shape"] == cost.llama3_8b_config()
    assert pj.projection_setup(None)[1] == ["b200", "gb200", "gb300"]


def test_perfmodel_and_the_studies_do_not_import_each_other():
    """The model reads the studies' records by experiment name, never their code."""
    import ast
    from pathlib import Path

    root = Path(cost.__file__).parents[1]

    def imports(path):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                yield node.module
                yield from (f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                yield from (a.name for a in node.names)

    def study_code(m):  # the studies' shared code, or an experiment's study or its helpers
        parts = m.split(".")
        return m.startswith("repro.studies") or (
            parts[:2] == ["repro", "experiments"] and len(parts) == 4
            and parts[3] not in ("spec", "tables", "rules"))

    assert study_code("repro.experiments.kernel_times.measure")
    assert not study_code("repro.experiments.kernel_times.tables")
    for f in (root / "perfmodel").glob("*.py"):
        assert not [m for m in imports(f) if study_code(m)], f
    assert not [m for m in imports(root / "experiments" / "kernel_times" / "measure.py")
                if m.startswith("repro.perfmodel")]


def test_program_step_takes_traffic_from_the_compiled_program():
    step = cost.Step([cost.Gemm(4, 8, 2, fmt="bf16")], [cost.Traffic(1e9, "assumed", 7)])
    # hand-computed GEMM bytes: (4*8 + 8*2) * 2 bytes read + 4*2 * 2 bytes written = 112
    out = cost.program_step(step, hlo_bytes=1112.0, hlo_kernels=5)
    assert out.gemms == step.gemms
    assert [(t.bytes, t.passes) for t in out.traffic] == [(1000.0, 4)]
    assert cost.program_step(step, None, 5) is step  # no facts: unchanged
    assert cost.program_step(step, float("nan"), 5) is step


def test_validation_uses_compiled_traffic_where_records_carry_it():
    df = _frame(_gemm_records() + _step_records(TRUE))
    cal = cb.calibrate(df, "h200")
    assert not cb.validate(df, cal).compiled_traffic.any()
    # the same records, each program saying it moves 1 GB besides its GEMMs, in 40 launches
    heavy = df.copy()
    extra = []
    for _, r in heavy.iterrows():
        e = dict(r["extra"] or {})
        if r["experiment"] == "mlp_step":
            s = r["sizes"]
            gemms = cost.mlp_step_gemms(s["batch"], s["width"], s["depth"], r["recipe"],
                                        input_grad=False).gemms
            e.update(hlo_bytes_accessed=sum(g.launch_bytes * g.count for g in gemms) + 1e9,
                     hlo_kernels=40 + sum(g.count for g in gemms))
        extra.append(e)
    heavy["extra"] = extra
    bw = H200.memory_bandwidth_tbs * 1e12
    # the gap is charged per GEMM launch (default) or per launch of any kernel, 40 of them
    for c, extra_launches in ((cal, 0), (cb.calibrate(df, "h200", gap_per="kernel"), 40)):
        v = cb.validate(heavy, c)
        assert len(v) and v.compiled_traffic.all()
        p = c.params
        for r in v.itertuples():
            gemms = cost.mlp_step_gemms(r.batch, r.width, r.depth, r.recipe,
                                        input_grad=False).gemms
            device = (sum(cb.gemm_time(g, c) for g in gemms) + 1e9 / (bw * p.bw_eff)
                      + (extra_launches + sum(g.count for g in gemms)) * p.gap_us * 1e-6)
            expect_ms = max(device, p.step_floor_us * 1e-6) * 1e3
            assert r.predicted_ms == pytest.approx(expect_ms, rel=1e-9)


def test_gap_term_counts_gemm_launches_or_every_kernel():
    """Two steps with the same two GEMMs (3 launches), one with 2 elementwise passes, one with
    20 (an FP8 step's extra scale and amax kernels): per GEMM launch their gaps are equal,
    3 x 10 us; per kernel 5 x 10 and 23 x 10 us. An unknown choice fails with the valid ones."""
    gemms = [cost.Gemm(1024, 1024, 1024, 2), cost.Gemm(1024, 1024, 1024, 1)]
    few = cost.Step(list(gemms), [cost.Traffic(1e6, "x", 2)])
    many = cost.Step(list(gemms), [cost.Traffic(1e6, "x", 20)])
    for per, want in (("gemm", (30e-6, 30e-6)), ("kernel", (50e-6, 230e-6))):
        cal = cb.datasheet_calibration("h200", cb.ModelParams(gap_us=10.0, gap_per=per))
        got = (cb.predict(few, cal)["gap_s"], cb.predict(many, cal)["gap_s"])
        assert got == (pytest.approx(want[0]), pytest.approx(want[1]))
    bad = cb.datasheet_calibration("h200", cb.ModelParams(gap_per="pass"))
    with pytest.raises(ValueError, match="gemm"):
        cb.predict(few, bad)
    with pytest.raises(ValueError, match="gemm"):
        cb.calibrate(None, "h200", gap_per="pass")


# --------------------------------------------------------------------- LM step validation

# The LM presets of repro.models.lm, written out by hand (hidden, layers, ffn, heads, kv heads,
# vocab, seq_len, BF16 last blocks), so the test does not take them from the code under test.
LM_20M = cost.DecoderShape("lm-20m", 512, 6, 1408, 8, 8, 256, 512, 1)
LM_120M = cost.DecoderShape("lm-120m", 768, 17, 2048, 12, 12, 256, 1024, 1)
# hand-chosen step times (ms): {model: (batch, seq_len, {recipe: ms})}
LM_TIMES = {"20m": (64, 512, {"bf16": 100.0, "fp8-current": 80.0, "fp8-delayed": 90.0,
                              "nvfp4": 500.0, "mxfp8": 400.0}),
            "120m": (32, 1024, {"bf16": 300.0, "fp8-current": 240.0, "fp8-delayed": 200.0})}


def _lm_step_records(times=LM_TIMES, info=H200):
    recs = []
    for model, (batch, seq, by_recipe) in times.items():
        for recipe, ms in by_recipe.items():
            recs.append(results.make_record(
                "lm_step", "step_time_ms", ms, "ms", recipe=recipe, hardware=info,
                emulated=recipe in ("nvfp4", "mxfp8"),
                sizes={"model": model, "batch": batch, "seq_len": seq, "tokens": batch * seq}))
            # another metric of the same cell: never read as a step time
            recs.append(results.make_record(
                "lm_step", "tokens_per_s", batch * seq / ms * 1e3, "tokens/s", recipe=recipe,
                hardware=info, sizes={"model": model, "batch": batch, "seq_len": seq}))
    # an emulated FP8 timing beside a BF16 one: emulated records never make a row
    for recipe in ("bf16", "fp8-current"):
        recs.append(results.make_record("lm_step", "step_time_ms", 5.0, "ms", recipe=recipe,
                                        hardware=info, emulated=recipe != "bf16",
                                        sizes={"model": "tiny", "batch": 2, "seq_len": 64}))
    return recs


def test_validation_has_lm_rows_with_the_measured_ratio():
    df = _frame(_gemm_records() + _step_records(TRUE) + _lm_step_records())
    cal = cb.calibrate(df, "h200")
    val = cb.validate(df, cal)
    assert len(val[val["workload"] == "mlp"]) == 2 * len(FIT_SHAPES)
    lm = val[val["workload"] == "lm"].set_index(["model", "recipe"])
    assert sorted(lm.index) == [("120m", "fp8-current"), ("120m", "fp8-delayed"),
                                ("20m", "fp8-current"), ("20m", "fp8-delayed")]
    # measured speedup: the hand-chosen BF16 time over the FP8 one
    assert lm.loc[("20m", "fp8-current"), "measured_speedup"] == pytest.approx(100 / 80)
    assert lm.loc[("20m", "fp8-delayed"), "measured_speedup"] == pytest.approx(100 / 90)
    assert lm.loc[("120m", "fp8-current"), "measured_speedup"] == pytest.approx(300 / 240)
    assert lm.loc[("120m", "fp8-delayed"), "measured_speedup"] == pytest.approx(300 / 200)
    # predicted: the decoder step of that preset at batch x seq_len tokens
    for (model, recipe), r in lm.iterrows():
        shape, (batch, seq, _) = {"20m": LM_20M, "120m": LM_120M}[model], LM_TIMES[model]
        pb = cb.predict(cost.lm_step_gemms(shape, batch * seq, "bf16"), cal)["total_s"] * 1e3
        pq = cb.predict(cost.lm_step_gemms(shape, batch * seq, recipe), cal)["total_s"] * 1e3
        assert r["bf16_predicted_ms"] == pytest.approx(pb, rel=1e-9)
        assert r["predicted_ms"] == pytest.approx(pq, rel=1e-9)
        assert r["predicted_speedup"] == pytest.approx(pb / pq, rel=1e-9)
        assert r["batch"] == batch and r["seq_len"] == seq
    assert not lm["compiled_traffic"].any()


def test_calibration_uses_lm_bf16_steps_but_never_lm_fp8_ones():
    base = _gemm_records() + _step_records(TRUE)
    a = cb.calibrate(_frame(base + _lm_step_records()), "h200")
    absurd = {m: (b, s, {r: (t if r == "bf16" else {"fp8-current": 1e4}.get(r, 1e-3))
                         for r, t in ts.items()}) for m, (b, s, ts) in LM_TIMES.items()}
    b = cb.calibrate(_frame(base + _lm_step_records(absurd)), "h200")
    assert a.params == b.params
    # the BF16 LM steps are fitted: a different BF16 time moves the fit
    slower = {m: (bs, s, {**ts, "bf16": 3 * ts["bf16"]}) for m, (bs, s, ts) in LM_TIMES.items()}
    c = cb.calibrate(_frame(base + _lm_step_records(slower)), "h200")
    assert c.params != a.params
    fit = a.fit.set_index(["workload", "model"])
    # one BF16 step time per LM cell (tokens_per_s records are not step times)
    assert sorted(fit.loc["lm"].index) == ["120m", "20m", "tiny"]
    assert len(a.fit) == len(FIT_SHAPES) + 3 and (a.fit["recipe"] == "bf16").all()


def test_validation_table_counts_lm_rows():
    df = _frame(_gemm_records() + _step_records(TRUE) + _lm_step_records())
    mode, cals = pj.calibrations(df)
    val = cb.validate(df, cals[0])
    table = cb.validation_table(val)
    lm = table[table["workload"] == "lm"].set_index(["shape", "recipe"])
    assert len(lm) == 4 and len(table) == 2 * len(FIT_SHAPES) + 4
    assert lm.loc[("lm-20m b64", "fp8-current"), "measured"] == pytest.approx(1.25)
    assert lm.loc[("lm-120m b32", "fp8-delayed"), "measured"] == pytest.approx(1.5)
    assert lm.loc[("lm-120m b32", "fp8-delayed"), "fp8_minus_bf16_measured_ms"] == \
        pytest.approx(200.0 - 300.0)
    mlp = table[table["workload"] == "mlp"]
    assert set(mlp["shape"]) == {f"{b}x{w}x{d}" for b, w, d in FIT_SHAPES}


def test_validation_table_does_not_carry_the_calibrations_last_bits():
    # The fit's last bits differ between CPUs (BLAS, instruction sets); a table (and the
    # figure drawn from it) must not: nudging every number by a relative 1e-12 changes nothing.
    df = _frame(_gemm_records() + _step_records(TRUE) + _lm_step_records())
    mode, cals = pj.calibrations(df)
    val = cb.validate(df, cals[0])
    nudged = val.copy()
    for col in ("predicted_speedup", "measured_speedup", "error", "measured_ms",
                "bf16_measured_ms", "predicted_ms", "bf16_predicted_ms"):
        nudged[col] = nudged[col] * (1 + 1e-12)
    a, b = cb.validation_table(val), cb.validation_table(nudged)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert a["measured"].round(4).equals(a["measured"])


def test_the_tables_are_what_the_b2_verdict_reads():
    # The decision itself is tested on hand-made tables (tests/test_verdicts.py); here, that
    # the package's tables carry the columns it reads.
    df = _frame(_gemm_records() + _step_records(TRUE) + _lm_step_records())
    mode, cals = pj.calibrations(df)
    val = cb.validation_table(cb.validate(df, cals[0]))
    v = verdicts.b2(pj.projections(mode, cals), pj.measured_fp4_speedups(df), val)
    assert v.verdict == "projected" and v.hardware == "h200 -> gb200/gb300 (projection)"
    assert "n/a" not in v.key_number and "(published 1.73x)" in v.key_number
    assert f"/{len(val)} measured shapes ({2 * len(FIT_SHAPES)} MLP, 4 LM" in v.note
    mode, cals = pj.calibrations(pd.DataFrame())
    v = verdicts.b2(pj.projections(mode, cals))
    assert v.hardware.startswith("datasheet ->") and "NOT validated" in v.note


def test_bf16_and_fp16_samples_of_a_shape_are_pooled_to_the_faster():
    # Same tensor-core peak: a shape's slower 16-bit sample is treated as an outlier.
    def rec(fmt, m, k, n, tflops):
        return results.make_record("gemm", "tflops", tflops, "TFLOP/s", recipe=fmt,
                                   sizes={"M": m, "K": k, "N": n}, hardware=H200)
    df = _frame([rec("bf16", 65536, 2048, 2048, 476.0), rec("fp16", 65536, 2048, 2048, 586.0),
                 rec("bf16", 8192, 8192, 8192, 700.0), rec("fp16", 8192, 8192, 8192, 650.0),
                 rec("bf16", 4096, 1024, 1024, 300.0), rec("fp8", 65536, 2048, 2048, 900.0)])
    table = measured.RateTable.from_records(df, H200)
    for fmt in ("bf16", "fp16"):
        assert table.measured_rate(65536, 2048, 2048, fmt, H200) == pytest.approx(586.0)
        assert table.measured_rate(8192, 8192, 8192, fmt, H200) == pytest.approx(700.0)
    assert table.measured_rate(4096, 1024, 1024, "bf16", H200) == pytest.approx(300.0)
    assert table.measured_rate(65536, 2048, 2048, "fp8", H200) == pytest.approx(900.0)


def test_gap_measured_from_bf16_traces_is_not_fitted():
    """kernel_times records (repro.experiments.kernel_times.measure) give the idle gap of BF16
    steps: (step time - busy time) / launches. Hand-made: gaps of 0.2, 0.3, 0.5 ms over 50,
    100, 100 kernels are 4, 3, 5 us per kernel; over the 8 GEMM launches of a 3-layer MLP step
    (3 forward, 3 weight gradients, 2 data gradients: the first layer's is dropped) 25, 37.5,
    62.5 us. The median is used and not fitted. FP8 and emulated traces (the validation side)
    are ignored."""
    steps = _step_records(TRUE)
    step_ms = {(r["sizes"]["batch"], r["sizes"]["width"], r["sizes"]["depth"]): r["value"]
               for r in steps if r["recipe"] == "bf16"}
    traces = []

    def trace(b, w, d, recipe, gap_ms, kernels, emulated=False):
        sizes = {"workload": "mlp", "batch": b, "width": w, "depth": d}
        for metric, value in (("kernel_ms_per_step", step_ms[(b, w, d)] - gap_ms),
                              ("kernels_per_step", kernels)):
            traces.append(results.make_record(measured.KERNEL_TIMES, metric, value, "ms",
                                              recipe=recipe, sizes=sizes, hardware=H200,
                                              emulated=emulated))

    trace(65536, 256, 3, "bf16", 0.2, 50)
    trace(65536, 1024, 3, "bf16", 0.3, 100)
    trace(65536, 4096, 3, "bf16", 0.5, 100)
    trace(4096, 1024, 2, "fp8-delayed", 5.0, 10)  # validation side: ignored
    trace(1024, 128, 2, "bf16", 0.9, 10, emulated=True)  # ignored
    df = _frame(_gemm_records() + steps + traces)
    lat = cb.traced_gaps(df, "h200", per="kernel").sort_values("width")
    assert lat["gap_us"].tolist() == pytest.approx([4.0, 3.0, 5.0])
    lat = cb.traced_gaps(df, "h200").sort_values("width")
    assert lat["launches"].tolist() == [8, 8, 8]
    assert lat["gap_us"].tolist() == pytest.approx([25.0, 37.5, 62.5])
    for per, median in (("kernel", 4.0), ("gemm", 37.5)):
        cal = cb.calibrate(df, "h200", gap_per=per)
        assert cal.params.gap_us == pytest.approx(median) and cal.params.gap_per == per
        assert "gap_us" not in cal.fitted and len(cal.fitted) == 3
    src = {r.parameter: (r.source, r.unit) for r in cb.parameter_table(cal).itertuples()}
    assert src["gap_us"][0].startswith("kernel traces (3") and src["gap_us"][1] == "us"
    assert src["bw_eff"] == ("fit", "1") and "gap_per" not in src
    # without traces it is fitted, as before
    assert "gap_us" in cb.calibrate(_frame(_gemm_records() + steps), "h200").fitted


def test_traced_gemm_device_time_replaces_the_sweep_estimate():
    """kernelprof's GEMM-kernel time of a sweep shape (no call overhead) is the shape's time;
    shapes without a trace keep sweep - overhead; traces of steps, emulated traces and other
    chips are ignored. Hand values: 20 us traced at 65536x256x256 (its roofline on the H200
    is ~14 us: the bytes)."""
    def rec(value_ms, fmt="bf16", workload="gemm", emulated=False, info=H200):
        return results.make_record(measured.KERNEL_TIMES, "gemm_ms_per_step", value_ms, "ms",
                                   recipe=fmt, hardware=info, emulated=emulated,
                                   sizes={"workload": workload, "M": 65536, "K": 256, "N": 256})

    base = _gemm_records()
    plain = measured.RateTable.from_records(_frame(base), H200)
    g, other = cost.Gemm(65536, 256, 256), cost.Gemm(65536, 4096, 4096)
    t_plain, exact = plain.measured_time(g, H200)
    assert exact and t_plain == pytest.approx(max(_true_time(65536, 256, 256, "bf16")
                                                  - plain.overhead_s["bf16"],
                                                  measured.roofline_s(g, H200)))
    noise = [rec(0.5, workload="mlp"), rec(0.001, emulated=True),
             rec(0.001, info=hw.lookup("b200"))]
    assert measured.RateTable.from_records(_frame(base + noise), H200).measured_time(
        g, H200) == (t_plain, True)
    table = measured.RateTable.from_records(_frame(base + noise + [rec(0.020), rec(0.030)]), H200)
    assert table.traced == {"bf16": {(65536, 256, 256): pytest.approx(25e-6)}}  # the median
    assert table.measured_time(g, H200) == (pytest.approx(25e-6), True)
    assert table.overhead_s == plain.overhead_s
    assert table.measured_time(other, H200) == plain.measured_time(other, H200)
    assert table.measured_time(cost.Gemm(65536, 256, 256, fmt="fp8"), H200, "fp8") == \
        plain.measured_time(cost.Gemm(65536, 256, 256, fmt="fp8"), H200, "fp8")


def test_component_table_sets_traced_parts_beside_predicted_ones():
    """Hand-made traces of two shapes: a BF16 step at 65536x256x3 whose 40 kernels were busy
    0.30 ms (0.12 of it GEMM, 0.03 attention-class) and an FP8 one at 65536x4096x3 busier
    (step + 0.5 ms) than it is long. Traced parts: gemm 0.15, other 0.15, gaps step - 0.30;
    the FP8 gap is -0.5. A trace without a step time, and an emulated trace, give no row."""
    steps = _step_records(TRUE)
    step_ms = {(r["sizes"]["width"], r["recipe"]): r["value"] for r in steps
               if r["sizes"]["batch"] == 65536}
    traces = []

    def trace(w, recipe, metrics, emulated=False, batch=65536):
        sizes = {"workload": "mlp", "batch": batch, "width": w, "depth": 3}
        traces.extend(results.make_record(measured.KERNEL_TIMES, k, v, "ms", recipe=recipe,
                                          sizes=sizes, hardware=H200, emulated=emulated)
                      for k, v in metrics.items())

    trace(256, "bf16", {"kernel_ms_per_step": 0.30, "gemm_ms_per_step": 0.12,
                        "attention_ms_per_step": 0.03, "kernels_per_step": 40})
    busy = step_ms[(4096, "fp8-delayed")] + 0.5
    trace(4096, "fp8-delayed", {"kernel_ms_per_step": busy, "gemm_ms_per_step": 0.6 * busy,
                                "kernels_per_step": 120})
    trace(512, "bf16", {"kernel_ms_per_step": 0.2, "kernels_per_step": 10})  # no step time
    trace(1024, "bf16", {"kernel_ms_per_step": 0.2, "kernels_per_step": 10}, emulated=True)
    df = _frame(_gemm_records() + steps + traces)
    cal = cb.calibrate(df, "h200")
    t = cb.component_table(df, cal).set_index(["shape", "recipe"])
    assert sorted(t.index) == [("65536x256x3", "bf16"), ("65536x4096x3", "fp8-delayed")]
    b = t.loc[("65536x256x3", "bf16")]
    assert (b.gemm_traced, b.other_traced) == (pytest.approx(0.15), pytest.approx(0.15))
    assert b.gaps_traced == pytest.approx(step_ms[(256, "bf16")] - 0.30)
    assert b.kernels_traced == 40
    f = t.loc[("65536x4096x3", "fp8-delayed")]
    assert f.gaps_traced == pytest.approx(-0.5)
    assert f.other_traced == pytest.approx(0.4 * busy)
    # the predicted parts are the model's whole step
    for r in (b, f):
        assert r.gemm_pred + r.other_pred + r.gaps_pred == pytest.approx(
            r.measured_ms, rel=0.05)  # hand-made steps are TRUE's predictions, TRUE refitted
    assert cb.component_table(_frame(_gemm_records() + steps), cal).empty


# -------------------------------------------------- the validation figure on any machine

DRAW = """
import hashlib, io, json
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from repro import perfmodel

measured = perfmodel.measured_records()  # the committed records: fixed inputs
mode, cals = perfmodel.calibrations(measured)
val = perfmodel.validation_table(pd.concat([perfmodel.validate(measured, c) for c in cals]))
fig, ax = plt.subplots(figsize=(6.2, 5.4))
perfmodel.draw_validation(ax, val)
drawn = [np.asarray(a.get_offsets()).tolist() for a in ax.collections[1:]]
drawn += [ax.collections[0].get_paths()[0].vertices.tolist()]  # the +-10% band
drawn += [line.get_xydata().tolist() for line in ax.lines]
drawn += [list(t.xy) for t in ax.texts] + [list(ax.get_xlim()), list(ax.get_ylim())]
png = io.BytesIO()
fig.savefig(png, format="png", dpi=60, metadata={"Software": None})
print(json.dumps({"rows": len(val), "drawn": drawn, "title": ax.get_title(),
                  "png": hashlib.sha256(png.getvalue()).hexdigest()}))
"""


@pytest.mark.slow
def test_the_validation_figure_draws_the_same_numbers_under_other_thread_settings():
    """The fit behind notebook 06's validation figure is least squares, whose last bits
    depend on the BLAS and its threads (a PNG that differed between two CPUs by 1/255 along
    its diagonal); every number the figure draws is rounded to what is shown (the table's 4
    decimals, or 4 significant digits), so two BLAS/XLA thread settings give the same
    numbers and the same PNG bytes."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    runs = []
    for threads, eigen in (("1", "false"), ("2", "true")):
        env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu",
               "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads,
               "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={eigen}"}
        p = subprocess.run([sys.executable, "-c", DRAW], env=env, capture_output=True,
                           text=True, timeout=300, cwd=root)
        assert p.returncode == 0, p.stderr
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0]["rows"] > 0  # the committed records have FP8 steps to validate
    assert runs[0] == runs[1]
    numbers = [v for item in runs[0]["drawn"] for v in pd.core.common.flatten(item)]
    assert numbers and all(v == round(v, 4) or v == cb.significant(v) for v in numbers)


def test_significant_rounds_through_the_decimal_text():
    assert cb.significant(0.8 * 1.2345) == 0.9876
    assert cb.significant(123456.0) == 123500.0
    assert cb.significant([1.23456, 2.0]).tolist() == [1.235, 2.0]
