"""Paired timing: recipes compiled together and timed in rounds (A, B, A, B, ...), their ratios
the median of per-round ratios with its range, and claim A2 judged from them where a hardware
has them (its rule as registered says so; the rule before it never reads them)."""

import numpy as np
import pandas as pd
import pytest

from repro import hardware, results
from repro.analysis import rl as R
from repro.claims import verdicts as V
from repro.studies import timing


def test_time_rounds_alternates_the_calls_round_by_round():
    order = []

    def call(name):
        def run():
            order.append(name)
            return np.zeros(())
        return run

    samples = timing.time_rounds({"a": call("a"), "b": call("b"), "c": call("c")}, rounds=3,
                                 warmup=2)
    assert order == ["a", "b", "c"] * 5  # 2 warm-up rounds, then 3 timed ones
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(np.all(v >= 0) for v in samples.values())
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        timing.time_rounds({"a": call("a")}, rounds=0)


def paired_records(loop: dict, update: dict, memory: dict, run_id="r1", hw="h200",
                   emulated=()):
    """Records of one paired cell as ``rl_throughput.paired_cell`` writes them: per recipe the
    whole loop's and the update's samples (seconds, ms) in round order."""
    info = hardware.lookup(hw)
    sizes = {"network": "mlp", "width": 4096, "num_envs": 2048, "env": "Breakout-MinAtar"}
    out = []
    for r in loop:
        extra = {"timing": "paired", "run_id": run_id, "paired_with": list(loop)}
        common = dict(recipe=r, sizes=sizes, emulated=r in emulated, hardware=info)
        out += [
            results.make_record("rl_throughput", "env_steps_per_s", 1e6 / np.median(loop[r]),
                                "steps/s", extra={**extra, "samples_s": loop[r]}, **common),
            results.make_record("rl_throughput", "update_time_ms", float(np.median(update[r])),
                                "ms", extra={**extra, "samples_ms": update[r]}, **common),
            results.make_record("rl_throughput", "update_memory_bytes", memory[r], "bytes",
                                extra=extra, **common)]
    return pd.DataFrame(out)


def test_paired_speedups_are_medians_of_per_round_ratios():
    # round ratios fp16/fp8: loop 2/1, 3/1, 8/2 -> 2, 3, 4; update 10/5, 12/3, 30/30 -> 2, 4, 1
    df = paired_records({"fp16": [2.0, 3.0, 8.0], "fp8-delayed": [1.0, 1.0, 2.0]},
                        {"fp16": [10.0, 12.0, 30.0], "fp8-delayed": [5.0, 3.0, 30.0]},
                        {"fp16": 400.0, "fp8-delayed": 300.0})
    sp = R.paired_speedups(df)
    assert len(sp) == 1  # no bf16 in the cell: only the fp16 baseline
    row = sp.iloc[0]
    assert (row.recipe, row.baseline, row.timing, row.rounds) == ("fp8-delayed", "fp16",
                                                                  "paired", 3)
    assert row.e2e == pytest.approx(3.0) and (row.e2e_lo, row.e2e_hi) == (2.0, 4.0)
    # the update's ratio of medians would be 12/5 = 2.4
    assert row["update"] == pytest.approx(2.0) and (row.update_lo, row.update_hi) == (1.0, 4.0)
    assert row.memory == pytest.approx(0.75) and row.same_commit and not row.emulated
    # a paired cell's timings stay out of the table of separately timed cells; its update's
    # memory (XLA's analysis of the same compiled program) is in it
    t = R.throughput_table(df)
    assert "env_steps_per_s" not in t and "update_time_ms" not in t
    assert dict(zip(t.recipe, t.update_memory_bytes)) == {"fp16": 400.0, "fp8-delayed": 300.0}
    assert R.fp8_speedups(t).empty  # no timing: no ratio from it


def test_paired_speedups_refuse_cells_of_unequal_rounds():
    df = paired_records({"fp16": [2.0, 3.0], "fp8-delayed": [1.0, 1.0, 2.0]},
                        {"fp16": [10.0, 12.0], "fp8-delayed": [5.0, 4.0, 9.0]},
                        {"fp16": 1.0, "fp8-delayed": 1.0})
    with pytest.raises(ValueError, match="different numbers of rounds"):
        R.paired_speedups(df)


def sp_rows(*rows, **defaults):
    base = dict(hardware="h200", network="mlp", width=4096, num_envs=2048, recipe="fp8-delayed",
                baseline="fp16", e2e=1.0, update=1.0, memory=1.0, emulated=False,
                same_commit=True, timing="separate")
    base.update(defaults)
    return pd.DataFrame([{**base, **r} for r in rows])


def test_a2_judges_a_hardware_from_its_paired_cells_alone():
    separate = sp_rows({"e2e": 1.7, "update": 1.7})  # would reproduce A2
    paired = sp_rows({"e2e": 1.3, "update": 1.4, "timing": "paired", "e2e_lo": 1.2,
                      "e2e_hi": 1.35, "update_lo": 1.3, "update_hi": 1.5, "rounds": 5})
    v = V.a2(pd.concat([separate, paired], ignore_index=True))
    assert v.verdict == "partly"
    assert "1.30x" in v.key_number and "paired, median of 5 rounds, range 1.20-1.35x" in \
        v.key_number
    # another hardware without paired cells is still judged from its separate cells
    other = sp_rows({"hardware": "b200", "e2e": 1.7, "update": 1.7})
    assert V.a2(pd.concat([separate, paired, other], ignore_index=True)).verdict == \
        "reproduced"
    # a rule without `timing: paired-first` (A2's before it) never reads paired rows
    first = {k: v for k, v in V.rule("A2").items()}
    first["cells"] = {k: v for k, v in first["cells"].items() if k != "timing"}
    assert V.a2(pd.concat([separate, paired], ignore_index=True), first).verdict == \
        "reproduced"
    assert V.a2(paired, first).verdict == "not yet measured"


@pytest.mark.slow  # an end-to-end paired cell: compiles three recipes
def test_a_paired_cell_times_its_recipes_in_one_run_on_cpu():
    from repro.experiments.rl_throughput import measure as X

    p = X.Params(profile="smoke", recipes=("fp16",), widths=(16,), num_envs=(4,),
                 networks={"mlp": "CartPole-v1"}, num_steps=8, updates=1, repeats=3,
                 update_epochs=1, num_minibatches=1, paired_recipes=("fp16", "fp8-delayed"),
                 paired_widths=(16,))
    cells = X.cells(p)
    assert [(c.name, c.recipes, c.group) for c in cells[:2]] == [
        ("stores", (), None),
        ("mlp_w16_e4_paired", ("fp16", "fp8-delayed"), "mlp_w16_e4_paired")]
    recs = cells[1].run(None)
    assert sorted((r["recipe"], r["metric"]) for r in recs) == sorted(
        (r, m) for r in ("fp16", "fp8-delayed")
        for m in ("env_steps_per_s", "update_time_ms", "update_memory_bytes"))
    assert len({r["extra"]["run_id"] for r in recs}) == 1
    assert all(r["extra"]["timing"] == "paired" for r in recs)
    for r in recs:
        if r["metric"] == "env_steps_per_s":
            assert len(r["extra"]["samples_s"]) == 3 and r["repeats"] == 3
    sp = R.paired_speedups(pd.DataFrame(recs))
    assert list(sp.recipe) == ["fp8-delayed"] and sp.rounds.iloc[0] == 3
    # a paired record's program is the same computation with the paired cell's kit
    rec = next(r for r in recs if r["recipe"] == "fp8-delayed")
    settings = X.program_settings(rec)
    assert settings["paired"] is True
    unpaired = {k: v for k, v in settings.items() if k != "paired"}
    assert X.program(**settings).kit != X.program(**unpaired).kit


def test_a_speed_verdict_names_the_hardware_it_could_not_judge_and_why():
    h200 = sp_rows({"e2e": 1.7, "update": 1.7})
    tpu = sp_rows({"hardware": "tpu-v5e", "e2e": 0.94, "emulated": True})
    b200 = sp_rows({"hardware": "b200", "e2e": 1.9, "same_commit": False})
    v = V.a2(pd.concat([h200, tpu, b200], ignore_index=True))
    assert v.verdict == "reproduced"
    assert v.hardware == ("h200; b200: not judged (no ratio under the rule); tpu-v5e: not "
                          "judged (emulated there)")
    assert V.a2(h200).hardware == "h200"
