"""Parameters from ``params.yaml``: the profile and each section, typed and checked once.

``params.yaml`` has a top-level ``profile`` (``smoke``: CPU-sized, minutes; ``full``: the GPU
study; ``auto``: ``full`` when a GPU is present) and one section per experiment or notebook,
each with ``smoke`` and ``full`` sub-sections and optionally ``common``, shared by both.

A study declares its parameters as a frozen dataclass derived from :class:`Section`;
:func:`section` merges ``common`` under the profile's sub-section and builds that dataclass:
types checked (floats finite), sizes positive (fields made with :func:`positive`), fractions in
(0, 1] (:func:`fraction`), numbers in [lo, hi] (:func:`within`), recipe names checked against
the registry (:func:`recipe_names`), unknown keys rejected with the nearest valid key
suggested. Every error is one line naming the file and the key path::

    params.yaml: gemm.smoke.repets: unknown key (did you mean 'repeats'?); valid keys: ...

A field made with :func:`from_cli` is set by the command line (``repro record --purejaxrl``),
never by ``params.yaml``. Notebooks read a section as a plain mapping (:func:`stage_params`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from repro import catalogue, checkout

PROFILES = ("smoke", "full", "auto")
SUBSECTIONS = ("common", "smoke", "full")
# The sections of params.yaml: each study's (repro.studies, Study.params_section) and each
# notebook's (repro.pipeline.STAGES), from repro.catalogue; tests/test_boundaries.py checks
# the list is complete. TOP_LEVEL: the keys params.yaml may have at its top (read when a file
# is loaded: a test that registers a toy study adds its section here).
SECTIONS = catalogue.SECTIONS
TOP_LEVEL = ("profile", *SECTIONS)
# Integers in params.yaml are sizes, counts and seeds: beyond JAX's default integer they
# overflow or run for ever.
INT_RANGE = (-(2**31), 2**31 - 1)


class _UniqueKeys(yaml.SafeLoader):
    """YAML whose mappings refuse a key given twice (YAML keeps the last one silently). Merge
    keys (``<<: *anchor``) work as YAML defines them: the mapping's own keys win over merged
    ones; only a key the mapping itself gives twice is refused."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{Path(self.name).name}: {key}: duplicate key (lines "
                                  f"{seen[key]} and {line}); give each key once")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


class ConfigError(ValueError):
    """A malformed params.yaml or an invalid parameter: one clear line."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
    """Base of every typed section: the profile the values were resolved for."""

    profile: str = dataclasses.field(default="smoke", metadata={"cli": True})


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


def recipe_names(default: Any = dataclasses.MISSING, **kw) -> Any:
    """A dataclass field of recipe names (a name or a list): each must resolve in
    ``repro.precision``'s registry (a ``base:field=value`` variant of an entry included)."""
    return dataclasses.field(default=default, metadata={"recipe": True}, **kw)


def from_cli(default: Any = None) -> Any:
    """A dataclass field the command line sets; ``params.yaml`` may not."""
    return dataclasses.field(default=default, metadata={"cli": True})


# ------------------------------------------------------------------------------- loading


def params_path() -> Path:
    return checkout.repo_root() / "params.yaml"


def _line_column(text: str | bytes, index: int) -> str:
    """``line L, column C`` (both from 1) of position ``index`` of ``text``."""
    nl = "\n" if isinstance(text, str) else b"\n"
    return f"line {text.count(nl, 0, index) + 1}, column {index - text.rfind(nl, 0, index)}"


def read_yaml(path: Path, loader: type = _UniqueKeys) -> Any:
    """The data of the YAML file ``path``, or a one-line :class:`ConfigError` naming the file
    and the position of what is wrong: a file that cannot be read, bytes that are not UTF-8,
    characters YAML does not allow (binary garbage), malformed YAML, a key given twice."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")  # (a byte-order mark is YAML's to skip)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: byte 0x{raw[e.start]:02x} at "
                          f"{_line_column(raw, e.start)} (save it as UTF-8)") from None
    try:
        reader = loader(text)
        reader.name = str(path)
        try:
            return reader.get_single_data()
        finally:
            reader.dispose()
    except yaml.reader.ReaderError as e:
        raise ConfigError(f"{path}: not YAML text: character {chr(e.character)!r} at "
                          f"{_line_column(text, e.position)} ({e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{where}: "
                          f"{' '.join(str(getattr(e, 'problem', e)).split())}") from None


def load_params(path: str | Path | None = None) -> dict[str, Any]:
    """The whole of params.yaml as plain data; a one-line ConfigError naming the file (and the
    position) if it cannot be read or is malformed (:func:`read_yaml`)."""
    path = Path(path or params_path())
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        resolve_profile(data.get("profile", "smoke"))  # validate early
    except ConfigError as e:
        raise ConfigError(f"{path.name}: profile: {e}") from None
    _check_keys(data, TOP_LEVEL, path.name)
    for name in data:
        if name == "profile":
            continue
        if not isinstance(data[name], dict):
            _fail(f"{path.name}: {name}", "expected a mapping of common/smoke/full "
                  f"sub-sections, got {type(data[name]).__name__} {data[name]!r:.60}")
        _check_keys(data[name], SUBSECTIONS, f"{path.name}: {name}")
        _check_seeds(data[name], f"{path.name}: {name}")
    return data


def _check_seeds(value: Any, at: str) -> None:
    """Every ``seeds`` and ``seed`` below ``value`` (a section), wherever it is: a list of
    seeds holds integers >= 0, each once (a seed given twice runs, and counts, one run twice;
    a negative one wraps around where seeds become unsigned keys); a number of seeds is an
    integer >= 1; a ``seed`` an integer >= 0."""
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_seeds(v, f"{at}[{i}]")
        return
    if not isinstance(value, dict):
        return
    for key, v in value.items():
        here = f"{at}.{key}"
        if key == "seeds" and isinstance(v, list):
            seen = set()
            for s in v:
                if not is_int(s):
                    _fail(here, f"{s!r} is not an integer")
                if s < 0:
                    _fail(here, f"{s} is negative: seeds are integers >= 0")
                if s in seen:
                    _fail(here, f"{s} given twice: give each seed once")
                seen.add(s)
        elif key == "seeds" and is_int(v) and v < 1:
            _fail(here, f"{v}: a count of seeds is an integer >= 1")
        elif key == "seed" and is_int(v) and v < 0:
            _fail(here, f"{v} is negative: seeds are integers >= 0")
        else:
            _check_seeds(v, here)


def resolve_profile(profile: str) -> str:
    """``auto`` -> ``full`` on a GPU, else ``smoke``; anything else must be a known profile."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; valid profiles: {', '.join(PROFILES)}")
    if profile == "auto":
        import jax

        return "full" if jax.default_backend() == "gpu" else "smoke"
    return profile


def _merged(name: str, profile: str | None, params: dict[str, Any] | None
            ) -> tuple[dict[str, Any], dict[str, str], str]:
    """(values, key -> where it came from, resolved profile) of one section."""
    params = params if params is not None else load_params()
    profile = resolve_profile(profile or params.get("profile", "smoke"))
    sec = params.get(name)
    if not isinstance(sec, dict):
        raise ConfigError(f"params.yaml has no section {name!r}; sections: "
                          f"{', '.join(k for k, v in params.items() if isinstance(v, dict))}")
    if profile not in sec:
        raise ConfigError(f"params.yaml section {name!r} has no {profile!r} profile")
    values, where = {}, {}
    for sub in ("common", profile):
        part = sec.get(sub) or {}
        if not isinstance(part, dict):
            raise ConfigError(f"params.yaml: {name}.{sub}: expected a mapping, got "
                              f"{type(part).__name__}")
        values.update(part)
        where.update({k: f"{name}.{sub}.{k}" for k in part})
    return values, where, profile


@dataclasses.dataclass(frozen=True, kw_only=True)
class FormatsParams(Section):
    """``formats`` (notebook 01): samples drawn per format."""

    n_samples: int = positive(20000)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerfmodelParams(Section):
    """``perfmodel`` (notebook 06; :func:`repro.perfmodel.project.projection_setup`)."""

    models: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    model_names: list[str] | None = None
    targets: list[str] | None = None


# The sections only a notebook reads (no study checks them): checked by stage_params.
NOTEBOOK_SCHEMAS: dict[str, type] = {"formats": FormatsParams, "perfmodel": PerfmodelParams}


def stage_params(name: str, profile: str | None = None,
                 params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One section for one profile as a plain mapping (``common`` merged under it, and
    ``profile``): what notebooks read; a section only a notebook reads is checked against its
    schema (:data:`NOTEBOOK_SCHEMAS`). Studies take :func:`section` instead."""
    values, _, profile = _merged(name, profile, params)
    if name in NOTEBOOK_SCHEMAS:
        section(name, NOTEBOOK_SCHEMAS[name], profile, params)
    return {**values, "profile": profile}


def section(name: str, schema: type | None = None, profile: str | None = None,
            params: dict[str, Any] | None = None):
    """One section for one profile as ``schema`` (a :class:`Section` dataclass), checked; with
    no schema, the plain mapping of :func:`stage_params`."""
    values, where, profile = _merged(name, profile, params)
    if schema is None:
        return {**values, "profile": profile}
    _check_keys(values, _yaml_fields(schema), f"params.yaml: {name}.{profile}", where)
    return _build(schema, {**values, "profile": profile}, f"params.yaml: {name}.{profile}",
                  where)


def check_mapping(values: dict[str, Any], schema: type, where: str):
    """A section a study reads as a plain mapping, checked against ``schema`` (a
    :class:`Section` dataclass) as :func:`section` checks a typed one: unknown keys, types,
    positive sizes, recipe names. ``where``: the key path named in errors (e.g.
    ``"params.yaml: inference.smoke"``). Returns the typed object; the mapping is unchanged."""
    _check_keys({k: v for k, v in values.items() if k != "profile"}, _yaml_fields(schema), where)
    return _build(schema, values, where)


# ---------------------------------------------------------------------------- validation


def _fail(path: str, problem: str) -> typing.NoReturn:
    raise ConfigError(f"{path}: {problem}")


def _check_keys(values: dict, valid, prefix: str, where: dict[str, str] | None = None):
    for key in values:
        if key not in valid:
            near = difflib.get_close_matches(str(key), list(valid), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            at = f"params.yaml: {where[key]}" if where and key in where else \
                f"{prefix}{'.' if ': ' in prefix else ': '}{key}"
            _fail(at, f"unknown key{hint}; valid keys: {', '.join(valid)}")


def _yaml_fields(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema) if not f.metadata.get("cli")]


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def _build(schema: type, values: dict, path: str, where: dict[str, str] | None = None):
    """``schema(**values)`` with every value converted to its field's type."""
    hints, kwargs = _hints(schema), {}
    for f in dataclasses.fields(schema):
        at = f"params.yaml: {where[f.name]}" if where and f.name in where else f"{path}.{f.name}"
        if f.name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                _fail(path, f"missing key {f.name!r}")
            continue
        v = _convert(values[f.name], hints[f.name], at)
        if f.metadata.get("positive"):
            _check_positive(v, at)
        if f.metadata.get("fraction") and v is not None and not 0 < v <= 1:
            _fail(at, f"must be a fraction in (0, 1], got {v!r}")
        if "within" in f.metadata and v is not None and not (
                f.metadata["within"][0] <= v <= f.metadata["within"][1]):
            lo, hi = f.metadata["within"]
            _fail(at, f"must be in [{lo:g}, {hi:g}], got {v!r}")
        if f.metadata.get("recipe"):
            _check_recipes(v, at)
        kwargs[f.name] = v
    return schema(**kwargs)


def _type_name(tp) -> str:
    if typing.get_args(tp):
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def _convert(v: Any, tp: Any, at: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return v
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(v, option, at)
            except ConfigError:
                continue
        _fail(at, f"expected {' or '.join(_type_name(a) for a in args)}, got {v!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            _fail(at, f"expected a mapping, got {v!r}")
        _check_keys(v, _yaml_fields(tp), at)
        return _build(tp, v, at)
    if origin in (list, tuple):
        if not isinstance(v, (list, tuple)):
            _fail(at, f"expected a list, got {v!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(v) != len(args):
                _fail(at, f"expected a list of {len(args)}, got {v!r}")
            return tuple(_convert(x, a, f"{at}[{i}]") for i, (x, a) in enumerate(zip(v, args)))
        item = args[0] if args else Any
        return origin(_convert(x, item, f"{at}[{i}]") for i, x in enumerate(v))
    if origin is dict:
        if not isinstance(v, dict):
            _fail(at, f"expected a mapping, got {v!r}")
        kt, vt = args or (Any, Any)
        return {_convert(k, kt, at): _convert(x, vt, f"{at}.{k}") for k, x in v.items()}
    if tp is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        if not math.isfinite(v):
            _fail(at, f"expected a finite number, got {v!r}")
        return float(v)
    if tp is int and type(v) is int and not INT_RANGE[0] <= v <= INT_RANGE[1]:
        _fail(at, f"{v} is out of range: expected an integer in [{INT_RANGE[0]}, "
              f"{INT_RANGE[1]}]")
    if tp in (int, str, bool) and type(v) is tp:
        return v
    _fail(at, f"expected {_type_name(tp)}, got {v!r}")


def _check_positive(v: Any, at: str) -> None:
    if isinstance(v, bool) or v is None:
        return
    if isinstance(v, (int, float)) and not v > 0:
        _fail(at, f"must be > 0, got {v!r}" + (f" (an integer in [1, {INT_RANGE[1]}])"
                                                 if isinstance(v, int) else ""))
    items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()
    for x in items:
        _check_positive(x, at)


def _check_recipes(v: Any, at: str) -> None:
    from repro.precision import resolve

    for name in ([v] if isinstance(v, str) else v if isinstance(v, (list, tuple)) else []):
        try:
            resolve(name)
        except ValueError as e:
            _fail(at, str(e))
