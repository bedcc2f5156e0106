"""The grpo study (claim A12): its params sections, cells and tables on hand-made records;
A12's rule on hand-made accuracy tables (thresholds read from repro/data/claims.yaml); the
supervised warm-up's answers and the held-out curve of repro.models.grpo."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pandas as pd
import pytest

from repro import studies
from repro.claims import verdicts as V
from repro.config import ConfigError
from repro.experiments.grpo import measure as S
from repro.experiments.grpo import tables as A
from repro.models import grpo as R

RULE = V.rule("A12")
ARM, REF = RULE["recipes"][0], RULE["reference"]
SHOWN = RULE["shown"]
NEED, WORKS, TARGET = RULE["min_seeds"], RULE["rl_works"], RULE["speed"]["target"]
LOW = V.margin("A12")[0]


def table(gaps, gain=0.3, base=0.2, hw="h200", shown_gap=None, emulated=True):
    """Per seed: the reference gains ``gain`` over ``base``; the judged arm ``gaps[i]``."""
    rows = []
    for s, g in enumerate(gaps):
        ref = base + gain
        rows.append({"hardware": hw, "arm": REF, "seed": s, "base": base, "final": ref,
                     "emulated": False})
        rows.append({"hardware": hw, "arm": ARM, "seed": s, "base": base, "final": ref + g,
                     "emulated": emulated})
        if shown_gap is not None:
            rows.append({"hardware": hw, "arm": SHOWN[0], "seed": s, "base": base,
                         "final": ref + shown_gap, "emulated": emulated})
    return pd.DataFrame(rows, columns=A.COLUMNS)


def spread(center, n=None, width=0.002):
    n = n or NEED
    return [center + width * (i - (n - 1) / 2) for i in range(n)]


def test_a12_not_yet_measured_without_records():
    v = V.a12(pd.DataFrame(columns=A.COLUMNS))
    assert v.verdict == "not yet measured" and "no full-profile" in v.key_number


def test_a12_reproduced_when_kept_and_fast():
    v = V.a12(table(spread(0.0)), speed=TARGET + 0.05)
    assert v.verdict == "reproduced", v.key_number
    assert v.numbers["n_seeds"] == NEED and v.emulated
    assert v.numbers["gap_lo"] >= LOW


def test_a12_partly_when_kept_but_speed_short_or_unmeasured():
    assert V.a12(table(spread(0.0)), speed=TARGET - 0.1).verdict == "partly"
    v = V.a12(table(spread(0.0)))
    assert v.verdict == "partly" and "speedup not measured" in v.key_number


def test_a12_contradicted_when_the_interval_lies_below_the_margin():
    v = V.a12(table(spread(LOW - 0.05)), speed=TARGET + 1)
    assert v.verdict == "contradicted" and v.numbers["gap_hi"] < LOW


def test_a12_inconclusive_when_the_interval_straddles_the_margin():
    v = V.a12(table(spread(LOW, width=0.05)), speed=TARGET + 1)
    assert v.verdict == "inconclusive"


def test_a12_no_verdict_on_precision_when_rl_did_not_work():
    v = V.a12(table(spread(0.0), gain=WORKS / 2), speed=TARGET + 1)
    assert v.verdict == "not yet measured" and "RL did not work" in v.key_number
    assert V.a12(table(spread(0.0), gain=WORKS + 0.01), speed=TARGET + 1).verdict == \
        "reproduced"


def test_a12_needs_min_seeds_paired_seeds():
    v = V.a12(table(spread(0.0, n=NEED - 1)), speed=TARGET + 1)
    assert v.verdict == "not yet measured" and f"{NEED} needed" in v.key_number
    t = table(spread(0.0))  # the reference missing one seed: one pair fewer
    t = t[~((t.arm == REF) & (t.seed == 0))]
    assert V.a12(t, speed=TARGET + 1).verdict == "not yet measured"


def test_a12_shows_the_other_arms_without_judging_them():
    v = V.a12(table(spread(0.0), shown_gap=-0.5), speed=TARGET + 1)
    assert v.verdict == "reproduced" and f"{SHOWN[0]} -50.0 pts" in v.note
    assert "not judged" in v.note


def test_a12_reads_its_thresholds_from_the_rule():
    stricter = {**RULE, "min_seeds": NEED + 5}
    assert V.a12(table(spread(0.0)), TARGET + 1, rule=stricter).verdict == "not yet measured"
    lax = {**RULE, "rl_works": 0.0}
    assert V.a12(table(spread(0.0), gain=0.0), TARGET + 1, rule=lax).verdict == "reproduced"


# -------------------------------------------------------------------------- the study


def test_params_sections_hold_every_arm_of_the_rule_in_full():
    full = studies.params("grpo", "full")
    assert {ARM, REF, *SHOWN} <= set(full.arms)  # and variants beside them, never judged
    assert full.seeds >= NEED
    c = {a: S.arm_config(full, a) for a in full.arms}
    assert (c[REF].d_model, c[REF].n_layers) == (512, 6)  # the 20m preset
    assert not c[REF].rollout_fp8 and c[ARM].rollout_fp8 and c[ARM].recipe != c[REF].recipe
    assert c["fp8-e2e-no-is"].is_cap is None and c[ARM].is_cap is not None
    assert c["fp8-e2e-kv"] == dataclasses.replace(c[ARM], rollout_kv_fp8=True)
    assert all(x.sft_steps > 0 and x.eval_every for x in c.values())
    smoke = studies.params("grpo", "smoke")
    names = [cell.name for cell in S.cells(smoke)]
    assert names and all(n.endswith("_s0") for n in names)
    assert [cell.name for cell in S.cells(full)][:len(full.arms)] == \
        [S.cell_name(a, 0) for a in full.arms]


def test_check_names_the_arm_in_one_line():
    p = studies.params("grpo", "smoke")
    bad = dataclasses.replace(p, arms={"x": {"recipe": "fp9"}})
    with pytest.raises(ValueError, match=r"grpo\.smoke\.arms\.x: GRPO config recipe") as e:
        S.check(bad)
    assert "\n" not in str(e.value)


def _record(arm, seed, base, final, hw="h200", backend="gpu", profile="full", digest=None):
    extra = {"arm": arm, "curve": [base, final], "curve_steps": [0, 4],
             "base": {"digest": digest} if digest else None,
             "reward": [0.1, 0.2, None, 0.3], "mismatch_kl": [1e-3] * 4,
             "is_capped_frac": [0.0, 0.01, 0.0, 0.0]}
    common = {"hardware": hw, "backend": backend, "profile": profile, "emulated": True,
              "sizes": {"arm": arm, "seed": seed}, "extra": extra}
    return [{**common, "metric": "heldout_accuracy", "value": final},
            {**common, "metric": "base_accuracy", "value": base}]


def test_tables_from_hand_made_records():
    recs = pd.DataFrame(_record(REF, 0, 0.1, 0.5) + _record(ARM, 0, 0.1, 0.45)
                        + _record(ARM, 1, 0.1, 0.4, backend="cpu", profile="smoke")
                        + _record(ARM, 2, 0.1, 0.4, hw="tpu-v5e", backend="tpu"))
    ev = A.evidence(recs)
    assert sorted(ev.backend.unique()) == ["gpu", "tpu"]  # never a CPU's pipeline check
    ev = ev[ev.backend == "gpu"]
    acc = A.accuracy_table(ev)
    assert list(acc.columns) == A.COLUMNS and len(acc) == 2
    assert acc.set_index("arm").loc[ARM, "final"] == 0.45
    assert acc.set_index("arm").loc[REF, "base"] == 0.1
    cur = A.curves(ev)
    assert np.isnan(cur.reward.iloc[0][2]) and list(cur.curve_steps.iloc[0]) == [0, 4]
    s = A.arm_summary(ev).set_index("arm")
    assert s.loc[REF, "gain"] == pytest.approx(0.4)
    assert s.loc[ARM, "capped_frac"] == pytest.approx(0.0025)
    assert len(A.accuracy_table(pd.DataFrame())) == 0


def test_shared_bases_per_seed_from_the_digests():
    digests = [("a", "a"), ("b", "c"), (None, "d")]  # seed 2's reference has no digest
    recs = pd.DataFrame([r for s, (x, y) in enumerate(digests)
                         for r in _record(REF, s, 0.1, 0.5, digest=x)
                         + _record(ARM, s, 0.1, 0.4, digest=y)])
    t = A.shared_bases(recs).set_index("seed")
    assert t.shared.tolist() == [True, False, False]
    assert t.bases.tolist()[:2] == [1, 2] and t.bases.isna().tolist()[2]
    assert t.arms.tolist() == [2, 2, 2]


# ------------------------------------------------------------- model additions


def test_answer_tokens_are_what_the_verifier_accepts():
    a, b = np.array([7, 95, 0, 999]), np.array([5, 4, 0, 1])
    toks = np.asarray(R.answer_tokens(a, b, 5))
    assert bytes(toks[0].astype(np.uint8)) == b"12\n\n\n"
    assert bytes(toks[3].astype(np.uint8)) == b"1000\n"
    np.testing.assert_array_equal(np.asarray(R.reward_tokens(toks, a, b)), 1.0)


def test_config_errors_of_the_new_fields_are_one_line():
    with pytest.raises(ConfigError, match="eval_every=3: must divide steps=8"):
        R.make_train({"steps": 8, "eval_every": 3})
    with pytest.raises(ConfigError, match="sft_recipe='fp8-current': must be unquantized"):
        R.make_train({"sft_steps": 2, "sft_recipe": "fp8-current"})
    with pytest.raises(ConfigError, match="sft_lr=0"):
        R.make_train({"sft_lr": 0})


FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@pytest.mark.slow  # compiles the GRPO run twice and its warm-up
def test_warm_up_lowers_its_loss_and_train_from_its_base_is_train():
    """The warm-up learns; ``train(key)`` equals ``train(key, train.base(key))`` bit for bit
    and starts from the ``start`` it is given; the curve has a point per evaluation."""
    cfg = dict(n_digits=1, d_model=32, n_layers=1, n_heads=2, d_ff=64, steps=4,
               prompts_per_step=4, group_size=4, eval_problems=8, eval_every=2,
               sft_steps=40, sft_batch=32, sft_lr=1e-2, recipe="fp32", rollout_recipe="fp32",
               sft_recipe="fp32")
    train, key = R.make_train(cfg), jax.random.key(0)
    start = jax.jit(train.base).lower(key).compile(FAST)(key)
    out = jax.jit(train).lower(key).compile(FAST)(key)
    loss = np.asarray(out["sft_loss"])
    assert loss.shape == (40,) and loss[-5:].mean() < 0.7 * loss[:5].mean()
    curve, hr = np.asarray(out["heldout_curve"]), np.asarray(out["heldout_reward"])
    assert curve.shape == (3,) and hr[0] == curve[0] and hr[1] == curve[-1]
    assert np.asarray(out["metrics"]["reward"]).shape == (4,)
    from_start = jax.jit(train).lower(key, start).compile(FAST)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(from_start(key, start))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    flipped = from_start(key, {**start, "params": jax.tree.map(lambda x: -x, start["params"])})
    assert np.asarray(flipped["heldout_reward"])[0] != hr[0] or not np.array_equal(
        np.asarray(flipped["metrics"]["loss"]), np.asarray(out["metrics"]["loss"]))


@pytest.mark.slow  # compiles two arms' GRPO runs and their warm-up
def test_every_arm_of_a_seed_gets_the_one_base_model():
    """The warm-up runs once per seed, apart from the arms' programs: two arms with other
    trainers share its bits (digest) and the run that made them (its timings)."""
    p = studies.params("grpo", "smoke")
    grpo = {**p.grpo, "sft_steps": 3, "sft_batch": 4, "steps": 1, "eval_every": 0}
    p = dataclasses.replace(p, grpo=grpo, arms={"a": {"recipe": "bf16"},
                                                "b": {"recipe": "fp32", "is_cap": None}})
    S._BASES.clear()
    ra, rb = S.train_cell("a", 0, p), S.train_cell("b", 0, p)
    assert ra[0]["extra"]["base"] == rb[0]["extra"]["base"]
    assert len(ra[0]["extra"]["base"]["digest"]) == 16


# ------------------------------------------------------------------- the speed cell


def _speed(recipe, steps, hw="h200", run="r1", d_model=4096, emulated=False):
    rollout = [t / 4 for t in steps]
    extra = {"run_id": run, "step_samples_s": list(steps), "rollout_samples_s": rollout,
             "update_samples_s": [t - r for t, r in zip(steps, rollout)],
             "rollout_tokens": 1000}
    return {"hardware": hw, "backend": "gpu", "profile": "full", "metric": "rl_step_s",
            "recipe": recipe, "value": float(np.median(steps)), "emulated": emulated,
            "sizes": {"cell": "speed", "d_model": d_model}, "extra": extra}


def test_speed_table_is_a_ratio_of_medians_of_paired_rounds():
    recs = pd.DataFrame([_speed("bf16", [1.0, 2.0, 1.2]), _speed("fp8-current", [0.5, 2.0, 1.0]),
                         _speed("bf16", [3.0], d_model=1024, run="r2"),
                         _speed("fp8-current", [1.0], d_model=1024, run="r2")])
    t = A.speed_table(recs).set_index(["d_model", "recipe"])
    fp8 = t.loc[(4096, "fp8-current")]
    assert fp8.speedup == pytest.approx(1.2 / 1.0)  # medians 1.2 and 1.0
    assert (fp8.speedup_lo, fp8.speedup_hi) == pytest.approx((1.0, 2.0))  # 1/1, 1.2/1, 2/1
    assert fp8.rollout_tokens_per_s == pytest.approx(1000 / 0.25)
    assert t.loc[(4096, "bf16")].speedup == pytest.approx(1.0)
    assert A.rl_step_speedup(A.speed_table(recs))[0] == pytest.approx(1.2)
    assert A.rl_step_speedup(A.speed_table(recs), min_d_model=8192)[0] is None


def test_rl_step_speedup_skips_emulated_fp8():
    recs = pd.DataFrame([_speed("bf16", [1.0, 1.0]),
                         _speed("fp8-current", [0.5, 0.5], emulated=True)])
    speedup, why = A.rl_step_speedup(A.speed_table(recs))
    assert speedup is None and "emulated" in why
    v = V.a12(table(spread(0.0)), speedup, speed_where=why)
    assert v.verdict == "partly" and "emulated" in v.key_number


@pytest.mark.slow  # compiles both phases of two recipes (about 30 s on 2 cores)
def test_speed_cell_times_both_phases_of_every_recipe_in_rounds():
    p = studies.params("grpo", "full")
    tiny = {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "n_digits": 1,
            "prompts_per_step": 2, "group_size": 2}
    p = dataclasses.replace(p, speed=dataclasses.replace(p.speed, rounds=2, grpo=tiny),
                            compiler_options={"xla_backend_optimization_level": 0})
    recs = S.speed_cell(p)
    assert {(r["metric"], r["recipe"]) for r in recs} == {
        (m, r) for m in ("rl_step_s", "rollout_tokens_per_s", "update_s")
        for r in p.speed.recipes}
    step = next(r for r in recs if r["metric"] == "rl_step_s" and r["recipe"] == "bf16")
    e = step["extra"]
    assert len(e["step_samples_s"]) == 2 and e["timing"] == "paired"
    np.testing.assert_allclose(e["step_samples_s"],
                               np.add(e["rollout_samples_s"], e["update_samples_s"]))
    assert e["rollout_tokens"] == 2 * 2 * 3  # prompts x group x (1 digit + carry + end)
    assert len({r["extra"]["run_id"] for r in recs}) == 1
    fp8 = next(r for r in recs if r["recipe"] == "fp8-current")
    assert fp8["emulated"]  # no FP8 GEMM on a CPU
    assert S.cells(p)[-1].name == "speed_d32"
