"""Paired speed cells of the legged study (claim A11's speed side): the recipes compiled
together and timed in rounds, their ratios the median of per-round ratios with its range, and
A11 judged from them where a hardware has them (its rule as registered says so; the rule
before it never reads them). A paired cell runs here on a stand-in environment (no MJX)."""

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from repro import hardware, results
from repro.claims import verdicts as V
from repro.experiments.legged import measure as L
from repro.experiments.legged import rules as VL
from repro.experiments.legged import tables as A
from repro.models import ppo_continuous as pc

SIZES = {"brax": 256, "w2048": 2048}


def paired_records(loop: dict, update: dict, size="brax", run_id="r1", hw="h200",
                   emulated=(), physics: float | None = 1e6):
    """Records of one paired cell as ``legged.paired_speed_cell`` writes them: per recipe the
    whole loop's samples (seconds) and the update's (ms) in round order; with ``physics``, a
    physics cell's env-steps/s at the same number of environments."""
    info = hardware.lookup(hw)
    n, steps = 8192, 20
    out = []
    if physics is not None:
        out.append(results.make_record(
            "legged", "physics_env_steps_per_s", physics, "steps/s", hardware=info,
            sizes={"env": "ant", "num_envs": n, "precision": "default"}))
    sizes = {"env": "ant", "size": size, "num_envs": n, "num_steps": steps, "updates": 4,
             "width": SIZES[size]}
    for r in loop:
        extra = {"samples_s": loop[r], "update_samples_ms": update[r], "timing": "paired",
                 "run_id": run_id, "paired_with": list(loop)}
        common = dict(recipe=r, sizes=sizes, emulated=r in emulated, hardware=info,
                      extra=extra)
        med = float(np.median(loop[r]))
        out += [results.make_record("legged", "env_steps_per_s", 4 * n * steps / med,
                                    "steps/s", **common),
                results.make_record("legged", "loop_ms_per_update", med / 4 * 1e3, "ms",
                                    **common),
                results.make_record("legged", "policy_ms_per_update", 1.0, "ms", **common),
                results.make_record("legged", "update_ms", float(np.median(update[r])), "ms",
                                    **common)]
    return pd.DataFrame(out)


def test_paired_speedups_are_medians_of_per_round_ratios():
    # per round bf16/fp8: loop 2/1, 3/2, 8/2 -> 2, 1.5, 4 (median 2; ratio of medians 3/2);
    # update 10/5, 12/3, 30/30 -> 2, 4, 1 (median 2; ratio of medians 12/5)
    df = paired_records({"bf16": [2.0, 3.0, 8.0], "fp8-delayed": [1.0, 2.0, 2.0]},
                        {"bf16": [10.0, 12.0, 30.0], "fp8-delayed": [5.0, 3.0, 30.0]})
    ups = A.paired_speedups(df)
    assert len(ups) == 1
    row = ups.iloc[0]
    assert (row.hardware, row.env, row["size"], row.width, row.recipe, row.timing,
            row.rounds) == ("h200", "ant", "brax", 256, "fp8-delayed", "paired", 3)
    assert row.e2e == pytest.approx(2.0) and (row.e2e_lo, row.e2e_hi) == (1.5, 4.0)
    assert row["update"] == pytest.approx(2.0) and (row.update_lo, row.update_hi) == (1.0, 4.0)
    assert row.same_commit and not row.emulated
    # the physics' share of the BF16 loop: 20 x 8192 steps at 1e6 steps/s over its 3 s / 4
    assert row.physics_share == pytest.approx(20 * 8192 / 1e6 / 0.75)
    # paired records stay out of the separately timed cells' table and ratios
    assert A.speed_table(df).empty
    assert A.speedups(A.speed_table(df)).empty
    both = A.speedups(A.speed_table(df), records=df)
    assert list(both.timing) == ["paired"] and both.e2e.iloc[0] == pytest.approx(2.0)


def test_paired_speedups_refuse_cells_of_unequal_rounds():
    df = paired_records({"bf16": [2.0, 3.0], "fp8-delayed": [1.0, 1.0, 2.0]},
                        {"bf16": [10.0, 12.0], "fp8-delayed": [5.0, 4.0, 9.0]})
    with pytest.raises(ValueError, match="different numbers of rounds"):
        A.paired_speedups(df)


def ups_rows(*rows, **defaults):
    base = dict(hardware="h200", env="ant", size="brax", width=256, recipe="fp8-delayed",
                e2e=1.0, update=1.0, physics_share=0.2, emulated=False, same_commit=True,
                timing="separate")
    base.update(defaults)
    return pd.DataFrame([{**base, **r} for r in rows])


PAIRED = dict(timing="paired", rounds=5, run_id="r1")


def test_a11_judges_a_hardware_from_its_paired_cells_alone():
    # separately timed: FP8 pays at both widths; paired: only at the wider one
    separate = ups_rows({"e2e": 1.3, "update": 1.4},
                        {"size": "w2048", "width": 2048, "e2e": 1.5, "update": 1.8})
    paired = ups_rows({"e2e": 1.05, "update": 1.2, "e2e_lo": 1.01, "e2e_hi": 1.08,
                       "update_lo": 1.1, "update_hi": 1.3, **PAIRED},
                      {"size": "w2048", "width": 2048, "e2e": 1.4, "update": 1.7,
                       "e2e_lo": 1.3, "e2e_hi": 1.45, "update_lo": 1.6, "update_hi": 1.8,
                       **PAIRED})
    ups = pd.concat([separate, paired], ignore_index=True)
    v = VL.a11(ups, pd.DataFrame())
    assert v.verdict == "partly" and "FP8 pays from width 2048 on" in v.key_number
    assert "1.05x at brax (width 256; paired, median of 5 rounds, range 1.01-1.08x; update " \
        "alone 1.20x" in v.key_number
    assert "range 1.30-1.45x" in v.key_number
    assert VL.a11(separate, pd.DataFrame()).verdict == "partly"  # quality not measured
    assert "FP8 pays from width 256 on" in VL.a11(separate, pd.DataFrame()).key_number
    # the key numbers: the paired ratios alone, with their range
    numbers = A.key_numbers(ups, pd.DataFrame())["h200"]["fp8-delayed"]
    assert numbers["ant_width_256"] == {"e2e": 1.05, "update": 1.2, "e2e_lo": 1.01,
                                        "e2e_hi": 1.08, "update_lo": 1.1, "update_hi": 1.3,
                                        "rounds": 5}
    # a rule without `timing: paired-first` (A11's before it) never reads paired rows
    first = dict(V.rule("A11"))
    first["cells"] = {k: v for k, v in first["cells"].items() if k != "timing"}
    old = VL.a11(ups, pd.DataFrame(), rule=first)
    assert "FP8 pays from width 256 on" in old.key_number and "paired" not in old.key_number
    assert old == VL.a11(separate, pd.DataFrame(), rule=first)
    assert VL.a11(paired, pd.DataFrame(), rule=first).verdict == "not yet measured"


def test_a11_without_paired_rows_reads_as_before():
    separate = ups_rows({"e2e": 1.3, "update": 1.4},
                        {"size": "w2048", "width": 2048, "e2e": 1.5, "update": 1.8})
    bare = separate.drop(columns="timing")  # speedups() without paired records
    first = dict(V.rule("A11"))
    first["cells"] = {k: v for k, v in first["cells"].items() if k != "timing"}
    assert VL.a11(bare, pd.DataFrame()) == VL.a11(separate, pd.DataFrame()) == \
        VL.a11(bare, pd.DataFrame(), rule=first)
    assert A.key_numbers(bare, pd.DataFrame()) == A.key_numbers(separate, pd.DataFrame())


# ---------------------------------------------------------------------------- the study


def _params(**speed):
    return {"profile": "smoke", "envs": {"ant": {}},
            "ppo": {"num_envs": 4, "num_steps": 2, "num_minibatches": 2, "update_epochs": 1},
            "sizes": {"s": {"policy_sizes": [8], "value_sizes": [8]},
                      "w": {"policy_sizes": [16], "value_sizes": [16]}},
            "physics": {"num_envs": [4], "precisions": ["default"], "steps": 2, "repeats": 1},
            "random": None, "quality": None, "peer": None,
            "speed": {"sizes": ["s", "w"], "recipes": ["bf16", "fp8-delayed"], "num_envs": 4,
                      "updates": 1, "repeats": 3, **speed},
            "compiler_options": {"xla_backend_optimization_level": 0,
                                 "xla_llvm_disable_expensive_passes": True}}


def test_paired_cells_come_before_the_separate_ones_with_the_paired_kit():
    plain = [c.name for c in L.cells(_params())]
    assert not any(n.endswith("_paired") for n in plain)
    cells = L.cells(_params(paired=True))
    L.check(_params(paired=True))
    assert [c.name for c in cells] == [
        "ant_physics_e4_default", "ant_speed_s_paired", "ant_speed_w_paired",
        "ant_speed_s_bf16", "ant_speed_s_fp8-delayed", "ant_speed_w_bf16",
        "ant_speed_w_fp8-delayed"]
    assert cells[1].recipes == ("bf16", "fp8-delayed")
    progs = cells[1].programs()
    alone = cells[3].programs()["bf16"]
    assert set(progs) == {"bf16", "fp8-delayed"}
    # the same computation, timed by the paired cell's kit
    assert progs["bf16"].args == alone.args and progs["bf16"].kit != alone.kit
    assert progs["bf16"].kit[:2] == (L.time_rounds, L.compile_)
    assert alone.kit[:4] == (L.time_fn, L.compile_, L.speed_parts, L.compiled_facts)
    with pytest.raises(ValueError, match="paired"):
        L.check(_params(paired="sometimes"))


class _Standin:
    """An environment of the adapter's interface, no physics (as ``legged.program``'s)."""

    obs_size, action_size = 5, 2

    def reset(self, key, n):
        obs = jax.random.normal(key, (n, self.obs_size), jnp.float32)
        return obs, (obs, jnp.zeros((n,), jnp.int32))

    def step(self, state, action):
        obs, t = state
        nxt = jnp.tanh(obs + jnp.sum(action, -1, keepdims=True))
        t = t + 1
        trunc = t >= 4
        first = jnp.where(trunc[:, None], obs, nxt)
        return first, (first, jnp.where(trunc, 0, t)), jnp.sum(action, -1), \
            jnp.zeros_like(trunc), trunc, nxt


@pytest.mark.slow
def test_a_paired_cell_times_its_recipes_in_rounds(monkeypatch):
    monkeypatch.setattr(pc, "make_env", lambda c: _Standin())
    p = _params(paired=True, sizes=["s"])
    recs = L.cells(p)[1].run(None)
    metrics = ("env_steps_per_s", "loop_ms_per_update", "policy_ms_per_update", "update_ms")
    assert sorted((r["recipe"], r["metric"]) for r in recs) == sorted(
        (r, m) for r in ("bf16", "fp8-delayed") for m in metrics)
    assert len({r["extra"]["run_id"] for r in recs}) == 1
    for r in recs:
        e = r["extra"]
        assert e["timing"] == "paired" and e["paired_with"] == ["bf16", "fp8-delayed"]
        assert r["repeats"] == 3 and len(e["samples_s"]) == len(e["update_samples_ms"]) \
            == len(e["policy_samples_ms"]) == 3
        # a separate cell's extra keys, and the paired ones
        assert set(e) == {"compile_s", "samples_s", "fp8_lowering", "fp8_gemm_calls",
                          "update_memory_bytes", "update_samples_ms",
                          "jax_default_matmul_precision", "timing", "run_id", "paired_with",
                          "policy_samples_ms"}
        if r["metric"] == "policy_ms_per_update":
            assert r["value"] == pytest.approx(np.median(e["policy_samples_ms"]))
        if r["metric"] == "update_ms":
            assert r["value"] == pytest.approx(np.median(e["update_samples_ms"]))
    df = pd.DataFrame(recs)
    ups = A.paired_speedups(df)
    assert list(ups.recipe) == ["fp8-delayed"] and ups.rounds.iloc[0] == 3
    assert ups.physics_share.isna().all()  # no physics record here
    # a paired record's program: the same computation, the paired cell's kit
    rec = {**next(r for r in recs if r["recipe"] == "fp8-delayed"), "profile": "full",
           "sizes": {**recs[0]["sizes"], "env": "ant", "size": "w1024"}}
    settings = L.program_settings(rec)
    assert settings["paired"] is True
    rec["extra"] = {k: v for k, v in rec["extra"].items()
                    if k not in ("timing", "run_id", "paired_with", "policy_samples_ms")}
    assert L.program_settings(rec) == {k: v for k, v in settings.items() if k != "paired"}
