import numpy as np
import pytest

from repro.experiments.mlp_step import measure as mlp_step
from repro.precision import resolve


def test_step_flops_by_hand():
    # 2 layers of 8x8 on 4 rows: forward 2*4*8*8, dgrad and wgrad as much again each.
    assert mlp_step.step_flops(4, 8, 2) == 2 * 3 * (2 * 4 * 8 * 8)


def test_bench_cell_records_every_recipe(monkeypatch, tmp_path):
    recs = mlp_step.bench_cell(32, 64, 2, ["bf16", "fp8-current", "flax-fp8"], repeats=2,
                               steps_per_sample=1)
    by = {(r["recipe"], r["metric"]): r for r in recs}
    for recipe in ["bf16", "fp8-current", "flax-fp8"]:
        t = by[(recipe, "step_time_ms")]
        assert t["value"] > 0 and np.isfinite(t["value"]) and t["repeats"] == 2
        assert len(t["extra"]["samples_ms"]) == 2
    # On a CPU no FP8 tensor core exists: FP8 timings must say they are emulated.
    assert by[("fp8-current", "step_time_ms")]["emulated"]
    assert by[("flax-fp8", "step_time_ms")]["emulated"]
    assert not by[("bf16", "step_time_ms")]["emulated"]
    # All recipes of one cell come from one run, so ratios compare like with like.
    assert len({r["extra"]["run_id"] for r in recs}) == 1


@pytest.mark.parametrize("recipe", ["fp8-current", "fp8-delayed"])
def test_fp8_regression_trains_like_bf16(recipe):
    """A regression task (fit random targets) reaches the BF16 loss within 5% after 60 steps."""
    import jax

    def train(r):
        step, variables, opt_state, x, y = mlp_step._setup(resolve(r), 32, 128, 2, lr=3e-3)
        losses = []
        for _ in range(60):
            variables, opt_state, loss = step(variables, opt_state, x, y)
            losses.append(float(loss))
        return losses, variables

    ref, _ = train("bf16")
    got, variables = train(recipe)
    assert ref[-1] < 0.8 * ref[0]  # the task is learnable at all
    assert abs(got[-1] - ref[-1]) < 0.05 * ref[-1]
    assert jax.tree.leaves(variables["params"])[0].dtype == np.float32  # FP32 master weights


def test_record_runs_main_cells_first_then_lever_cells(monkeypatch, tmp_path):
    from repro import results
    from repro.studies import runner

    params = mlp_step.Params(profile="smoke", batch=8, depth=2, repeats=1, widths=(32, 16),
                             recipes=("bf16", "fp8-delayed", "flax-fp8"),
                             levers=("fp8-delayed:fp8_gemm_out=float32",), lever_widths=(32,))
    calls = []

    def fake_cell(width, batch, depth, recipes, repeats, profile=None):
        calls.append((width, tuple(recipes)))
        return [results.make_record(mlp_step.EXPERIMENT, "step_time_ms", 1.0, "ms",
                                    recipe=r, sizes={"width": width}) for r in recipes]

    monkeypatch.setattr(mlp_step, "bench_cell", fake_cell)
    written = runner.run(mlp_step.STUDY, params, tmp_path, progress=False).written
    assert [p.name for p in written] == ["w32_b8_d2.json", "w16_b8_d2.json",
                                         "w32_b8_d2_levers.json"]
    # the lever cell times the ablation with bf16 and the default it ablates
    assert calls[-1] == (32, ("bf16", "fp8-delayed", "fp8-delayed:fp8_gemm_out=float32"))
    assert runner.run(mlp_step.STUDY, params, tmp_path, progress=False).written == []
