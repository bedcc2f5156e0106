"""Checking values against dataclass fields: the one engine behind every configuration check.

``params.yaml``'s sections (:mod:`repro.config`), the PPO and GRPO configurations, recipe
variants, the legged section and verdict files all check their values here, so every error
reads the same: one line, ``WHERE: PROBLEM``, naming where the value is and what is wrong::

    params.yaml: gemm.smoke.repets: unknown key (did you mean 'repeats'?); valid keys: ...
    params.yaml: gemm.smoke.repeats: expected int, got '3'

* :func:`suggest`: the ``" (did you mean 'x'?)"`` hint for a misspelt name (difflib);
* :class:`Checker`: ``check_keys`` (unknown keys refused, the nearest valid one suggested),
  ``convert`` (a value converted to an annotated type: ``int``, ``float`` -- finite, an int
  taken as a float --, ``str``, ``bool``, ``Any``, ``None``, ``Literal``, unions, tuples,
  lists, dicts and nested dataclasses; a bool is never an int), ``conforms`` (a value already
  of a type) and ``build`` (a dataclass from a mapping, every field converted and its range
  rule checked);
* :class:`Range` and the field makers :func:`positive`, :func:`fraction`, :func:`within`: the
  range rules a field's metadata carries.

A :class:`Checker` carries the exception class its caller raises, so each keeps its own
(``repro.config.ConfigError`` for params.yaml, ``ValueError`` elsewhere). Nothing here
imports the rest of the package.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any, Callable, Iterable, Literal, Union

def suggest(word: Any, valid: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` with the valid name nearest ``word``, or ``""``."""
    near = difflib.get_close_matches(str(word), list(valid), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


# --------------------------------------------------------------------------------- ranges


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers in ``lo .. hi``, each end included unless it is open."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, x: Any) -> bool:
        return ((self.lo < x if self.lo_open else self.lo <= x)
                and (x < self.hi if self.hi_open else x <= self.hi))

    def __str__(self) -> str:
        """``> 0``, ``>= 1``, ``in [0, 1]``, ``in (0, 1]``, ``in [0, 1)``."""
        if self.hi == math.inf:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        return (f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
                f"{')' if self.hi_open else ']'}")


POSITIVE = Range(0, math.inf, lo_open=True)
NONNEGATIVE = Range(0)
FRACTION = Range(0, 1, lo_open=True)


def positive(default: Any = dataclasses.MISSING, **kw) -> Any:
    """A dataclass field whose numbers (every one, in lists too) must be > 0."""
    return dataclasses.field(default=default, metadata={"positive": True}, **kw)


def fraction(default: Any = dataclasses.MISSING, **kw) -> Any:
    """A dataclass field holding a fraction: a number in (0, 1]."""
    return dataclasses.field(default=default, metadata={"fraction": True}, **kw)


def within(default: Any = dataclasses.MISSING, lo: float = 0.0, hi: float = math.inf, **kw
           ) -> Any:
    """A dataclass field holding a number in ``[lo, hi]`` (a rate that may be 0, a ratio)."""
    return dataclasses.field(default=default, metadata={"within": (lo, hi)}, **kw)


def type_name(tp: Any) -> str:
    """How an error names a type: ``int``, ``float or None``, ``dict[str, int]``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    if typing.get_args(tp):
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def yaml_fields(schema: type) -> list[str]:
    """The fields of ``schema`` a file may set: those not marked ``cli`` (set by the command
    line)."""
    return [f.name for f in dataclasses.fields(schema) if not f.metadata.get("cli")]


@functools.cache
def hints(schema: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass's fields."""
    return typing.get_type_hints(schema)


@dataclasses.dataclass(frozen=True)
class Checker:
    """How one caller checks: the exception it raises (``error``), the range every int must
    lie in (``int_range``, None: any) and its own check of a field's converted value
    (``check(field, value, where)``, e.g. recipe names; None: none)."""

    error: type[Exception] = ValueError
    int_range: tuple[int, int] | None = None
    check: Callable[[dataclasses.Field, Any, str], None] | None = None

    def fail(self, where: str, problem: str) -> typing.NoReturn:
        """Raise ``error("WHERE: PROBLEM")``."""
        raise self.error(f"{where}: {problem}")

    def check_keys(self, values: Iterable[Any], valid: Iterable[str],
                   where: Callable[[Any], str]) -> None:
        """Every key of ``values`` one of ``valid``; else ``WHERE: unknown key (did you mean
        ...?); valid keys: ...``, ``where(key)`` naming where the key is."""
        valid = list(valid)
        for key in values:
            if key not in valid:
                self.fail(where(key), f"unknown key{suggest(key, valid)}; valid keys: "
                          f"{', '.join(valid)}")

    def convert(self, v: Any, tp: Any, at: str) -> Any:
        """``v`` as a value of the annotated type ``tp`` (see the module docstring), or a
        one-line error naming ``at``."""
        origin = typing.get_origin(tp) or (tp if tp in (list, tuple, dict) else None)
        args = typing.get_args(tp)
        if tp is Any:
            return v
        if tp is type(None) and v is None:
            return None
        if origin in (Union, types.UnionType):
            if v is None and type(None) in args:
                return None
            options = [a for a in args if a is not type(None)]
            if len(options) == 1 and dataclasses.is_dataclass(options[0]) and \
                    isinstance(v, dict):  # a section or None: name the key that is wrong
                return self.convert(v, options[0], at)
            for option in options:
                try:
                    return self.convert(v, option, at)
                except self.error:
                    continue
            self.fail(at, f"expected {type_name(tp)}, got {v!r}")
        if origin is Literal:
            if any(v == a and type(v) is type(a) for a in args):
                return v
            self.fail(at, f"expected one of {list(args)}, got {v!r}")
        if dataclasses.is_dataclass(tp):
            if not isinstance(v, dict):
                self.fail(at, f"expected a mapping, got {v!r}")
            self.check_keys(v, yaml_fields(tp), lambda key: f"{at}.{key}")
            return self.build(tp, v, at)
        if origin in (list, tuple):
            if not isinstance(v, (list, tuple)):
                self.fail(at, f"expected a list, got {v!r}")
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(v) != len(args):
                    self.fail(at, f"expected a list of {len(args)}, got {v!r}")
                return tuple(self.convert(x, a, f"{at}[{i}]")
                             for i, (x, a) in enumerate(zip(v, args)))
            item = args[0] if args else Any
            return origin(self.convert(x, item, f"{at}[{i}]") for i, x in enumerate(v))
        if origin is dict:
            if not isinstance(v, dict):
                self.fail(at, f"expected a mapping, got {v!r}")
            kt, vt = args or (Any, Any)
            return {self.convert(k, kt, at): self.convert(x, vt, f"{at}.{k}")
                    for k, x in v.items()}
        if tp is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            if not math.isfinite(v):
                self.fail(at, f"expected a finite number, got {v!r}")
            return float(v)
        lo, hi = self.int_range or (-math.inf, math.inf)
        if tp is int and type(v) is int and not lo <= v <= hi:
            self.fail(at, f"{v} is out of range: expected an integer in [{lo}, {hi}]")
        if tp in (int, str, bool) and type(v) is tp:
            return v
        self.fail(at, f"expected {type_name(tp)}, got {v!r}")

    def conforms(self, v: Any, tp: Any) -> bool:
        """``v`` already is of the annotated type ``tp``: :meth:`convert` keeps it as it is
        (an int stands for a float; floats finite; a tuple for a tuple type, not a list)."""
        try:
            got = self.convert(v, tp, "")
        except self.error:
            return False
        return got == v and (type(got) is type(v) or isinstance(got, float))

    def check_range(self, v: Any, metadata: typing.Mapping[str, Any], at: str) -> None:
        """The range rule of a field's ``metadata`` (:func:`positive`, :func:`fraction`,
        :func:`within`) for its value ``v`` (None passes)."""
        if v is None:
            return
        if metadata.get("positive"):
            self._check_positive(v, at)
        if metadata.get("fraction") and v not in FRACTION:
            self.fail(at, f"must be a fraction in (0, 1], got {v!r}")
        if "within" in metadata and v not in Range(*metadata["within"]):
            lo, hi = metadata["within"]
            self.fail(at, f"must be in [{lo:g}, {hi:g}], got {v!r}")

    def _check_positive(self, v: Any, at: str) -> None:
        if isinstance(v, bool) or v is None:
            return
        if isinstance(v, (int, float)) and v not in POSITIVE:
            self.fail(at, f"must be > 0, got {v!r}" + (
                f" (an integer in [1, {self.int_range[1]}])"
                if isinstance(v, int) and self.int_range else ""))
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()
        for x in items:
            self._check_positive(x, at)

    def build(self, schema: type, values: dict, path: str, where: dict[str, str] | None = None):
        """``schema(**values)`` with every value converted to its field's type, its range rule
        and the caller's ``check`` passed; ``where``: field -> where its value came from (else
        ``path.field``)."""
        kwargs = {}
        for f in dataclasses.fields(schema):
            at = where[f.name] if where and f.name in where else f"{path}.{f.name}"
            if f.name not in values:
                if f.default is dataclasses.MISSING and \
                        f.default_factory is dataclasses.MISSING:
                    self.fail(path, f"missing key {f.name!r}")
                continue
            v = self.convert(values[f.name], hints(schema)[f.name], at)
            self.check_range(v, f.metadata, at)
            if self.check is not None:
                self.check(f, v, at)
            kwargs[f.name] = v
        return schema(**kwargs)


CHECK = Checker()  # ValueError, any int, no check of its own


