"""One colour per precision name across every figure (repro/plotstyle.py)."""

import itertools

from matplotlib.colors import to_rgb

from repro import plotstyle
from repro.precision import export, recipes
from repro.studies import gemm


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
