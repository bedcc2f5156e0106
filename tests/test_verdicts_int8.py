"""Claims C1 and C2 (INT8 training on a TPU v5e) on small hand-made tables: every outcome of
each rule, with numbers on either side of its thresholds, and "not yet measured" without
records of the rule's hardware."""

import pandas as pd
import pytest

from repro.analysis import rl as rl_analysis
from repro.claims import verdicts as V


def paired(update=1.5, e2e=1.2, hw="tpu-v5e", width=4096, num_envs=2048, recipe="int8",
           baseline="bf16", emulated=False, **kw):
    """One row of ``repro.analysis.rl.paired_speedups``."""
    row = dict(hardware=hw, network="mlp", width=width, num_envs=num_envs, recipe=recipe,
               baseline=baseline, e2e=e2e, update=update, memory=1.0, emulated=emulated,
               same_commit=True, e2e_lo=e2e - 0.05, e2e_hi=e2e + 0.05, update_lo=update - 0.1,
               update_hi=update + 0.1, rounds=5, run_id="r1", timing="paired")
    row.update(kw)
    return row


def table(*rows):
    return pd.DataFrame(list(rows))


@pytest.mark.parametrize("update,verdict", [(1.31, "reproduced"), (1.3, "reproduced"),
                                            (1.29, "partly"), (1.0, "partly"),
                                            (0.97, "contradicted")])
def test_c1_judges_the_median_paired_update_ratio_against_the_target(update, verdict):
    v = V.c1(table(paired(update=update)))
    assert v.verdict == verdict and v.hardware == "tpu-v5e"
    assert f"INT8/BF16 PPO update {update:.2f}x" in v.key_number
    assert "5 rounds" in v.key_number and "whole loop 1.20x" in v.key_number
    assert v.numbers["tpu-v5e"]["update_ratio"] == update


def test_c1_without_records_or_with_only_other_cells_is_not_yet_measured():
    assert V.c1(pd.DataFrame()).verdict == "not yet measured"
    others = [paired(hw="h200"), paired(width=2048), paired(baseline="fp32"),
              paired(recipe="int8-auto"), paired(timing="separate"),
              paired(network="cnn")]
    for row in others:
        v = V.c1(table(row))
        assert v.verdict == "not yet measured", row
        assert "no paired cell" in v.key_number
    v = V.c1(table(paired(update=2.0, emulated=True)))
    assert v.verdict == "not yet measured" and "emulated there" in v.key_number


def test_c1_takes_the_most_envs_and_ignores_other_hardware():
    v = V.c1(table(paired(update=0.9, num_envs=256), paired(update=1.4, num_envs=2048),
                   paired(update=0.5, hw="h200")))
    assert v.verdict == "reproduced" and "2048 envs" in v.key_number
    assert v.hardware == "tpu-v5e"


def test_c1_takes_the_median_of_several_paired_runs_and_all_their_rounds():
    v = V.c1(table(paired(update=1.2, run_id="a"), paired(update=1.4, run_id="b"),
                   paired(update=1.35, run_id="c")))
    assert v.verdict == "reproduced" and "update 1.35x" in v.key_number
    assert "range 1.10-1.50 over 3 paired runs, 15 rounds" in v.key_number


def test_c1_reads_paired_speedups_of_records():
    """From records as ``paired_speedups`` reads them: the per-round ratios of one run."""
    recs = []
    for recipe, loop, upd in (("bf16", [2.0, 2.2, 2.1], [30.0, 33.0, 31.0]),
                              ("int8", [1.6, 1.7, 1.6], [20.0, 22.0, 21.0])):
        for metric, samples, key in (("env_steps_per_s", loop, "samples_s"),
                                     ("update_time_ms", upd, "samples_ms")):
            recs.append(dict(hardware="tpu-v5e", recipe=recipe, metric=metric, value=1.0,
                             emulated=False,
                             sizes=dict(network="mlp", width=4096, num_envs=2048),
                             extra={"timing": "paired", "run_id": "x", key: samples}))
    sp = rl_analysis.paired_speedups(pd.DataFrame(recs), ["int8"], ["bf16"])
    v = V.c1(sp)
    assert v.verdict == "reproduced" and "INT8/BF16 PPO update 1.50x" in v.key_number
    assert "range 1.48-1.50" in v.key_number  # 33/22, 30/20, 31/21


def poi(p, lo, hi, x="int8", y="fp32"):
    return pd.DataFrame([{"x": x, "y": y, "p": p, "lo": lo, "hi": hi}])


TPU = V.QualityEvidence("tpu-v5e", "full", ("a", "b", "c"), 16, 5)


@pytest.mark.parametrize("interval,verdict", [((0.5, 0.42, 0.58), "reproduced"),
                                              ((0.7, 0.61, 0.8), "reproduced"),
                                              ((0.45, 0.3, 0.6), "inconclusive"),
                                              ((0.3, 0.2, 0.35), "contradicted")])
def test_c2_is_parity_with_fp32_within_the_margin(interval, verdict):
    v = V.c2(poi(*interval), TPU)
    assert v.verdict == verdict and v.hardware == "tpu-v5e"
    assert "P(int8>fp32)" in v.key_number and "[0.40,0.60]" in v.key_number
    assert v.numbers["int8_vs_fp32"]["lo"] == interval[1]


def test_c2_needs_the_rules_hardware_seeds_environments_and_full_records():
    kept = poi(0.5, 0.42, 0.58)
    other = V.c2(kept, V.QualityEvidence("h200", "full", ("a", "b", "c"), 16, 5))
    assert other.verdict == "not yet measured" and "evidence given: h200" in other.key_number
    few = V.c2(kept, V.QualityEvidence("tpu-v5e", "full", ("a", "b", "c"), 8, 5))
    assert few.verdict == "partly" and "8 seeds (< 16" in few.key_number
    two = V.c2(kept, V.QualityEvidence("tpu-v5e", "full", ("a", "b"), 16, 5))
    assert two.verdict == "partly" and "2 of 5 planned" in two.key_number
    smoke = V.c2(kept, V.QualityEvidence("tpu-v5e", "smoke", ("a",), 3, 5))
    assert smoke.verdict == "not yet measured" and "smoke only" in smoke.key_number
    assert V.c2(poi(0.5, 0.4, 0.6, x="fp8-delayed"), TPU).verdict == "not yet measured"


def test_c_rules_come_from_claims_yaml():
    r1, r2 = V.rule("C1"), V.rule("C2")
    assert (r1["target"], r1["cells"]["hardware"], r1["recipes"]) == (1.3, "tpu-v5e", ["int8"])
    assert (r2["reference"], r2["min_seeds"]) == ("fp32", 16)
    assert V.margin("C2") == V.margin("A10")
    looser = {**r1, "target": 2.0}
    assert V.c1(table(paired(update=1.5)), rule=looser).verdict == "partly"
