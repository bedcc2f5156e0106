"""Parameters from ``params.yaml``: the profile and each section, typed and checked once.

``params.yaml`` has a top-level ``profile`` (``smoke``: CPU-sized, minutes; ``full``: the GPU
study; ``auto``: ``full`` when a GPU is present) and one section per experiment or notebook,
each with ``smoke`` and ``full`` sub-sections and optionally ``common``, shared by both.

A study declares its parameters as a frozen dataclass derived from :class:`Section`;
:func:`section` merges ``common`` under the profile's sub-section and builds that dataclass
with :mod:`repro.schema`'s checker: types checked (floats finite), sizes positive (fields
made with :func:`positive`), fractions in (0, 1] (:func:`fraction`), numbers in [lo, hi]
(:func:`within`), recipe names checked against the registry (:func:`recipe_names`), unknown
keys rejected with the nearest valid key suggested. Every error is one line naming the file and the key path::

    params.yaml: gemm.smoke.repets: unknown key (did you mean 'repeats'?); valid keys: ...

A field made with :func:`from_cli` is set by the command line (``repro record --purejaxrl``),
never by ``params.yaml``. Notebooks read a section as a plain mapping (:func:`stage_params`).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from repro import catalogue, checkout
from repro.schema import Checker, yaml_fields
# the range rules of a section's fields (repro.schema's), for the studies to import from here
from repro.schema import fraction as fraction, positive as positive, within as within

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
    _check_keys(values, yaml_fields(schema), f"params.yaml: {name}.{profile}", where)
    return _build(schema, {**values, "profile": profile}, f"params.yaml: {name}.{profile}",
                  where)


def check_mapping(values: dict[str, Any], schema: type, where: str):
    """A section a study reads as a plain mapping, checked against ``schema`` (a
    :class:`Section` dataclass) as :func:`section` checks a typed one: unknown keys, types,
    positive sizes, recipe names. ``where``: the key path named in errors (e.g.
    ``"params.yaml: inference.smoke"``). Returns the typed object; the mapping is unchanged."""
    _check_keys({k: v for k, v in values.items() if k != "profile"}, yaml_fields(schema), where)
    return _build(schema, values, where)


# ---------------------------------------------------------------------------- validation


def _fail(path: str, problem: str) -> typing.NoReturn:
    raise ConfigError(f"{path}: {problem}")


def _check_keys(values: dict, valid, prefix: str, where: dict[str, str] | None = None):
    """Unknown keys refused, named by where they came from (``where``: key -> its key path)
    or else under ``prefix``."""
    CHECK.check_keys(values, valid, lambda key: f"params.yaml: {where[key]}"
                     if where and key in where
                     else f"{prefix}{'.' if ': ' in prefix else ': '}{key}")


def _build(schema: type, values: dict, path: str, where: dict[str, str] | None = None):
    """``schema(**values)`` with every value converted to its field's type and checked."""
    where = {k: f"params.yaml: {v}" for k, v in where.items()} if where else None
    return CHECK.build(schema, values, path, where)


def _check_recipes(f: dataclasses.Field, v: Any, at: str) -> None:
    """A :func:`recipe_names` field: each name resolves in the precision registry."""
    if not f.metadata.get("recipe"):
        return
    from repro.precision import resolve

    for name in ([v] if isinstance(v, str) else v if isinstance(v, (list, tuple)) else []):
        try:
            resolve(name)
        except ValueError as e:
            _fail(at, str(e))


# The one engine (repro.schema) raising ConfigError, ints in INT_RANGE, recipe names checked
CHECK = Checker(ConfigError, INT_RANGE, _check_recipes)
