"""One colour per precision name across every figure (repro/plotstyle.py)."""

import itertools

from matplotlib.colors import to_rgb

from repro import plotstyle
from repro.experiments.gemm import measure as gemm
from repro.precision import export, recipes


def _distance(a, b):
    return max(abs(x - y) for x, y in zip(to_rgb(a), to_rgb(b)))


def test_every_recipe_has_its_own_colour():
    names = list(recipes.REGISTRY)
    colours = [plotstyle.color(n) for n in names]
    for (a, ca), (b, cb) in itertools.combinations(zip(names, colours), 2):
        assert _distance(ca, cb) > 0.03, (a, b, ca, cb)
    # no recipe falls back to the hash of its name: each is named in the table
    assert set(names) <= set(plotstyle._TABLE)


def test_formats_and_dtypes_are_named_and_distinct_among_themselves():
    for group in (list(export.FORMATS), list(gemm.GEMM_DTYPES),
                  ["bf16-e2e", "fp8-rollout", "fp8-e2e", "fp8-e2e-no-is"],
                  ["E4M3", "E5M2", "E2M1", "MXFP8", "NVFP4"]):
        assert {n.lower() for n in group} <= set(plotstyle._TABLE), group
        colours = [plotstyle.color(n) for n in group]
        assert len(set(colours)) == len(group), group


def test_references_differ_in_colour_and_line_style_from_fp8():
    refs = [plotstyle.style(n) for n in ("fp32", "bf16", "fp16")]
    assert len({r["color"] for r in refs}) == 3
    assert all(r["ls"] != "-" for r in refs)
    assert plotstyle.style("fp8-current")["ls"] == "-"


def test_same_name_same_style_and_unknown_names_are_deterministic():
    assert plotstyle.style("fp8-delayed") == plotstyle.style("fp8-delayed")
    assert plotstyle.color("FP8-Delayed") == plotstyle.color("fp8-delayed")
    assert plotstyle.color("some-new-recipe") == plotstyle.color("some-new-recipe")
    assert plotstyle.color("some-new-recipe") != plotstyle.color("another-recipe")
    # a variant keeps its recipe's line style and is not its recipe's colour
    assert plotstyle.style("bf16:margin=1")["ls"] == plotstyle.style("bf16")["ls"]
    assert plotstyle.color("bf16:margin=1") != plotstyle.color("bf16")
    assert plotstyle.palette(["bf16", "fp16", "bf16"]) == {
        "bf16": plotstyle.color("bf16"), "fp16": plotstyle.color("fp16")}


def test_round_range_spans_the_rounds_of_a_rate_and_of_a_time():
    import pandas as pd

    from repro.analysis import stats

    df = pd.DataFrame([
        {"value": 100.0, "unit": "steps/s", "spread": 5.0, "extra": {"samples_s": [1, 2, 4]}},
        {"value": 10.0, "unit": "ms", "spread": 1.0, "extra": {"samples_ms": [8, 10, 12]}},
        {"value": 7.0, "unit": "bytes", "spread": None, "extra": {"samples_ms": [8, 10]}}])
    r = stats.round_range(df)
    assert list(r.lo) == [50.0, 8.0, 7.0] and list(r.hi) == [200.0, 12.0, 7.0]


def test_round_ratio_range_pairs_rounds():
    import math

    from repro.analysis import stats

    assert stats.round_ratio_range([2, 3, 4], [1, 2, 2]) == (1.5, 2.0)
    assert all(math.isnan(x) for x in stats.round_ratio_range([1, 2], [1]))


def test_seed_band_draws_the_mean_and_a_band_only_over_three_seeds_or_more():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots()
    line = plotstyle.seed_band(ax, [0, 1, 2], [[1, 2, np.nan], [3, 4, 5], [2, 3, 5]],
                               "#000000")
    assert list(line.get_ydata()) == [2, 3, 5] and len(ax.collections) == 1
    fig, ax = plt.subplots()  # two seeds: each drawn, no band (its t-interval says little)
    line = plotstyle.seed_band(ax, [0, 1, 2], [[1, 2, np.nan], [3, 4, 5]], "#000000")
    assert list(line.get_ydata()) == [2, 3, 5] and not ax.collections and len(ax.lines) == 3
    fig, ax = plt.subplots()
    plotstyle.seed_band(ax, [0, 1], [[1, 2]], "#000000")
    assert not ax.collections and len(ax.lines) == 1
    plt.close("all")


def test_markers_are_filled_so_seaborn_can_mix_them():
    from matplotlib.markers import MarkerStyle

    names = list(plotstyle._TABLE) + ["unknown-a", "unknown-b", "bf16:x=1"]
    assert all(MarkerStyle(m).is_filled() for m in plotstyle.markers(names).values())


def test_each_machine_is_named_with_the_8_bit_format_it_multiplies_natively():
    """From the registry's arithmetic, not from a list: FP8 where a machine has FP8 (an
    H200, a B200), INT8 where it has INT8 matrix units and no FP8 (a TPU v5e, an A100),
    none on a CPU (emulated); a machine the registry does not know is named as it is."""
    assert plotstyle.hardware_title("h200") == "H200 (8-bit: FP8)"
    assert plotstyle.hardware_title("tpu-v5e") == "TPU v5e (8-bit: INT8)"
    assert plotstyle.hardware_title("cpu") == f"CPU ({plotstyle.NO_EIGHT_BIT})"
    assert [plotstyle.eight_bit(s) for s in ("b200", "a100-sxm", "tpu-v6e", "cpu", "nope")] \
        == ["FP8", "INT8", "INT8", None, None]
    assert plotstyle.hardware_title("nope") == "nope (8-bit format unknown)"
    assert plotstyle.hardware_order(["cpu", "tpu-v5e", "nope", "h200", "b200", "h200"]) == \
        ["b200", "h200", "tpu-v5e", "cpu", "nope"]


def test_a_recipe_or_format_names_its_8_bit_format_and_a_speed_figure_drops_the_cpu():
    import pandas as pd

    names = ["fp8-delayed", "flax-fp8", "mxfp8", "fp8-w", "int8", "int8-auto", "int8-w",
             "bf16", "fp32", "nvfp4"]
    assert [plotstyle.format_of(n) for n in names] == ["FP8"] * 4 + ["INT8"] * 3 + [None] * 3
    df = pd.DataFrame({"hardware": ["h200", "cpu", "tpu-v5e", "nope"], "value": [1, 2, 3, 4]})
    assert list(plotstyle.accelerators(df).hardware) == ["h200", "tpu-v5e", "nope"]
    assert plotstyle.accelerators(df.iloc[:0]).empty
