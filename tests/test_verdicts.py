"""Every claim's decision rule (repro.claims.verdicts) on small hand-made tables: each test
builds the table a rule reads, with numbers chosen on either side of its thresholds, and checks
the verdict the rule's definition gives by hand, for every outcome of every rule."""

import math

import numpy as np
import pandas as pd
import pytest

from repro.claims import verdicts as V
from repro.verdict import rule as rule_of
from repro.experiments.inference import tables as A
from repro.experiments.legged import rules as legged_rules
from repro.experiments.rl_quality import rules as quality_rules

# ------------------------------------------------------------------------------ helpers


def sp_rows(*rows, **defaults):
    """A ``repro.analysis.rl.speedups`` table: each row a dict over the defaults."""
    base = dict(hardware="h200", network="mlp", width=4096, num_envs=2048, recipe="fp8-delayed",
                baseline="fp16", e2e=1.0, update=1.0, memory=1.0, emulated=False,
                same_commit=True)
    base.update(defaults)
    return pd.DataFrame([{**base, **r} for r in rows])


def poi(**pairs):
    """A probability-of-improvement table from ``{"x__y": (p, lo, hi)}``."""
    rows = [{"x": k.split("__")[0].replace("_", "-"), "y": k.split("__")[1].replace("_", "-"),
             "p": p, "lo": lo, "hi": hi} for k, (p, lo, hi) in pairs.items()]
    return pd.DataFrame(rows, columns=["x", "y", "p", "lo", "hi"])


BETTER, SAME, WORSE = (0.7, 0.6, 0.8), (0.5, 0.4, 0.6), (0.3, 0.2, 0.4)
# against the parity margin [0.4, 0.6]: kept (lo >= 0.4), lost (hi < 0.4), straddling 0.4
KEPT, LOST, WIDE = (0.5, 0.42, 0.58), (0.3, 0.2, 0.35), (0.45, 0.3, 0.6)
FULL = V.QualityEvidence("h200", "full", ("a", "b", "c"), 16, 5)


def test_verdict_rejects_words_outside_the_vocabulary():
    with pytest.raises(ValueError, match="valid: reproduced, partly"):
        V.Verdict("A1", "great")
    assert V.Verdict("A1", "inconclusive").to_dict()["verdict"] == "inconclusive"


# ------------------------------------------------------------------------------ A1-A4, A9


@pytest.mark.parametrize("stores,verdict", [(4, "reproduced"), (3, "partly"), (2, "partly"),
                                            (1, "contradicted")])
def test_a1_counts_the_fp8_stores_of_the_judged_variant(stores, verdict):
    t = pd.DataFrame({"variant": ["fp32", "fp8-e2e", "x"], "stores": [0, stores, 4],
                      "hardware": ["h200"] * 3, "profile": ["full"] * 3})
    v = V.a1(t)  # A1's rule judges fp8-e2e: another variant's stores do not count
    assert v.verdict == verdict and f"at most {stores} of 4" in v.key_number
    assert "variant fp8-e2e" in v.key_number and v.hardware == "h200"


def test_a1_without_records():
    assert V.a1(pd.DataFrame(columns=["variant", "stores", "hardware"])).verdict == \
        "not yet measured"


@pytest.mark.parametrize("e2e,update,verdict", [
    (1.61, 1.0, "reproduced"),     # whole loop >= 1.6x somewhere
    (1.05, 1.7, "partly"),         # only the update alone reaches 1.6x
    (1.2, 1.3, "partly"),          # faster (>= 1.1x) but below 1.6x
    (1.05, 1.2, "contradicted"),   # never 1.1x end to end, update below 1.6x
])
def test_a2_thresholds(e2e, update, verdict):
    v = V.a2(sp_rows({"e2e": e2e, "update": update}, {"width": 64, "e2e": 0.5, "update": 0.5}))
    assert v.verdict == verdict and v.hardware == "h200"
    assert f"up to {e2e:.2f}x (width 4096, 2048 envs)" in v.key_number


def test_a2_ignores_emulated_cross_call_bf16_and_cnn_ratios():
    ignored = sp_rows({"emulated": True, "e2e": 2.0}, {"same_commit": False, "e2e": 2.0},
                      {"baseline": "bf16", "e2e": 2.0}, {"network": "cnn", "e2e": 2.0})
    assert V.a2(ignored).verdict == "not yet measured"
    assert V.a2(pd.DataFrame()).verdict == "not yet measured"
    v = V.a2(pd.concat([ignored, sp_rows({"e2e": 1.0})]))
    assert v.verdict == "contradicted" and "up to 1.00x" in v.key_number


def test_a2_the_best_hardware_decides_and_widths_are_named():
    v = V.a2(sp_rows({"e2e": 1.7}, {"hardware": "b200", "e2e": 1.2}))
    assert v.verdict == "reproduced" and v.hardware == "b200, h200"
    assert "h200: FP8/FP16 whole loop up to 1.70x" in v.key_number
    assert ">= 1.6x end to end at widths [4096]" in v.key_number


def test_a3_is_a_projection_with_or_without_measured_ratios():
    proj = sp_rows({"e2e": 1.5, "lo": 1.5 * 2, "hi": 1.5 * 3}, {"width": 64, "lo": 1, "hi": 2})
    v = V.a3(proj, 2.0, 3.0, 6.0)
    assert v.verdict == "projected"
    assert v.key_number.startswith("projected 3.0-4.5x at width 4096 (h200 FP8/FP16 1.50x")
    assert v.hardware == "h200 -> a100-sxm (datasheet)"
    v = V.a3(proj.iloc[:0], 2.0, 3.0, 6.0)
    assert v.verdict == "projected" and "2.00x (bandwidth) to 6.00x" in v.key_number


def mem_rows(fp8, fp16=100.0, emulated=False, hardware="h200", lean=None, base="fp16"):
    rows = [(4096, "fp8-delayed", fp8, emulated), (4096, base, fp16, False),
            (64, "fp8-delayed", 1.0, emulated), (64, base, 100.0, False)]
    rows += [] if lean is None else [(4096, "fp8-lean", lean, emulated)]
    return pd.DataFrame([{"hardware": hardware, "network": "mlp", "width": w, "num_envs": 2048,
                          "recipe": r, "update_memory_bytes": m, "emulated": e}
                         for w, r, m, e in rows])


@pytest.mark.parametrize("fp8,verdict", [(90.0, "reproduced"), (95.0, "partly"),
                                         (100.0, "contradicted"), (135.0, "contradicted")])
def test_a4_memory_ratio_at_the_widest_mlp(fp8, verdict):
    v = V.a4(mem_rows(fp8))
    assert v.verdict == verdict
    assert v.key_number == f"h200: update memory FP8/FP16 = {fp8 / 100:.2f} at width 4096"


def test_a4_the_default_recipe_decides_and_the_leaner_one_is_shown():
    """A4 does not say "up to": fp8-delayed decides, fp8-lean is named beside it."""
    v = V.a4(mem_rows(102.0, lean=98.0))
    assert v.verdict == "contradicted"
    assert v.key_number == ("h200: update memory FP8/FP16 = 1.02 at width 4096 "
                            "(fp8-delayed; fp8-lean 0.98 not judged)")
    assert v.numbers == {"h200": {"update_memory_fp8-delayed_fp16": 1.02,
                                  "update_memory_fp8-lean_fp16": 0.98}}
    # a rule that takes the leaner of the two (A4's rule from its lean records on)
    leanest = {**V.rule("A4"), "recipes": ["fp8-delayed", "fp8-lean"], "shown": [],
               "combine": "leanest"}
    v = V.a4(mem_rows(102.0, lean=98.0), rule=leanest)
    assert v.verdict == "partly" and v.key_number == (
        "h200: update memory FP8/FP16 = 0.98 at width 4096 (fp8-lean; fp8-delayed 1.02)")
    v = V.a4(mem_rows(97.0, lean=99.0), rule=leanest)  # the default may be the leaner one
    assert v.verdict == "partly" and "= 0.97 at width 4096 (fp8-delayed; fp8-lean 0.99)" in \
        v.key_number


def test_a4_reads_bf16_where_fp16_has_no_record():
    v = V.a4(mem_rows(90.0, base="bf16"))
    assert v.verdict == "reproduced" and "FP8/BF16 = 0.90" in v.key_number
    both = pd.concat([mem_rows(90.0, base="bf16"), mem_rows(90.0, fp16=50.0).iloc[[1]]])
    assert "FP8/FP16 = 1.80" in V.a4(both).key_number  # FP16 first where it is there


def test_a4_emulated_or_missing_is_not_measured():
    v = V.a4(mem_rows(50.0, emulated=True, hardware="cpu"))
    assert v.verdict == "not yet measured" and "emulated: FP8/FP16 = 0.50 on cpu" in v.key_number
    assert V.a4(pd.DataFrame()).verdict == "not yet measured"


@pytest.mark.parametrize("mlp,cnn,verdict", [(1.2, 1.1, "reproduced"), (1.2, 0.8, "partly"),
                                             (0.9, 0.8, "contradicted"), (1.1, None, "partly")])
def test_a9_best_ratio_of_mlps_and_cnns(mlp, cnn, verdict):
    rows = [{"e2e": mlp}] + ([{"network": "cnn-large", "e2e": cnn}] if cnn else [])
    v = V.a9(sp_rows(*rows, baseline="bf16"))
    assert v.verdict == verdict and f"mlp: {mlp:.2f}x" in v.key_number
    assert ("CNN speed not measured" in v.key_number) == (cnn is None)


def test_a9_without_native_ratios():
    assert V.a9(sp_rows({"e2e": 2.0, "emulated": True}, baseline="bf16")).verdict == \
        "not yet measured"


# ------------------------------------------------------------------------ A5-A8, A10


@pytest.mark.parametrize("vs_fp32,vs_noscale,verdict,word", [
    (KEPT, BETTER, "reproduced", "kept"), (BETTER, BETTER, "reproduced", "kept"),
    (KEPT, SAME, "partly", "kept"), (LOST, BETTER, "partly", "lost"),
    (LOST, SAME, "contradicted", "lost"), (WIDE, BETTER, "inconclusive", "inconclusive"),
    (WIDE, SAME, "contradicted", "inconclusive")])
def test_a5_scaled_fp8_keeps_fp32_quality_and_beats_unscaled(vs_fp32, vs_noscale, verdict,
                                                              word):
    v = V.a5(poi(fp8_delayed__fp32=vs_fp32, fp8_delayed__fp8_noscale=vs_noscale), FULL)
    assert v.verdict == verdict
    assert v.key_number.startswith(f"P(fp8-delayed>fp32)={vs_fp32[0]:.2f} "
                                   f"[{vs_fp32[1]:.2f},{vs_fp32[2]:.2f}] vs margin "
                                   f"[0.40,0.60]: {word};")
    assert "fp8-current vs fp8-noscale: not run" in v.key_number


def test_parity_margins_come_from_the_claims_definitions():
    assert V.margin("A5") == V.margin("A6") == V.margin("A10") == (0.4, 0.6)
    assert V.margin("B4") == (-0.015, 0.015)
    with pytest.raises(ValueError, match="A2.*claims with one: A5, A6, A10, A11, A12, B4, B6, C2"):
        V.margin("A2")
    # a margin given explicitly replaces the definition's
    assert V.a6(poi(fp8_delayed__fp32=KEPT), FULL, bounds=(0.45, 0.55)).verdict == \
        "inconclusive"


def test_the_share_of_tied_scores_is_counted_and_reported():
    from repro.analysis import stats

    x = np.array([[1.0, 500.0], [2.0, 500.0]])
    y = np.array([[1.0, 500.0], [3.0, 500.0]])
    # env 0: 1 of 4 pairs tied; env 1: all 4 tied -> (0.25 + 1) / 2
    assert stats._ties(x, y) == pytest.approx(0.625)
    table = poi(fp8_delayed__fp32=KEPT).assign(ties=0.2)
    assert "(20% of its weight tied at 0.5)" in V.a6(table, FULL).key_number
    assert "tied" not in V.a6(table.assign(ties=0.0), FULL).key_number


def test_quality_rules_need_full_records_and_three_environments():
    table = poi(fp8_delayed__fp32=KEPT, fp8_delayed__fp8_noscale=BETTER)
    smoke = V.QualityEvidence("cpu", "smoke", ("CartPole-v1",), 3, 5)
    v = V.a5(table, smoke)
    assert v.verdict == "not yet measured"
    assert v.key_number.startswith("smoke only (reproduced on 3 seeds, CartPole-v1)")
    two = V.QualityEvidence("h200", "full", ("a", "b"), 16, 5)
    v = V.a5(table, two)
    assert v.verdict == "partly" and "reproduced on 2 of 5 planned environments" in v.key_number
    assert V.a5(poi(), FULL).verdict == "not yet measured"


@pytest.mark.parametrize("vs_fp32,verdict", [(KEPT, "reproduced"), (BETTER, "reproduced"),
                                             (LOST, "contradicted"), (WIDE, "inconclusive"),
                                             (None, "not yet measured")])
def test_a6_fp8_compute_keeps_fp32_quality_within_the_margin(vs_fp32, verdict):
    table = poi(fp8_delayed__fp32=vs_fp32) if vs_fp32 else poi()
    assert V.a6(table, FULL).verdict == verdict


@pytest.mark.parametrize("fp8_kahan,bf16_kahan,e2e_vs_fp32,verdict", [
    (BETTER, SAME, SAME, "reproduced"), (SAME, BETTER, WORSE, "partly"),
    (SAME, SAME, SAME, "contradicted"), (None, None, SAME, "not yet measured")])
def test_a7_kahan_helps_and_fp8_e2e_keeps_quality(fp8_kahan, bf16_kahan, e2e_vs_fp32,
                                                  verdict):
    pairs = {"fp8_e2e__fp32": e2e_vs_fp32}
    if fp8_kahan:
        pairs["fp8_e2e__fp8_e2e_nokahan"] = fp8_kahan
    if bf16_kahan:
        pairs["bf16w_kahan__bf16w_nokahan"] = bf16_kahan
    assert V.a7(poi(**pairs), FULL).verdict == verdict


@pytest.mark.parametrize("nograd,noweight,verdict", [
    (BETTER, BETTER, "reproduced"), (BETTER, SAME, "partly"), (SAME, WORSE, "contradicted")])
def test_a8_removing_either_clip_hurts(nograd, noweight, verdict):
    diverged = {"fp8-e2e-nogradclip": 2, "fp8-e2e-noweightclip": 1, "fp32": 0}
    v = V.a8(poi(fp8_e2e__fp8_e2e_nogradclip=nograd, fp8_e2e__fp8_e2e_noweightclip=noweight),
             FULL, diverged)
    assert v.verdict == verdict
    assert "diverged seeds: fp8-e2e-nogradclip 2, fp8-e2e-noweightclip 1" in v.key_number
    assert V.a8(poi(), FULL, {}).verdict == "not yet measured"


def test_a8_without_divergence_clipping_had_nothing_to_prevent():
    table = poi(fp8_e2e__fp8_e2e_nogradclip=SAME, fp8_e2e__fp8_e2e_noweightclip=WORSE)
    v = V.a8(table, FULL, {"fp32": 0})
    assert v.verdict == "inconclusive" and "diverged seeds: none" in v.key_number
    assert "no seed diverged in fp8-e2e or fp8-e2e-nogradclip" in v.key_number
    # divergence in one arm decides that part: here weight clipping does not help
    assert V.a8(table, FULL, {"fp8-e2e-noweightclip": 3}).verdict == "contradicted"


def repeats(identical=True, variants=("fp8-e2e",)):
    return pd.DataFrame([{"hardware": "h200", "env": "CartPole-v1", "variant": v, "seeds": 16,
                          "identical": identical} for v in variants])


@pytest.mark.parametrize("quality,same_seed,rep,verdict", [
    (KEPT, True, repeats(), "reproduced"), (KEPT, False, repeats(), "partly"),
    (KEPT, True, repeats(identical=False), "partly"), (LOST, True, repeats(), "partly"),
    (WIDE, True, repeats(), "inconclusive"), (LOST, False, repeats().iloc[:0], "contradicted"),
    (None, None, repeats().iloc[:0], "not yet measured")])
def test_a10_quality_and_bitwise_determinism(quality, same_seed, rep, verdict):
    table = poi(fp8_delayed__fp32=quality, fp8_delayed__bf16=KEPT) if quality else poi()
    v = V.a10(table, FULL, same_seed, rep)
    assert v.verdict == verdict
    if len(rep):
        assert "across processes for 1 cells x 16 seeds: fp8-e2e)" in v.key_number
        assert "FP8 not checked across processes" not in v.key_number


def test_a10_says_when_fp8_was_not_checked_across_processes():
    table = poi(fp8_delayed__fp32=KEPT, fp8_delayed__bf16=KEPT)
    v = V.a10(table, FULL, True, repeats(variants=("bf16", "fp16", "fp32")))
    assert v.verdict == "reproduced"
    assert v.key_number.endswith("across processes for 3 cells x 16 seeds: bf16, fp16, fp32); "
                                 "FP8 not checked across processes")


# ------------------------------------------------------------------------------------ A11


def legged_ups(e2e_by_width, hardware="h200", emulated=False, same_commit=True, env="ant"):
    """A ``repro.experiments.legged.tables.speedups`` table: fp8-delayed over BF16 per width
    (the update alone twice as fast as the loop, physics a quarter of the BF16 loop)."""
    return pd.DataFrame([{"hardware": hardware, "env": env, "size": f"w{w}", "width": w,
                          "recipe": "fp8-delayed", "e2e": e, "update": 2 * e,
                          "physics_share": 0.25, "emulated": emulated,
                          "same_commit": same_commit} for w, e in e2e_by_width.items()])


def legged_quality(intervals, n=8, hardware="h200"):
    """A ``repro.experiments.legged.tables.quality_table``: P(fp8-delayed > fp32) (p, lo, hi)
    per width."""
    return pd.DataFrame([{"hardware": hardware, "width": w, "recipe": "fp8-delayed",
                          "n_seeds": n, "poi": p, "poi_lo": lo, "poi_hi": hi}
                         for w, (p, lo, hi) in intervals.items()])


FAST = {256: 1.15, 2048: 1.2}               # pays at the standard (narrowest) size
CROSS = {256: 0.9, 2048: 1.2, 4096: 1.5}     # pays from 2048 on
SLOW = {256: 0.9, 2048: 1.08}                # never >= 1.1x


@pytest.mark.parametrize("speed,quality,verdict", [
    (FAST, {256: KEPT}, "reproduced"), (FAST, {256: BETTER, 2048: KEPT}, "reproduced"),
    (FAST, {256: KEPT, 2048: WIDE}, "inconclusive"), (FAST, {256: LOST}, "partly"),
    (FAST, {256: WIDE, 2048: LOST}, "partly"), (FAST, {}, "partly"),
    (CROSS, {256: KEPT, 2048: KEPT}, "partly"), (CROSS, {256: WIDE}, "partly"),
    (SLOW, {256: KEPT}, "contradicted"), (SLOW, {256: LOST}, "contradicted")])
def test_a11_fp8_pays_at_the_standard_size_and_keeps_quality(speed, quality, verdict):
    v = V.a11(legged_ups(speed), legged_quality(quality))
    assert (v.verdict, v.hardware, v.emulated) == (verdict, "h200", False)
    assert v.key_number.startswith("fp8-delayed/BF16 whole PPO loop on ant (MJX physics): "
                                   f"{speed[256]:.2f}x at w256 (width 256; update alone "
                                   f"{2 * speed[256]:.2f}x; physics 25% of the BF16 loop)")
    assert v.source.startswith("results/h200/legged")


def test_a11_says_the_physics_share_is_not_measured_without_a_physics_record():
    ups = legged_ups(FAST)
    ups.loc[ups.width == 256, "physics_share"] = float("nan")
    key = V.a11(ups, legged_quality({256: KEPT})).key_number
    assert f"{FAST[256]:.2f}x at w256 (width 256; update alone {2 * FAST[256]:.2f}x; physics " \
        "share not measured)" in key
    assert "nan" not in key and "physics 25% of the BF16 loop" in key


def test_a11_key_number_names_the_crossover_and_each_interval():
    v = V.a11(legged_ups(CROSS), legged_quality({2048: KEPT, 256: LOST}))
    assert "; FP8 pays from width 2048 on; quality vs FP32 width 256: " \
        "P(fp8-delayed>fp32)=0.30 [0.20,0.35] vs margin [0.40,0.60]: lost, width 2048: " \
        "P(fp8-delayed>fp32)=0.50 [0.42,0.58] vs margin [0.40,0.60]: kept" in v.key_number
    assert "FP8 does not pay up to width 2048" in V.a11(legged_ups(SLOW), pd.DataFrame()).key_number


def test_a11_shows_fp8_against_bf16_beside_the_judged_interval():
    """Where the quality table has P(fp8-delayed > bf16) the text gives it, unjudged: it
    changes no verdict (the margin is against FP32)."""
    q = legged_quality({256: WIDE}).assign(poi_bf16=0.47, poi_bf16_lo=0.33, poi_bf16_hi=0.61)
    v = V.a11(legged_ups(FAST), q)
    assert "P(fp8-delayed>bf16)=0.47 [0.33,0.61] (not judged)" in v.key_number
    assert v.verdict == V.a11(legged_ups(FAST), legged_quality({256: WIDE})).verdict \
        == "inconclusive"
    assert "bf16)=" not in V.a11(legged_ups(FAST), legged_quality({256: WIDE})).key_number
    assert "FP8 pays from width 256 on" in V.a11(legged_ups(FAST), pd.DataFrame()).key_number
    # a gap resets the crossover: paying at 256 and 4096 but not 1024 pays from 4096 on
    assert legged_rules.crossover({256: True, 1024: False, 4096: True}) == 4096
    assert legged_rules.crossover({256: True, 1024: False}) is None


def test_a11_shows_the_fp32_critic_variant_beside_the_judged_recipe_without_judging_it():
    q = legged_quality({256: WIDE})
    critic = legged_quality({256: KEPT, 2048: KEPT}, n=32).assign(
        recipe="fp8-delayed+critic-fp32")
    few = legged_quality({256: KEPT}, n=4).assign(recipe="fp8-delayed+critic-bf16")
    v = V.a11(legged_ups(FAST), pd.concat([q, critic, few]))
    assert v.verdict == V.a11(legged_ups(FAST), q).verdict == "inconclusive"
    assert ("P(fp8-delayed>fp32)=0.45 [0.30,0.60] vs margin [0.40,0.60]: inconclusive; "
            "P(fp8-delayed+critic-fp32>fp32)=0.50 [0.42,0.58] over 32 seeds (not judged)"
            in v.key_number)
    assert "critic-bf16" not in v.key_number  # fewer than 8 seeds
    assert v.key_number.count("critic-fp32") == 1  # width 2048 has no judged row


def test_a11_shows_variants_of_the_judged_recipe_after_the_critic_variant_unjudged():
    """A lever tried on the judged recipe's return (``fp8-delayed:field=value``) is shown
    after BF16 and the FP32-critic variant, with its seeds, and judges nothing; a variant of
    another recipe is not shown."""
    q = legged_quality({256: WIDE})
    e4m3 = legged_quality({256: LOST}, n=32).assign(
        recipe="fp8-delayed:bwd_dtype=float8_e4m3fn")
    other = legged_quality({256: KEPT}, n=32).assign(recipe="fp8-current:amax_history_len=16")
    critic = legged_quality({256: KEPT}, n=32).assign(recipe="fp8-delayed+critic-fp32")
    bf16 = legged_quality({256: KEPT}, n=32).assign(recipe="bf16")
    v = V.a11(legged_ups(FAST), pd.concat([q, e4m3, other, critic, bf16]))
    assert v.verdict == V.a11(legged_ups(FAST), q).verdict == "inconclusive"
    text = v.key_number
    assert ("P(fp8-delayed:bwd_dtype=float8_e4m3fn>fp32)=0.30 [0.20,0.35] over 32 seeds "
            "(not judged)") in text
    assert text.index("P(bf16>fp32)") < text.index("P(fp8-delayed+critic-fp32>fp32)") \
        < text.index("P(fp8-delayed:bwd_dtype")
    assert "fp8-current:" not in text


def test_peer_parity_reads_the_peer_by_a11s_margin_rule():
    """Ours against brax's trainer: kept where the interval's low end reaches the margin's,
    lost where its high end stays below it, inconclusive between."""
    row = lambda p, lo, hi: pd.Series({"poi": p, "poi_lo": lo, "poi_hi": hi})  # noqa: E731
    state, text = legged_rules.peer_parity(row(0.42, 0.12, 0.72))
    assert state == quality_rules.UNSURE
    assert text == "P(ours>brax)=0.42 [0.12,0.72] vs margin [0.40,0.60]: inconclusive"
    assert legged_rules.peer_parity(row(0.55, 0.45, 0.65))[0] is True
    assert legged_rules.peer_parity(row(0.2, 0.1, 0.35))[0] is False
    assert legged_rules.peer_parity(row(0.55, 0.45, 0.65), bounds=(0.5, 0.7))[0] == quality_rules.UNSURE


def test_a11_shows_bf16_against_fp32_first_and_never_judges_it():
    q = legged_quality({256: WIDE})
    bf16 = legged_quality({256: LOST, 2048: KEPT}, n=32).assign(recipe="bf16")
    critic = legged_quality({256: KEPT}, n=32).assign(recipe="fp8-delayed+critic-fp32")
    v = V.a11(legged_ups(FAST), pd.concat([q, critic, bf16]))
    assert v.verdict == "inconclusive"  # BF16 lost, but only FP8 is judged
    assert ("vs margin [0.40,0.60]: inconclusive; P(bf16>fp32)=0.30 [0.20,0.35] over 32 seeds "
            "(not judged); P(fp8-delayed+critic-fp32>fp32)=0.50" in v.key_number)
    few = legged_quality({256: KEPT}, n=4).assign(recipe="bf16")
    assert "bf16>fp32" not in V.a11(legged_ups(FAST), pd.concat([q, few])).key_number


def test_a11_says_by_how_much_each_recipe_shown_beside_differs_from_fp32():
    """The rows shown beside the judged one (BF16, the FP32-critic variant) also name their
    mean return against FP32's: whether an FP32 critic closes the gap is a question of how
    much, not only how often."""
    q = legged_quality({256: WIDE}, n=32).assign(mean_return=17.54)
    fp32 = pd.DataFrame([{"hardware": "h200", "width": 256, "recipe": "fp32", "n_seeds": 32,
                          "mean_return": 17.77}])
    critic = legged_quality({256: KEPT}, n=32).assign(recipe="fp8-delayed+critic-fp32",
                                                        mean_return=17.63)
    bf16 = legged_quality({256: KEPT}, n=32).assign(recipe="bf16", mean_return=17.77)
    text = V.a11(legged_ups(FAST), pd.concat([q, fp32, critic, bf16])).key_number
    assert ("P(bf16>fp32)=0.50 [0.42,0.58] over 32 seeds, mean return 17.77, FP32 17.77: +0.0% "
            "(not judged)") in text
    assert ("P(fp8-delayed+critic-fp32>fp32)=0.50 [0.42,0.58] over 32 seeds, mean return 17.63,"
            " FP32 17.77: -0.8% (not judged)") in text
    # without FP32's mean, or without the row's own, no means are named
    text = V.a11(legged_ups(FAST), pd.concat([q, critic.drop(columns="mean_return")])).key_number
    assert "over 32 seeds (not judged)" in text and "mean return" not in text


def test_a11_says_how_many_seeds_each_side_of_the_judged_comparison_pooled():
    """Cells may hold different seed counts (FP32 grown to 96, the recipe at 32): the text
    names both, and only where FP32's row is there to count."""
    q = legged_quality({256: WIDE}, n=32)
    fp32 = pd.DataFrame([{"hardware": "h200", "width": 256, "recipe": "fp32", "n_seeds": 96}])
    v = V.a11(legged_ups(FAST), pd.concat([q, fp32]))
    assert "vs margin [0.40,0.60]: inconclusive (32 seeds, FP32 96)" in v.key_number
    assert "FP32 96" not in V.a11(legged_ups(FAST), q).key_number


def test_a11_says_by_how_much_the_judged_recipe_differs_from_fp32():
    """P(recipe > FP32) says how often a seed of the recipe beats one of FP32, not by how
    much: the judged comparison also names both mean returns and their relative difference
    (none where FP32's mean is not positive)."""
    q = legged_quality({256: WIDE}, n=32).assign(mean_return=17.54)
    fp32 = pd.DataFrame([{"hardware": "h200", "width": 256, "recipe": "fp32", "n_seeds": 32,
                          "mean_return": 17.77}])
    text = V.a11(legged_ups(FAST), pd.concat([q, fp32])).key_number
    assert "(32 seeds, FP32 32; mean return 17.54, FP32 17.77: -1.3%)" in text
    text = V.a11(legged_ups(FAST), pd.concat([q, fp32.assign(mean_return=-2.0)])).key_number
    assert "(32 seeds, FP32 32; mean return 17.54, FP32 -2)" in text
    assert "mean return" not in V.a11(legged_ups(FAST), q).key_number


def test_a11_names_the_environment_of_each_width_and_judges_quality_per_environment():
    ups = pd.concat([legged_ups({256: 0.8, 1024: 1.15, 4096: 1.3}),
                     legged_ups({512: 0.9, 1024: 0.95}, env="Go1JoystickFlatTerrain")])
    quality = pd.concat([legged_quality({256: KEPT}).assign(env="ant"),
                         legged_quality({512: WIDE}).assign(env="Go1JoystickFlatTerrain")])
    v = V.a11(ups, quality)
    assert v.verdict == "partly"
    # at 1024 the median of ant's 1.15x and Go1's 0.95x, 1.05x, does not pay
    assert "FP8 pays from width 4096 on" in v.key_number
    assert v.key_number.startswith("fp8-delayed/BF16 whole PPO loop on Go1JoystickFlatTerrain,"
                                   " ant (MJX physics): 0.80x at ant w256 (width 256;")
    assert "0.90x at Go1JoystickFlatTerrain w512 (width 512;" in v.key_number
    assert "1.05x at Go1JoystickFlatTerrain/ant w1024 (width 1024;" in v.key_number
    assert ("quality vs FP32 ant width 256: P(fp8-delayed>fp32)=0.50 [0.42,0.58] vs margin "
            "[0.40,0.60]: kept, Go1JoystickFlatTerrain width 512: P(fp8-delayed>fp32)=0.45 "
            "[0.30,0.60]") in v.key_number
    # Go1's interval straddles the margin: undecided there, so not "reproduced" even if fast
    fast = pd.concat([legged_ups({256: 1.2}), legged_ups({512: 1.2},
                                                         env="Go1JoystickFlatTerrain")])
    assert V.a11(fast, quality).verdict == "inconclusive"


def test_a11_does_not_judge_quality_where_fp32_did_not_beat_the_random_policy():
    """Go1 where every recipe stayed at the random policy's return: P(FP8 > FP32) there
    compares noise, so that width is left out of the judgement and says why."""
    go1 = pd.DataFrame([{"hardware": "h200", "env": "Go1", "width": 512, "recipe": r,
                         "n_seeds": 16, "total_timesteps": 6_553_600, "poi": p, "poi_lo": lo,
                         "poi_hi": hi, "mean_return": m, "learned": False,
                         "random_return": 0.5}
                        for r, p, lo, hi, m in (("fp32", np.nan, np.nan, np.nan, 0.25),
                                                ("fp8-delayed", 0.1, 0.0, 0.2, 0.125))])
    ant = legged_quality({256: KEPT}).assign(env="ant", learned=True)
    v = V.a11(legged_ups(FAST), pd.concat([ant, go1]))
    # ant kept at the standard size, FAST pays there; Go1's LOST-looking interval is not judged
    assert v.verdict == "reproduced"
    assert ("Go1 width 512: not judged: FP32's mean return 0.25 did not beat the random "
            "policy's 0.5 (6.6M steps per seed)") in v.key_number
    assert "P(fp8-delayed>fp32)=0.10" not in v.key_number
    # nothing judged anywhere: as if quality were not measured
    assert V.a11(legged_ups(FAST), go1).verdict == "partly"


def test_a11_quality_needs_eight_seeds_and_the_margin_comes_from_the_definition():
    v = V.a11(legged_ups(FAST), legged_quality({256: KEPT}, n=4))
    assert v.verdict == "partly" and "quality not measured with >= 8 seeds" in v.key_number
    assert V.margin("A11") == (0.4, 0.6)
    # a narrower margin given explicitly: KEPT's interval [0.42, 0.58] straddles 0.45
    assert V.a11(legged_ups(FAST), legged_quality({256: KEPT}), bounds=(0.45, 0.55)).verdict \
        == "inconclusive"


def test_a11_counts_native_pairs_of_one_call_on_the_best_measured_gpu():
    for ups in (pd.DataFrame(), legged_ups(FAST, emulated=True),
                legged_ups(FAST, same_commit=False), legged_ups(FAST).assign(recipe="fp8-current")):
        v = V.a11(ups, legged_quality({256: KEPT}))
        assert v.verdict == "not yet measured" and v.hardware == ""
        assert v.key_number == "no native-FP8 fp8-delayed/BF16 pairs of the legged study on a GPU"
    # two GPUs: the one with more pairs decides, with its own quality rows
    ups = pd.concat([legged_ups(FAST), legged_ups({256: 0.5}, hardware="gh200")])
    quality = pd.concat([legged_quality({256: KEPT}),
                         legged_quality({256: LOST}, hardware="gh200")])
    v = V.a11(ups, quality)
    assert (v.verdict, v.hardware) == ("reproduced", "h200")
    # two environments at one width: the median of their ratios, (1.0 + 1.3) / 2 = 1.15 pays
    ups = pd.concat([legged_ups({256: 1.0}), legged_ups({256: 1.3}, env="humanoid")])
    v = V.a11(ups, legged_quality({256: KEPT}))
    assert v.verdict == "reproduced" and "on ant, humanoid (MJX physics): 1.15x at ant/humanoid w256" in \
        v.key_number


# --------------------------------------------------------------------------- B1-B5


def test_b1_every_check_must_pass_and_native_support_must_be_measured():
    ok = V.b1({"a": True, "b": True}, (0, 0), (128, 8), 0.0951, "cpu", False, native_fp4=True)
    assert ok.verdict == "reproduced"
    assert ok.key_number.startswith("0 bit mismatches in 128 E2M1 elements and 8 E4M3")
    assert "relative error 0.095" in ok.key_number and "(cpu): no" in ok.note
    half = V.b1({"a": True, "b": True}, (0, 0), (128, 8), 0.0951, "cpu", False)
    assert half.verdict == "partly"
    assert half.key_number.endswith("native Blackwell support not tested: no committed record "
                                    "ran NVFP4 GEMMs on FP4 tensor cores")
    bad = V.b1({"a": True, "b": False}, (3, 1), (128, 8), 0.1, "b200", True)
    assert bad.verdict == "contradicted" and bad.key_number.startswith("3 element and 1 block")
    assert "differs from the NVFP4 recipe: b." in bad.note and "(b200): yes" in bad.note


def projection(mode="calibrated", hardware="h200", published=(1.59, 1.35, 1.73)):
    """A ``repro.perfmodel.projections`` table: the three projections B2 quotes, and one it
    does not (B200), with the published speedups beside them."""
    rows = [("llama3-8b", "nvfp4_vs_bf16", "gb200", 1.52, published[0]),
            ("llama3-8b", "nvfp4_mlp_vs_fp8", "gb200", 1.17, published[1]),
            ("llama3-405b", "nvfp4_mlp_vs_fp8", "gb300", 1.61, published[2]),
            ("llama3-8b", "nvfp4_vs_bf16", "b200", 1.99, 1.59)]
    return pd.DataFrame([{"hardware": hardware, "calibrated": mode == "calibrated",
                          "mode": mode, "target": t, "model": m, "comparison": c,
                          "speedup": x, "published_speedup": p} for m, c, t, x, p in rows])


def validation(*errors):
    """A ``repro.perfmodel.validation_table``: one row per (workload, error)."""
    return pd.DataFrame([{"hardware": "h200", "workload": w, "error": e} for w, e in errors],
                        columns=["hardware", "workload", "error"])


KEY = ("projected NVFP4 1.52x vs BF16 (Llama-3-8B, GB200; published 1.59x), 1.17x vs FP8 "
       "MLP-only (GB200; published 1.35x), 405B GB300 1.61x (published 1.73x)")


def test_b2_projection_names_its_validation():
    v = V.b2(projection(), None, validation(("mlp", 0.05), ("mlp", -0.2), ("lm", 0.08)))
    assert v.verdict == "projected" and v.key_number == KEY
    assert v.hardware == "h200 -> gb200/gb300 (projection)"
    assert v.source == "perfmodel projection" and not v.emulated
    assert v.note == ("no record from a chip with FP4 tensor cores yet; validated on h200: "
                      "FP8/BF16 speedup predicted within 10% at 2/3 measured shapes (2 MLP, "
                      "1 LM; max error 20%)")
    # exactly 10% counts as within, the LM rows count like the MLP ones
    v = V.b2(projection(), None, validation(("lm", 0.1), ("lm", -0.1), ("mlp", 0.101)))
    assert "within 10% at 2/3 measured shapes (1 MLP, 2 LM; max error 10%)" in v.note


@pytest.mark.parametrize("mode,val,hardware,source,note", [
    ("calibrated", validation(), "h200 ->", "perfmodel projection",
     "not validated: no FP8 mlp_step/lm_step records beside the BF16 ones"),
    ("rates_only", None, "h200 ->", "perfmodel projection (not calibrated)",
     "NOT validated: measured h200 GEMM rates, but no mlp_step records"),
    ("datasheet", validation(), "datasheet ->", "perfmodel projection (not calibrated)",
     "NOT validated: no GPU gemm/mlp_step/lm_step records yet (datasheet peaks only)")])
def test_b2_projection_without_validation_says_why(mode, val, hardware, source, note):
    v = V.b2(projection(mode), None, val)
    assert v.verdict == "projected" and v.key_number == KEY
    assert v.hardware.startswith(hardware) and v.source == source
    assert v.note.startswith("no record from a chip with FP4 tensor cores yet; " + note)


def test_b2_key_number_reads_the_table():
    t = projection(published=(1.59, None, float("nan")))
    t.loc[0, "speedup"] = 1.234
    v = V.b2(t.iloc[[0, 1, 3]])  # no 405B GB300 projection
    assert v.key_number == ("projected NVFP4 1.23x vs BF16 (Llama-3-8B, GB200; published "
                            "1.59x), 1.17x vs FP8 MLP-only (GB200; published n/a), 405B GB300 "
                            "n/a (published n/a)")


def test_b2_without_projection_or_measurement():
    for empty in (pd.DataFrame(), None):
        v = V.b2(empty, pd.DataFrame(columns=["hardware", "model", "baseline", "speedup"]))
        assert v.verdict == "not yet measured" and v.key_number == ""


@pytest.mark.parametrize("rows,verdict", [
    ([("bf16", 1.6), ("fp8-delayed", 1.2)], "reproduced"), ([("bf16", 1.5)], "reproduced"),
    ([("bf16", 1.49)], "partly"), ([("bf16", 0.9)], "contradicted"),
    ([("bf16", 1.0)], "contradicted"), ([("fp8-delayed", 1.3)], "partly")])
def test_b2_measured_on_fp4_hardware(rows, verdict):
    m = pd.DataFrame([{"hardware": "b200", "model": "20m", "baseline": b, "speedup": s}
                      for b, s in rows])
    v = V.b2(projection(), m, validation(("mlp", 0.0)))  # a measurement outranks the model
    best = max(rows, key=lambda r: r[1])
    assert v.verdict == verdict and v.hardware == "b200"
    assert v.key_number == f"measured NVFP4 {best[1]:.2f}x vs {best[0]} (20m, b200)"
    assert v.source == "lm records (measured)"


@pytest.mark.parametrize("weights,acts,whole,verdict", [
    (0.252, 0.281, 0.29, "reproduced"), (0.252, 0.281, 0.329, "partly"),
    (0.252, 0.31, 0.29, "contradicted")])
def test_b3_format_and_whole_model_ratios(weights, acts, whole, verdict):
    t = pd.DataFrame([{"model": "20m", "hardware": "cpu", "weights": 0.9, "activations": 0.9,
                       "whole": 0.9},
                      {"model": "120m", "hardware": "h200", "weights": weights,
                       "activations": acts, "whole": whole}])
    v = V.b3(t)  # the largest model decides
    assert v.verdict == verdict and v.hardware == "h200" and "the 120m model's" in v.key_number
    assert V.b3(t.iloc[:0]).verdict == "not yet measured"


def gaps(rel_gap, lo, hi, profile="full", model="20m", n=3, emulated=True):
    return pd.DataFrame([{"hardware": "h200", "profile": profile, "model": model,
                          "recipe": "nvfp4", "metric": "best_eval_loss", "n_seeds": n,
                          "rel_gap": rel_gap, "rel_lo": lo, "rel_hi": hi, "gap_nats": 0.0,
                          "gap_lo": 0.0, "gap_hi": 0.0, "overfit": 0.0,
                          "emulated": emulated}])


@pytest.mark.parametrize("gap,lo,hi,profile,verdict", [
    (0.0, -0.01, 0.014, "full", "reproduced"), (-0.03, -0.04, -0.02, "full", "reproduced"),
    (0.02, 0.016, 0.03, "full", "contradicted"), (0.01, 0.0, 0.02, "full", "inconclusive"),
    (0.0, -0.01, 0.01, "smoke", "partly")])
def test_b4_relative_loss_gap_against_the_margin(gap, lo, hi, profile, verdict):
    v = V.b4(gaps(gap, lo, hi, profile), pd.DataFrame())
    assert v.verdict == verdict and v.emulated
    assert f"{100 * gap:+.2f}% (95% CI {100 * lo:+.2f}% .. {100 * hi:+.2f}%, 3 seeds" in \
        v.key_number
    assert v.key_number.endswith("vs margin [-1.5%, +1.5%]")
    assert "build/" not in v.source


def test_b4_needs_three_paired_seeds():
    assert V.b4(gaps(0.0, -0.01, 0.01, n=2), pd.DataFrame()).verdict == "not yet measured"


def scaling_rows(effs, n=2, hardware="h200", backend="gpu", simulated=False):
    rows = []
    for (w, r), e in effs.items():
        for k, eff in ((1, 1.0), (n, e)):
            rows.append({"hardware": hardware, "workload": w, "recipe": r, "n_devices": k,
                         "efficiency": eff, "fp8_speedup": math.nan if r == "bf16" else 0.9,
                         "simulated": simulated, "backend": backend, "emulated": False,
                         "efficiency_same_commit": True, "fp8_same_commit": r != "bf16"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("effs,n,verdict", [
    ({("ppo", "bf16"): 0.9, ("ppo", "fp8-delayed"): 0.85}, 4, "reproduced"),
    ({("ppo", "bf16"): 0.9, ("ppo", "fp8-delayed"): 0.85}, 2, "partly"),
    ({("ppo", "bf16"): 0.9, ("ppo", "fp8-delayed"): 0.7}, 8, "partly"),
    ({("ppo", "bf16"): 0.5, ("ppo", "fp8-delayed"): 0.7}, 4, "contradicted")])
def test_b5_weak_scaling_efficiency_at_the_largest_count(effs, n, verdict):
    v = V.b5(scaling_rows(effs, n), {"workloads": ["ppo", "lm_dp"], "recipes": ["bf16"]})
    assert v.verdict == verdict and v.hardware == "h200"
    assert v.key_number.startswith(f"weak-scaling efficiency at {n} GPUs: ppo bf16 "
                                   f"{effs[('ppo', 'bf16')]:.2f}; ppo fp8-delayed")
    assert "(FP8/BF16 0.90x)" in v.key_number and "Not recorded at" in v.note
    assert "lm_dp bf16" in v.note


def test_b5_simulated_devices_never_count():
    sim = scaling_rows({("ppo", "bf16"): 1.0}, 8, "cpu", "cpu", simulated=True)
    assert V.b5(sim).verdict == "not yet measured"


# ------------------------------------------------------------------------------------- B6


def b6_acc(fp8, int8, n=3, profile="full", hw="h200", emulated=False):
    """A ``repro.experiments.inference.tables.accuracy_table``: per format the 95% interval
    (lo, hi) of the relative held-out loss gap to BF16, its mean the midpoint."""
    return pd.DataFrame([{"hardware": hw, "profile": profile, "model": "20m", "format": f,
                          "n_seeds": n, "rel_gap": (lo + hi) / 2, "rel_lo": lo, "rel_hi": hi,
                          "emulated": emulated} for f, (lo, hi) in (("fp8", fp8), ("int8", int8))])


def b6_spd(prefill=1.4, decode=1.6, emulated=False, hw="h200"):
    """A ``speed_table``: the wide config (d_model 4096) at the given speedups, and a narrow
    one (d_model 256) at 0.5x that the rule must not read."""
    rows = []
    for d, pre, dec in ((4096, prefill, decode), (256, 0.5, 0.5)):
        rows += [{"hardware": hw, "profile": "full", "config": f"d{d}", "d_model": d,
                  "format": "fp8", "phase": "prefill", "batch": 8, "speedup": pre,
                  "emulated": emulated}]
        rows += [{"hardware": hw, "profile": "full", "config": f"d{d}", "d_model": d,
                  "format": f, "phase": "decode", "batch": 1, "speedup": dec,
                  "emulated": emulated} for f in ("fp8-w", "int8-w")]
    return pd.DataFrame(rows)


def b6_mem(r8=0.51, r4=0.29, hw="h200"):
    """A ``bytes_table``: whole-model weight bytes over BF16's per weight-only format."""
    return pd.DataFrame([{"hardware": hw, "profile": "full", "model": "20m", "format": f,
                          "ratio_to_bf16": r} for f, r in (("fp8-w", r8), ("int8-w", r8),
                                                           ("nvfp4-w", r4))])


# relative gap intervals against FP8's margin 0.5% and INT8's 1%: inside, straddling, beyond
FP8_IN, FP8_WIDE, FP8_OUT = (-0.002, 0.004), (0.003, 0.007), (0.006, 0.01)
INT8_IN, INT8_WIDE, INT8_OUT = (0.0, 0.009), (0.005, 0.02), (0.011, 0.03)


@pytest.mark.parametrize("fp8,int8,spd,mem,verdict", [
    (FP8_IN, INT8_IN, b6_spd(), b6_mem(), "reproduced"),
    (FP8_IN, INT8_OUT, b6_spd(), b6_mem(), "partly"),
    (FP8_WIDE, INT8_IN, b6_spd(), b6_mem(), "inconclusive"),
    (FP8_IN, INT8_WIDE, b6_spd(1.2), b6_mem(), "partly"),
    (FP8_OUT, INT8_OUT, b6_spd(1.0, 1.0), b6_mem(0.6, 0.4), "contradicted"),
    (FP8_WIDE, INT8_OUT, b6_spd(1.0, 1.0), b6_mem(0.6, 0.4), "contradicted"),
    (FP8_IN, INT8_IN, b6_spd(emulated=True), b6_mem(), "partly"),
    (FP8_WIDE, INT8_IN, b6_spd(emulated=True), b6_mem(), "partly"),
    (FP8_IN, INT8_IN, b6_spd(), b6_mem().iloc[:2], "partly")])
def test_b6_accuracy_within_margins_speed_and_bytes(fp8, int8, spd, mem, verdict):
    v = V.b6(b6_acc(fp8, int8), mem, spd)
    assert (v.verdict, v.hardware, v.emulated) == (verdict, "h200", False)


def test_b6_key_number_and_note_name_every_part():
    v = V.b6(b6_acc(FP8_IN, INT8_WIDE), b6_mem(), b6_spd(emulated=True))
    assert v.key_number == ("FP8 held-out loss +0.10% vs BF16 (95% CI -0.20% .. +0.40%, 3 seeds, "
                            "margin 0.5%); INT8 held-out loss +1.25% vs BF16 (95% CI +0.50% .. "
                            "+2.00%, 3 seeds, margin 1.0%); speed not measured on tensor cores "
                            "(emulated or no records)")
    assert "pass: FP8 held-out loss" in v.note and "inconclusive: INT8 held-out loss" in v.note
    assert "n/a: speed not measured" in v.note and "pass: nvfp4-w weights 0.290x BF16" in v.note
    v = V.b6(b6_acc(FP8_IN, INT8_OUT), b6_mem(0.6), b6_spd(1.2))
    assert "FAIL: INT8 held-out loss" in v.note and "FAIL: FP8 prefill 1.20x BF16 at d_model " \
        "4096 (target 1.3x)" in v.note and "FAIL: fp8-w weights 0.600x BF16" in v.note
    assert "pass: fp8-w decode 1.60x BF16 at batch 1, d_model 4096 (target 1.5x)" in v.note
    assert V.b6(b6_acc(FP8_IN, INT8_IN), b6_mem(), b6_spd(hw="gh200")).hardware == "h200, gh200"
    assert V.b6(b6_acc(FP8_IN, INT8_IN, emulated=True), b6_mem(), b6_spd()).emulated
    # the key number names the decode parts too; an emulated format that B6 does not judge
    # for accuracy (NVFP4 weights: no FP4 tensor cores) does not mark the verdict emulated
    nvfp4 = pd.DataFrame([{**b6_acc(FP8_IN, INT8_IN).iloc[0].to_dict(), "format": "nvfp4-w",
                           "emulated": True}])
    v = V.b6(pd.concat([b6_acc(FP8_IN, INT8_IN), nvfp4]), b6_mem(), b6_spd(1.2, 0.7))
    assert v.key_number.endswith("FP8 prefill 1.20x BF16 at d_model 4096 (target 1.3x); fp8-w "
                                 "decode 0.70x BF16 at batch 1, d_model 4096 (target 1.5x); "
                                 "int8-w decode 0.70x BF16 at batch 1, d_model 4096 (target "
                                 "1.5x)")
    assert not v.emulated


def test_b6_judges_speed_on_the_machine_its_accuracy_ran_on():
    """Speed records of another machine (faster, listed after) never decide B6 where the
    accuracy's machine has its own; the bytes likewise."""
    for order in (1, -1):
        spd = pd.concat([b6_spd(1.2, 1.4), b6_spd(2.0, 2.0, hw="tpu-v5e")][::order])
        mem = pd.concat([b6_mem(0.6), b6_mem(hw="tpu-v5e")][::order])
        v = V.b6(b6_acc(FP8_IN, INT8_IN), mem, spd)
        assert (v.verdict, v.hardware) == ("partly", "h200"), order
        assert "FAIL: FP8 prefill 1.20x" in v.note and "FAIL: fp8-w weights 0.600x" in v.note
        nums = A.key_numbers(b6_acc(FP8_IN, INT8_IN), mem, spd)
        assert nums["fp8"]["prefill_b8_speedup"] == 1.2 and nums["fp8-w"]["ratio_to_bf16"] == 0.6


def test_b6_judges_each_format_at_the_widest_config_it_was_timed_at():
    """A wider config that times only the weight-only formats moves their decode parts there
    and leaves FP8's prefill at the widest config that timed FP8."""
    wider = pd.DataFrame([{"hardware": "h200", "profile": "full", "config": "d8192",
                           "d_model": 8192, "format": f, "phase": "decode", "batch": 1,
                           "speedup": 1.45, "emulated": False} for f in ("fp8-w", "int8-w")])
    v = V.b6(b6_acc(FP8_IN, INT8_IN), b6_mem(), pd.concat([b6_spd(1.4, 1.6), wider]))
    assert v.verdict == "partly"
    assert "pass: FP8 prefill 1.40x BF16 at d_model 4096 (target 1.3x)" in v.note
    assert "FAIL: fp8-w decode 1.45x BF16 at batch 1, d_model 8192 (target 1.5x)" in v.note
    assert "FAIL: int8-w decode 1.45x" in v.note
    # the note lists every width timed, so a pass at the widest does not hide a narrower miss
    assert ("batch-1 decode by d_model: fp8-w 0.50x at 256, 1.60x at 4096, 1.45x at 8192; "
            "int8-w 0.50x at 256, 1.60x at 4096, 1.45x at 8192.") in v.note
    assert "decode by d_model" not in V.b6(b6_acc(FP8_IN, INT8_IN), b6_mem(),
                                           b6_spd(emulated=True)).note


def _with_fp8_tensor(acc, spd, gap, prefill):
    """``acc`` and ``spd`` with an fp8-tensor row: its accuracy interval and wide prefill."""
    row = {**acc.iloc[0].to_dict(), "format": "fp8-tensor", "rel_gap": sum(gap) / 2,
           "rel_lo": gap[0], "rel_hi": gap[1]}
    pre = spd[(spd["format"] == "fp8") & (spd["d_model"] == 4096)].assign(
        format="fp8-tensor", speedup=prefill)
    return pd.concat([acc, pd.DataFrame([row])]), pd.concat([spd, pre])


def test_b6_judges_fp8_and_shows_fp8_tensor_beside_it():
    """B6 does not say "up to": its rule judges `fp8`; `fp8-tensor` is timed beside it."""
    acc, spd = _with_fp8_tensor(b6_acc(FP8_IN, INT8_IN), b6_spd(1.0), FP8_IN, 1.45)
    v = V.b6(acc, b6_mem(), spd)
    assert v.verdict == "partly" and "judged as fp8 (the rule's one format" in v.note
    assert "FAIL: FP8 prefill 1.00x" in v.note
    assert "also timed: FP8-TENSOR prefill 1.45x BF16 at d_model 4096" in v.note


FIRST_PASSING = {"fp8_formats": ["fp8", "fp8-tensor"], "shown": [], "combine": "first-passing"}


def test_b6_under_a_first_passing_rule_judges_the_fp8_format_that_passes_on_its_own_numbers():
    # qwix's per-channel FP8 is accurate but slow; per-tensor FP8 is accurate and fast
    rule = {**V.rule("B6"), **FIRST_PASSING}
    acc, spd = _with_fp8_tensor(b6_acc(FP8_IN, INT8_IN), b6_spd(1.0), FP8_IN, 1.45)
    v = V.b6(acc, b6_mem(), spd, rule=rule)
    assert v.verdict == "reproduced", v.note
    assert v.key_number.startswith("FP8-TENSOR held-out loss +0.10% vs BF16")
    assert "FP8-TENSOR prefill 1.45x BF16 at d_model 4096 (target 1.3x)" in v.key_number
    assert "judged as fp8-tensor" in v.note and "also timed: FP8 prefill 1.00x" in v.note
    # fast per-tensor FP8 outside the margin does not lend its speed to the accurate one
    acc, spd = _with_fp8_tensor(b6_acc(FP8_IN, INT8_IN), b6_spd(1.0), FP8_OUT, 1.45)
    v = V.b6(acc, b6_mem(), spd, rule=rule)
    assert v.verdict == "partly" and "judged as fp8 " in v.note
    assert "FAIL: FP8 prefill 1.00x" in v.note and "pass: FP8 held-out loss" in v.note


def test_b6_needs_three_seeds_and_full_records():
    v = V.b6(b6_acc(FP8_IN, INT8_IN, n=2), b6_mem(), b6_spd())
    assert v.verdict == "partly" and "n/a: FP8 held-out loss" in v.note
    v = V.b6(b6_acc(FP8_IN, INT8_IN, n=1), b6_mem(), b6_spd())
    assert v.verdict == "partly" and "n/a: FP8 accuracy not measured" in v.note
    v = V.b6(b6_acc(FP8_IN, INT8_IN, profile="smoke", hw="cpu"), b6_mem(hw="cpu"),
             b6_spd(hw="cpu"))
    assert v.verdict == "not yet measured" and v.hardware == "cpu"
    assert v.key_number.startswith("smoke records only (reproduced as a pipeline check, not "
                                   "evidence): FP8 held-out loss")
    v = V.b6(b6_acc(FP8_IN, INT8_IN).iloc[:0], b6_mem(), b6_spd())
    assert (v.verdict, v.key_number) == ("not yet measured", "no inference accuracy records")


def test_b6_margins_come_from_the_definition_per_format():
    assert V.margin("B6", "fp8") == (-0.005, 0.005)
    assert V.margin("B6", "int8") == (-0.01, 0.01)
    with pytest.raises(ValueError, match="B6.*part None is not one: fp8, int8"):
        V.margin("B6")
    with pytest.raises(ValueError, match="A5.*one margin.*got part 'fp8'"):
        V.margin("A5", "fp8")
    # a margin given explicitly replaces the definition's: FP8_IN's [-0.2%, +0.4%] straddles
    # a 0.1% margin, and INT8 is then not judged
    v = V.b6(b6_acc(FP8_IN, INT8_OUT), b6_mem(), b6_spd(), bounds={"fp8": (-0.001, 0.001)})
    assert v.verdict == "inconclusive" and "INT8" not in v.note


# ------------------------------------------------------------------------------ boundaries
# Each rule at the exact value of its threshold: a rule whose comparison is loosened or
# tightened by one step (>= to >, the largest model to the smallest) fails one of these.


def test_a2_exactly_the_target_reproduces():
    target = V.rule("A2")["target"]
    assert V.a2(sp_rows({"e2e": target, "update": target})).verdict == "reproduced"
    assert V.a2(sp_rows({"e2e": target - 1e-9, "update": 1.0})).verdict == "partly"


def test_a5_a_low_end_exactly_at_the_margin_keeps_quality():
    low = V.margin("A5")[0]
    v = V.a5(poi(fp8_delayed__fp32=(0.5, low, 0.6), fp8_delayed__fp8_noscale=BETTER), FULL)
    assert v.verdict == "reproduced" and "kept" in v.key_number
    v = V.a5(poi(fp8_delayed__fp32=(0.5, low - 1e-9, 0.6), fp8_delayed__fp8_noscale=BETTER),
             FULL)
    assert v.verdict == "inconclusive"


def test_b4_judges_the_model_its_rule_names():
    both = pd.concat([gaps(0.0, -0.01, 0.01, model="20m"),         # kept
                      gaps(0.02, 0.016, 0.03, model="120m")])      # lost
    v = V.b4(both, pd.DataFrame())
    assert v.verdict == "reproduced" and "20m model" in v.key_number
    assert V.b4(gaps(0.0, -0.01, 0.01, model="120m"), pd.DataFrame()).verdict == \
        "not yet measured"
    # the rule as first registered: the largest model with enough seeds
    first = {**rule_of("B4"), "cells": {"model": "largest with enough seeds",
                                        "profile": "full first"}}
    v = V.b4(both, pd.DataFrame(), rule=first)
    assert v.verdict == "contradicted" and "120m model" in v.key_number
    # a larger model with too few seeds is named in the note, not judged
    v = V.b4(pd.concat([gaps(0.0, -0.01, 0.01, model="20m"),
                        gaps(0.02, 0.016, 0.03, model="120m", n=2)]), pd.DataFrame(),
             rule=first)
    assert v.verdict == "reproduced" and "20m model" in v.key_number
