"""repro.schema, the one checker of configuration values: unknown keys with the nearest valid
one suggested, types (a bool is no int, floats finite), ranges from field metadata, each error
one line ``WHERE: PROBLEM`` of the caller's exception class."""

import dataclasses
import math
import re
from typing import Any, Literal

import pytest

from repro import schema
from repro.schema import CHECK, Checker, Range


class Refused(ValueError):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    steps: int = schema.positive(1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Toy:
    repeats: int = schema.positive()
    rate: float = schema.fraction(0.5)
    margin: float = schema.within(0.0, lo=0, hi=32)
    widths: tuple[int, ...] = schema.positive((1,))
    pair: tuple[int, str] = (1, "a")
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    seed: int | None = None
    mode: Literal["a", "b"] = "a"
    inner: Inner | None = None
    anything: Any = None
    flag: bool = dataclasses.field(default=False, metadata={"cli": True})


def refused(values: dict, checker: Checker = CHECK) -> str:
    with pytest.raises(ValueError) as e:
        checker.build(Toy, values, "toy")
    assert "\n" not in str(e.value)
    return str(e.value)


def test_an_unknown_key_names_the_nearest_valid_one():
    with pytest.raises(Refused, match=re.escape(
            "toy.repets: unknown key (did you mean 'repeats'?); valid keys: repeats, rate")):
        Checker(Refused).check_keys({"repeats": 1, "repets": 2}, ["repeats", "rate"],
                                    lambda key: f"toy.{key}")
    with pytest.raises(ValueError, match=r"^toy\.zzz: unknown key; valid keys: repeats$"):
        CHECK.check_keys({"zzz": 1}, ["repeats"], lambda key: f"toy.{key}")
    assert schema.suggest("n_sample", ["seed", "n_samples"]) == " (did you mean 'n_samples'?)"
    assert schema.suggest("qqq", ["seed", "n_samples"]) == ""
    assert schema.yaml_fields(Toy)[-1] == "anything"  # the command line's field is no key


def test_a_nested_unknown_key_is_named_by_its_path():
    assert refused({"repeats": 1, "inner": {"stepz": 2}}) == \
        "toy.inner.stepz: unknown key (did you mean 'steps'?); valid keys: steps"
    assert refused({"repeats": 1, "inner": {"steps": 0}}) == "toy.inner.steps: must be > 0, got 0"
    assert refused({}) == "toy: missing key 'repeats'"


@pytest.mark.parametrize("values, says", [
    ({"repeats": "3"}, "toy.repeats: expected int, got '3'"),
    ({"repeats": 2.0}, "toy.repeats: expected int, got 2.0"),
    ({"repeats": 1, "seed": "x"}, "toy.seed: expected int or None, got 'x'"),
    ({"repeats": 1, "pair": [1, 2]}, "toy.pair[1]: expected str, got 2"),
    ({"repeats": 1, "pair": [1]}, "toy.pair: expected a list of 2, got [1]"),
    ({"repeats": 1, "widths": 3}, "toy.widths: expected a list, got 3"),
    ({"repeats": 1, "sizes": {"a": "b"}}, "toy.sizes.a: expected int, got 'b'"),
    ({"repeats": 1, "sizes": [1]}, "toy.sizes: expected a mapping, got [1]"),
    ({"repeats": 1, "mode": "c"}, "toy.mode: expected one of ['a', 'b'], got 'c'"),
    ({"repeats": 1, "rate": "0.5"}, "toy.rate: expected float, got '0.5'"),
])
def test_a_value_of_the_wrong_type_is_named_with_the_type_it_needs(values, says):
    assert refused(values) == says


def test_a_bool_is_not_an_int_nor_a_float():
    assert refused({"repeats": True}) == "toy.repeats: expected int, got True"
    assert refused({"repeats": 1, "rate": False}) == "toy.rate: expected float, got False"
    assert not CHECK.conforms(True, int) and not CHECK.conforms(1, bool)
    assert CHECK.conforms(1, int) and CHECK.conforms(True, bool)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_float_is_refused(bad):
    assert refused({"repeats": 1, "margin": bad}) == \
        f"toy.margin: expected a finite number, got {bad!r}"
    assert not CHECK.conforms(bad, float) and not CHECK.conforms((1.0, bad), tuple[float, ...])


def test_conversion_and_conforms():
    got = CHECK.build(Toy, {"repeats": 2, "rate": 1, "widths": [3, 4], "pair": [5, "b"],
                            "inner": {"steps": 7}, "seed": None}, "toy")
    assert got == Toy(repeats=2, rate=1.0, widths=(3, 4), pair=(5, "b"), inner=Inner(steps=7))
    assert type(got.rate) is float and type(got.widths) is tuple
    assert CHECK.conforms(3, float)  # an int stands for a float
    assert CHECK.conforms((1, 2), tuple[int, ...]) and not CHECK.conforms([1, 2], tuple[int, ...])
    assert CHECK.conforms(None, float | None) and not CHECK.conforms("x", float | None)
    assert CHECK.conforms({"a": 1}, dict) and not CHECK.conforms([("a", 1)], dict)


@pytest.mark.parametrize("values, says", [
    ({"repeats": 0}, "toy.repeats: must be > 0, got 0"),
    ({"repeats": 1, "widths": [2, -1]}, "toy.widths: must be > 0, got -1"),
    ({"repeats": 1, "rate": 0}, "toy.rate: must be a fraction in (0, 1], got 0.0"),
    ({"repeats": 1, "rate": 1.5}, "toy.rate: must be a fraction in (0, 1], got 1.5"),
    ({"repeats": 1, "margin": -1}, "toy.margin: must be in [0, 32], got -1.0"),
    ({"repeats": 1, "margin": 33}, "toy.margin: must be in [0, 32], got 33.0"),
])
def test_range_metadata_is_checked(values, says):
    assert refused(values) == says


def test_range_ends_and_their_names():
    assert [x in schema.POSITIVE for x in (-1, 0, 1e-9)] == [False, False, True]
    assert [x in schema.FRACTION for x in (0, 0.5, 1, 1.01)] == [False, True, True, False]
    half_open = Range(0, 1, hi_open=True)
    assert [x in half_open for x in (-0.1, 0, 1)] == [False, True, False]
    assert [str(r) for r in (schema.POSITIVE, schema.NONNEGATIVE, Range(1), Range(0, 1),
                             schema.FRACTION, half_open)] == \
        ["> 0", ">= 0", ">= 1", "in [0, 1]", "in (0, 1]", "in [0, 1)"]


def test_the_callers_exception_int_range_and_own_check():
    seen = []
    checker = Checker(Refused, (0, 10), lambda f, v, at: seen.append((f.name, v, at)))
    with pytest.raises(Refused, match=re.escape(
            "toy.repeats: 11 is out of range: expected an integer in [0, 10]")):
        checker.build(Toy, {"repeats": 11}, "toy")
    with pytest.raises(Refused, match=re.escape("must be > 0, got 0 (an integer in [1, 10])")):
        checker.build(Toy, {"repeats": 0}, "toy")
    checker.build(Toy, {"repeats": 3}, "toy", where={"repeats": "file: toy.common.repeats"})
    assert seen == [("repeats", 3, "file: toy.common.repeats")]
    assert CHECK.build(Toy, {"repeats": 2**40}, "toy").repeats == 2**40  # no range: any int
