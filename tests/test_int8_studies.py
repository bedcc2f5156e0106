"""The INT8 recipes in the studies a TPU v5e records (gemm, mlp_step, rl_throughput, lm_step,
rl_quality): ``--recipe`` makes cells of their own beside BF16 without masking the cells of
params.yaml, records say how INT8 ran, and the FP32 baseline's every product is real FP32."""

import collections
import re

import jax
import pytest

from repro import studies
from repro.studies import runner


def plan(experiment, only=None, recipes=None, profile="full"):
    st = studies.study(experiment)
    chosen, every = runner.plan(st, studies.params(experiment, profile), only, recipes)
    return [(c.name, tuple(c.recipes)) for c in chosen], [c.name for c in every]


def test_mlp_step_recipe_selection_times_int8_beside_bf16_in_cells_of_its_own():
    chosen, every = plan("mlp_step", recipes=["int8"])
    assert [n for n, _ in chosen] == [f"w{w}_b65536_d3_bf16-int8"
                                      for w in (4096, 2048, 1024, 512, 256)]
    main, _ = plan("mlp_step")
    assert "w4096_b65536_d3" in [n for n, _ in main]  # the main cells are unchanged
    st = studies.study("mlp_step")
    p = st.narrow(studies.params("mlp_step", "full"), ["int8"])
    cell = next(c for c in st.cells(p) if c.name == "w1024_b65536_d3_bf16-int8")
    assert list(cell.programs()) == ["bf16", "int8"]
    with pytest.raises(ValueError, match="unknown recipe 'int9'"):
        st.narrow(studies.params("mlp_step", "full"), ["int9"])


def test_rl_throughput_paired_cells_of_a_selection():
    chosen, _ = plan("rl_throughput", ["*_paired*"], ["int8", "fp32"])
    assert chosen == [(f"mlp_w{w}_e{n}_paired_bf16-int8-fp32", ("bf16", "int8", "fp32"))
                      for w in (4096, 2048) for n in (2048, 256)]
    # a selection within paired_recipes keeps their own paired cells, as before
    fp8, _ = plan("rl_throughput", ["*_paired*"], ["bf16", "fp8-delayed"])
    assert [n for n, _ in fp8] == [f"mlp_w{w}_e{n}_paired" for w in (4096, 2048)
                                   for n in (2048, 256)]
    assert fp8[0][1] == ("fp16", "bf16", "fp8-delayed", "fp8-current")
    single, _ = plan("rl_throughput", ["mlp_w1024_*_e2048"], ["int8", "bf16", "fp32"])
    assert single == [("mlp_w1024_int8_e2048", ("int8",)), ("mlp_w1024_bf16_e2048", ("bf16",)),
                      ("mlp_w1024_fp32_e2048", ("fp32",))]
    plain, _ = plan("rl_throughput", ["*_paired*"])
    assert [n for n, _ in plain][0] == "mlp_w4096_e2048_paired"


def test_lm_step_wide_and_selection_and_memory_left_to_each_cell():
    chosen, every = plan("lm_step", ["120m_b4*", "wide2_*"], ["int8"])
    assert [n for n, _ in chosen] == ["120m_b4_bf16-int8", "wide2_b8_bf16-int8"]
    assert every == ["120m_b32_bf16-int8", "120m_b4_bf16-int8", "20m_b64_bf16-int8",
                     "wide_b8_bf16-int8", "wide2_b8_bf16-int8"]
    from repro.models import lm as M
    from repro.models import lm_data as D
    from repro.precision import resolve

    wide = M.get_config("wide2")
    assert (wide.d_model, wide.d_ff, wide.n_layers) == (4096, 11008, 2)
    v5e = int(15.7 * 2 ** 30)  # a TPU v5e's memory: the wide2 cell and 120m at batch 4 fit
    for size, batch, fits in (("wide2", 8, True), ("120m", 4, True), ("120m", 32, False)):
        est = D.estimate_train_bytes(M.get_config(size), batch, resolve("int8"),
                                     flash_attention=False)["total"]
        assert (est <= 0.9 * v5e) is fits, (size, batch, est / 2 ** 30)


def test_gemm_and_rl_quality_select_int8():
    chosen, _ = plan("gemm", ["4096x4096x4096*", "65536x4096x4096*"], ["int8", "bf16", "fp32"])
    assert chosen == [("4096x4096x4096_int8-bf16-fp32", ("int8", "bf16", "fp32")),
                      ("65536x4096x4096_int8-bf16-fp32", ("int8", "bf16", "fp32"))]
    chosen, _ = plan("rl_quality", ["Breakout-MinAtar_*"], ["int8", "fp32"])
    assert [n for n, _ in chosen] == ["Breakout-MinAtar_random", "Breakout-MinAtar_fp32",
                                      "Breakout-MinAtar_int8"]


def test_mlp_step_int8_records_say_how_int8_ran():
    from repro.experiments.mlp_step import measure as X

    recs = X.bench_cell(64, 64, 2, ["bf16", "int8"], repeats=1, steps_per_sample=1,
                        profile="smoke")
    by = {(r["recipe"], r["metric"]): r for r in recs}
    int8, bf16 = by["int8", "step_time_ms"], by["bf16", "step_time_ms"]
    # two layers: two forward GEMMs, one data gradient (the input's is not computed), two
    # weight gradients. XLA:CPU multiplies the first three s8 x s8 -> s32 and converts the
    # weight gradients' operands to s32 first: partly INT8, as the labels say
    assert int8["extra"]["int8_products"] == {"s8": 3, "widened": 2}
    assert int8["extra"]["int8_lowering"] == "s8-partial"
    assert int8["emulated"] is True  # a CPU has no INT8 matrix units anyway
    assert bf16["emulated"] is False and "int8_lowering" not in bf16["extra"]


def _products(fn, args) -> collections.Counter:
    """(primitive, precision) of every product in ``fn``'s jaxpr."""
    lines = str(jax.make_jaxpr(fn)(*args)).splitlines()
    out = collections.Counter()
    for i, line in enumerate(lines):
        m = re.search(r"= (dot_general|conv_general_dilated)\[", line)
        if m:
            p = re.search(r"precision=(\(\S+, \S+\)|None)", "\n".join(lines[i:i + 16]))
            out[(m.group(1), p.group(1) if p else None)] += 1
    return out


@pytest.mark.parametrize("network,env", [("mlp", "CartPole-v1"), ("cnn", "Breakout-MinAtar")])
def test_fp32_ppo_update_runs_every_product_at_highest_precision(network, env):
    """On a TPU, JAX's default precision computes FP32 products in BF16: the fp32 baseline
    of the RL studies asks for Precision.HIGHEST in every GEMM and convolution, forward and
    backward. INT8's update has its INT8 products (three per quantized layer)."""
    from repro.experiments.rl_throughput import measure as X

    _, prog = X.update_step_program(network, 64, "fp32", 4, env, 8, 1, 2, 1, 1)
    found = _products(prog.fn, prog.args)
    assert sum(found.values()) >= 10
    assert set(p for _, p in found) == {"(Precision.HIGHEST, Precision.HIGHEST)"}, found
    _, prog = X.update_step_program(network, 64, "int8", 4, env, 8, 1, 2, 1, 1)
    text = str(jax.make_jaxpr(prog.fn)(*prog.args))
    assert text.count("preferred_element_type=int32") == (6 if network == "mlp" else 3)
