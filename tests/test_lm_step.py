"""The LM train-step benchmark (experiment lm_step): a tiny cell on the CPU records every
recipe with its timing and compiled-program facts; bad input fails in one line before any
compilation; cells are resumable."""

import json

import numpy as np
import pytest
import yaml

from repro import cli, studies
from repro.config import ConfigError
from repro.experiments.lm_step import measure as lm_step
from repro.models import lm as M
from repro.precision import resolve
from repro.studies import runner

RECIPES = ["bf16", "fp8-current", "mxfp8"]  # 16-bit, emulated FP8 (CPU), emulated block-scaled
SMOKE = {"sizes": ["tiny"], "batch": 2, "repeats": 2, "steps_per_sample": 1, "recipes": RECIPES}


@pytest.mark.slow
def test_smoke_cell_records_every_recipe(tmp_path):
    p = lm_step.Params(profile="smoke", sizes=("tiny",), batch=2, repeats=2, steps_per_sample=1,
                       recipes=tuple(RECIPES))
    written = runner.run(lm_step.STUDY, p, tmp_path, progress=False).written
    assert [p.relative_to(tmp_path).parts[1:] for p in written] == [("lm_step", "tiny_b2.json")]
    assert runner.run(lm_step.STUDY, p, tmp_path, progress=False).written == []  # resumable
    recs = json.loads(written[0].read_text())
    by = {(r["recipe"], r["metric"]): r for r in recs}
    tokens = 2 * 64  # batch x the tiny preset's seq_len
    for recipe in RECIPES:
        t = by[(recipe, "step_time_ms")]
        assert t["experiment"] == "lm_step" and t["profile"] == "smoke"
        assert t["value"] > 0 and np.isfinite(t["value"]) and t["repeats"] == 2
        samples = t["extra"]["samples_ms"]
        assert len(samples) == 2 and t["value"] == pytest.approx(np.median(samples), abs=1e-3)
        assert t["spread"] == pytest.approx(np.subtract(*np.percentile(samples, [75, 25])),
                                            abs=1e-3)
        assert t["sizes"] == {"model": "tiny", "batch": 2, "seq_len": 64, "tokens": tokens,
                              "d_model": 64, "n_layers": 2, "params": t["sizes"]["params"]}
        # tokens per second: the tokens of one step over the median step time
        tps = by[(recipe, "tokens_per_s")]
        assert tps["value"] == pytest.approx(tokens / (t["value"] / 1e3), rel=1e-3)
        for key in ("hlo_bytes_accessed", "hlo_flops", "hlo_kernels", "fp8_lowering"):
            assert key in t["extra"], key
        assert t["extra"]["hlo_flops"] > 0 and t["extra"]["hlo_kernels"] > 0
        assert by[(recipe, "compile_time_s")]["value"] == t["extra"]["compile_s"] > 0
        assert by[(recipe, "step_memory_bytes")]["value"] > 0
    # no FP8/MXFP8 tensor cores on a CPU: those timings must say they are emulated
    assert not by[("bf16", "step_time_ms")]["emulated"]
    assert by[("fp8-current", "step_time_ms")]["emulated"]
    assert by[("mxfp8", "step_time_ms")]["emulated"]
    # all recipes of a cell come from one interleaved run
    assert len({r["extra"]["run_id"] for r in recs}) == 1
    # FP8 programs compute more than the BF16 one (quantization), same model and batch
    assert (by[("fp8-current", "step_time_ms")]["extra"]["hlo_kernels"]
            > by[("bf16", "step_time_ms")]["extra"]["hlo_kernels"])


@pytest.mark.parametrize("change, message", [
    ({"sizes": ["tiny", "huge"]}, "unknown model size 'huge'; presets: tiny, 20m, 120m"),
    ({"recipes": ["bf16", "fp9"]}, "params.yaml: lm_step.smoke.recipes: unknown recipe 'fp9'"),
    ({"batch": {"20m": 64}}, "no batch size for model 'tiny'"),
    ({"batch": 0}, "batch size(s) 0 for model 'tiny' must be positive integers"),
])
def test_bad_input_fails_in_one_line_before_compiling(tmp_path, monkeypatch, capsys, change,
                                                      message):
    def no_bench(*a, **k):
        raise AssertionError("bench_cell called: the check came too late")

    monkeypatch.setattr(lm_step, "bench_cell", no_bench)
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"profile": "smoke", "lm_step": {"smoke": {**SMOKE, **change}, "full": dict(SMOKE)}}))
    with pytest.raises(ConfigError) as e:
        studies.record("lm_step", "smoke")
    assert message in str(e.value) and "\n" not in str(e.value)
    # the same through the command line: exit 2, one line on stderr, nothing written
    assert cli.main(["record", "lm_step", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repro: error: ") and message in err[0]
    assert not any(tmp_path.rglob("*.json"))


def test_bench_cell_checks_recipes_before_compiling(monkeypatch):
    from repro.models import lm_train as T

    def no_compile(*a, **k):
        raise AssertionError("compiled before checking the recipes")

    monkeypatch.setattr(T, "_functions", no_compile)
    with pytest.raises(ConfigError, match="unknown recipe"):
        lm_step.bench_cell("tiny", 2, ["bf16", "not-a-recipe"], repeats=1)
    with pytest.raises(ConfigError, match="unknown model size"):
        lm_step.bench_cell("7b", 2, ["bf16"], repeats=1)


def test_registered_and_params_order():
    assert studies.study("lm_step") is lm_step.STUDY
    full = studies.params("lm_step", "full")
    # lm.full.runs' sizes; 120m at batch 4 and wide2 also fit a 16 GiB TPU v5e; wide is the
    # speed config
    assert [c.name for c in lm_step.cells(full)] == ["120m_b32", "120m_b4", "20m_b64", "wide_b8",
                                                     "wide2_b8"]
    lm_step.check(full)  # the memory of this device is left to each cell as it starts
    wide = M.PRESETS["wide"]
    assert (wide.d_model, wide.n_layers, wide.seq_len) == (4096, 4, 2048)
    # BF16 and the FP8 recipes only: block-scaled recipes are emulated on Hopper (not speed);
    # after them variants of the FP8 ones, which compute the same values
    assert full.recipes[:3] == ("bf16", "fp8-delayed", "fp8-current")
    for r in full.recipes[3:]:
        rr = resolve(r)
        assert rr.base is None and r.split(":")[0] in full.recipes[1:3]
        assert rr.amax_history == "ring" or rr.fp8_weights == "stored", r
    smoke = studies.params("lm_step", "smoke")
    lm_step.check(smoke)
    assert [c.name for c in lm_step.cells(smoke)] == ["tiny_b2"] and smoke.repeats <= 3
