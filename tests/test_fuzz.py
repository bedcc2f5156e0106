"""Fuzzing the user-facing surfaces with bad input: params.yaml sections, `repro` arguments,
record and verdict files, and the precision API. For every generated case: a one-line error
that names the culprit, or a correct result; never a traceback (an exception of another kind),
a partial write, or a change to a committed file.

Bad values: NaN, +-inf, zero, negative, empty, wrong type, wrong shape. The repository's own
files are read, never written: every write goes to a temporary copy (REPRO_ROOT)."""

import copy
import hashlib
import json
import math
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from repro import cli, config, evidence, record_checks, results, studies
from repro.precision import formats as F
from repro.precision import ops
from repro.precision.recipes import REGISTRY
from repro.studies import runner

ROOT = Path(__file__).resolve().parent.parent
FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
NAN, INF = float("nan"), float("inf")
BAD_SCALARS = [NAN, INF, -INF, -1, -0.5, -7, "three", "", [1, "x"], {"a": 1}, True, [NAN]]
ANY_VALUES = BAD_SCALARS + [0, 0.0, None, [], {}, [0], [-1], [[1, 2]], 1e300, 3, "bf16"]


def _digest(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


def _committed() -> str:
    files = [p for d in ("results", "verdicts", "docs", "notebooks", "figures")
             for p in (ROOT / d).rglob("*") if p.is_file()]
    return _digest(files + [ROOT / "params.yaml", ROOT / "README.md"])


@pytest.fixture(scope="module", autouse=True)
def committed_files_unchanged():
    before = _committed()
    yield
    assert _committed() == before, "a fuzz case changed a committed file"


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text.strip(), repr(text)
    return text


def _names(text: str, *culprits) -> bool:
    """Whether ``text`` names one of ``culprits`` (as written, or quoted)."""
    return any((str(c).strip() and str(c) in text) or repr(c) in text
               for c in culprits if c is not None)


# ------------------------------------------------------------------------- params.yaml

RAW = config.load_params(ROOT / "params.yaml")
SECTIONS = {name: s.params_section for name in studies.EXPERIMENTS
            if (s := studies.study(name)).params_section}
KEYS = sorted((name, sub, key) for name, sec in SECTIONS.items()
              for sub in ("common", "smoke") for key in (RAW[sec].get(sub) or {}))


def _definitely_bad(original, value) -> bool:
    """A value that no key holding ``original`` can take: not a number where a number is, a
    non-finite or negative number, not a list where a list is, not a mapping where one is."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if number(original):
        return not number(value) or not math.isfinite(value) or value < 0
    if isinstance(original, bool):
        return not isinstance(value, bool)
    if isinstance(original, list) and original and all(number(o) for o in original):
        return not isinstance(value, list) or any(
            not number(v) or not math.isfinite(v) or v < 0 for v in value)
    if isinstance(original, dict):  # None may switch an optional part off (legged's parts)
        return not isinstance(value, dict) and value is not None
    return False


def _plain(v):
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _validate(name: str, raw: dict):
    studies.check_params(name, raw)
    p = studies.params(name, "smoke", raw)
    runner.plan(studies.study(name), p)
    return p


@FUZZ
@given(st.sampled_from(KEYS), st.sampled_from(ANY_VALUES))
def test_fuzz_params_values(case, value):
    name, sub, key = case
    raw = copy.deepcopy(RAW)
    original = raw[SECTIONS[name]][sub][key]
    raw[SECTIONS[name]][sub][key] = copy.deepcopy(value)
    try:
        p = _validate(name, raw)
    except ValueError as e:  # ConfigError and the studies' checks
        assert _names(_one_line(e), key, repr(value), value), (key, value, str(e))
        return
    assert not _definitely_bad(original, value), f"{name}.{sub}.{key}={value!r} accepted"
    if hasattr(p, key) and (sub == "smoke" or key not in raw[SECTIONS[name]]["smoke"]):
        got = _plain(getattr(p, key))
        assert got == value or (isinstance(value, float) and got == value), (key, got, value)


@FUZZ
@given(st.sampled_from(sorted(SECTIONS)), st.sampled_from(["common", "smoke"]),
       st.from_regex(r"[a-z][a-z_]{1,12}", fullmatch=True))
def test_fuzz_params_unknown_keys(name, sub, key):
    raw = copy.deepcopy(RAW)
    assume(key not in {f for f in getattr(studies.study(name).params, "__dataclass_fields__", {})})
    raw[SECTIONS[name]].setdefault(sub, {})[key] = 3
    with pytest.raises(ValueError) as e:
        _validate(name, raw)
    line = _one_line(e.value)
    assert f".{key}: unknown key" in line and "valid keys: " in line


# ---------------------------------------------------------------------------------- CLI

SAFE = ["hardware", "recipes", "claims"]
RECORD_BAD = [("--time-budget", "nan"), ("--time-budget", "-1"), ("--time-budget", "inf"),
              ("--time-budget", "soon"), ("--profile", "fast"), ("--profile", ""),
              ("--recipe", ","), ("--recipe", "fp9"), ("--only", "zz*"), ("--hardware", " "),
              ("--hardware", "h200"), ("--hardware", "b200"), ("--purejaxrl", "/nonexistent")]
TRACE_BAD = [("--steps", "0"), ("--steps", "-2"), ("--width", "nan"), ("--depth", "1.5"),
             ("--num-envs", "0"), ("--batch", "-3"), ("--shapes", "1x2"), ("--shapes", "0x1x1"),
             ("--recipes", "nope"), ("--size", "999m"), ("--hardware", "gb200")]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A copy of the repository's inputs; runs, notebooks and numerics replaced by stubs, so
    a case that passes validation returns at once having written nothing."""
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path / "verdicts"))
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(runner, "run", lambda *a, **k: calls.append(k) or runner.Outcome())
    from repro import markdown, run_notebook
    from repro.precision import check

    monkeypatch.setattr(run_notebook, "_execute", lambda *a, **k: calls.append(a) or 0)
    monkeypatch.setattr(run_notebook, "_require_kernel", lambda: None)
    monkeypatch.setattr(markdown, "write", lambda *a, **k: None)  # no executed notebook
    monkeypatch.setattr(check, "require", lambda: None)
    return tmp_path, calls


def _cli(capsys, argv):
    status = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return status, err


@FUZZ
@given(st.sampled_from(list(studies.EXPERIMENTS) + ["all", "nope", "kernel_times", ""]),
       st.lists(st.sampled_from(RECORD_BAD), min_size=0, max_size=2))
def test_fuzz_record_arguments(sandbox, capsys, experiment, bad):
    root, calls = sandbox
    calls.clear()
    argv = ["record", experiment, "--time-budget", "1e-9"]
    for opt, val in bad:
        argv += [opt, val]
    status, err = _cli(capsys, argv)
    if status == 0:
        assert not bad or all(opt in ("--only", "--purejaxrl") for opt, _ in bad), argv
        return
    assert status == 2 and len(err) == 1 and err[0].startswith("repro: error: "), (argv, err)
    culprits = [experiment] + [x for pair in bad for x in pair]
    assert _names(err[0], *culprits) or "needs --purejaxrl" in err[0], (argv, err)
    assert not any((root / "results").iterdir()) and not calls


@FUZZ
@given(st.sampled_from(["mlp", "lm", "gemm", "ppo", "conv", ""]),
       st.lists(st.sampled_from(TRACE_BAD), min_size=1, max_size=2))
def test_fuzz_trace_arguments(sandbox, capsys, workload, bad):
    _, calls = sandbox
    calls.clear()
    argv = ["trace", workload]
    for opt, val in bad:
        argv += [opt, val]
    status, err = _cli(capsys, argv)
    relevant = {"mlp": ("--width", "--depth", "--batch"), "lm": ("--size", "--batch"),
                "gemm": ("--shapes",), "ppo": ("--width", "--num-envs")}.get(workload, ())
    if status == 0:  # an option the workload ignores, with a value that parses
        assert all(o not in relevant and o not in ("--steps", "--recipes", "--hardware")
                   for o, _ in bad), (argv, err)
        return
    assert status == 2 and len(err) == 1 and err[0].startswith("repro: error: "), (argv, err)
    assert _names(err[0], workload or "''", *[x for pair in bad for x in pair]), (argv, err)
    assert not calls


@FUZZ
@given(st.sampled_from(["01_formats", "02_gemm_roofline", "99_nope", "../params"]),
       st.lists(st.sampled_from(["profile=fast", "profile=3", "scratch=5", "scratch=.nan",
                                 "answer=1", "=2", "novalue", "profile=full"]),
                min_size=1, max_size=2),
       st.sampled_from([None, "smoke", "nope"]))
def test_fuzz_notebook_arguments(sandbox, capsys, name, params, profile):
    _, calls = sandbox
    calls.clear()
    argv = ["notebook", name] + [x for p in params for x in ("-p", p)]
    argv += ["--profile", profile] if profile else []
    status, err = _cli(capsys, argv)
    if status == 0:
        assert name in ("01_formats", "02_gemm_roofline") and profile is None, argv
        assert all(p == "profile=full" for p in params), argv
        return
    assert status == 2 and len(err) == 1 and err[0].startswith("repro: error: "), (argv, err)
    culprits = [name, profile] + [x for p in params for x in p.partition("=")[::2]]
    assert _names(err[0], *culprits), (argv, err)
    assert not calls


@FUZZ
@given(st.sampled_from(["docs", ".", "notes.txt", "notes.txt/sub", "fresh", "", "  "]))
def test_fuzz_site_out(sandbox, capsys, out):
    root, _ = sandbox
    (root / "docs").mkdir(exist_ok=True)
    (root / "docs" / "keep.md").write_text("keep")
    (root / "notes.txt").write_text("keep")

    def kept():
        return _digest(p for p in root.rglob("*") if p.is_file()
                       and not {"fresh", "build"} & set(p.relative_to(root).parts))

    before = kept()
    status, err = _cli(capsys, ["site", "--out", out] if out else ["site"])
    assert kept() == before  # nothing it did not build was touched
    if status == 0:
        assert out in ("fresh", ""), out
        shutil.rmtree(root / "fresh", ignore_errors=True)
        return
    assert status == 2 and len(err) == 1 and _names(err[0], out.strip() or "--out"), (out, err)


def test_fuzz_safe_commands_run(sandbox, capsys):
    for command in SAFE:
        assert cli.main([command]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------------- record files

FIELDS = ("experiment", "hardware", "metric", "value", "unit")
UNITS = ["steps/s", "TFLOP/s", "ms", "s", "bytes", "return", "nats/byte", "1"]


def _good(unit: str, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if unit in ("return", "nats/byte", "1"):
        return True
    return math.isfinite(value) and (value > 0 or unit == "bytes" and value == 0)


@FUZZ
@given(st.sampled_from(UNITS), st.sampled_from(ANY_VALUES + [12.5, 1, 3e9]),
       st.sampled_from([None] + list(FIELDS)), st.sampled_from([None, 0.3, 0.9]))
def test_fuzz_record_files(tmp_path_factory, unit, value, drop, cut):
    root = tmp_path_factory.mktemp("records")
    rec = {"experiment": "rl_throughput", "hardware": "cpu", "metric": "m", "value": value,
           "unit": unit, "recipe": "bf16", "sizes": {}, "extra": {}}
    if drop:
        del rec[drop]
    good = drop is None and _good(unit, value)
    # at write: refused with nothing written, or written and read back exactly
    try:
        path = results.write_records([rec], "rl_throughput", "c", root=root)
    except record_checks.RecordError as e:
        assert not good and "rl_throughput/c: record 0" in _one_line(e)
        assert not list(root.rglob("*.json"))
    else:
        assert good, (unit, value, drop)
        got = evidence.load_records(roots=[root]).value.iloc[0]
        assert got == value or (math.isnan(got) and math.isnan(value))
        path.unlink()
    # at load: a file written by hand (or cut short) is named, or read exactly
    path = root / "cpu" / "rl_throughput" / "hand.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps([rec])
    path.write_text(text[: int(len(text) * cut)] if cut else text)
    try:
        df = evidence.load_records(roots=[root])
    except record_checks.RecordError as e:
        assert not good or cut, (unit, value)
        assert _one_line(e).startswith(f"{path}: ")
    else:
        assert good and not cut
        assert len(df) == 1 and (df.value.iloc[0] == value or math.isnan(value))


# ------------------------------------------------------------------------ library API

RECIPES = list(REGISTRY) + ["nope", "fp8-delayed:margin=x", ""]
SHAPES = [(4, 32), (0, 32), (4, 0), (32,), (), (2, 3, 32), (4, 31)]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.int32, jnp.bool_]


def _ref_fp8_current(x, w):
    """float64 reference of an fp8-current product: per-tensor amax/448 scales, e4m3."""
    def q(a):
        s = np.abs(a).max() / 448.0 if np.abs(a).max() > 0 else 1.0
        return (np.clip(a / s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
                .astype(np.float64) * s)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    return q(x64.reshape(-1, x64.shape[-1])) @ q(w64)


@FUZZ
@given(st.sampled_from(["fp8_dot", "mxfp8_dot", "nvfp4_dot", "dot"]),
       st.sampled_from(RECIPES), st.sampled_from(SHAPES), st.sampled_from(DTYPES),
       st.sampled_from(["key", "int", "none", "floats"]))
def test_fuzz_products(fn, recipe, shape, dtype, key):
    x = jnp.asarray(np.random.default_rng(0).standard_normal(shape) if shape else 1.0,
                    dtype) if dtype != jnp.bool_ else jnp.ones(shape, dtype)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((32, 8)), jnp.float32)
    keys = {"key": jax.random.key(0), "int": 7, "none": None, "floats": jnp.ones((2,))}
    call = {"fp8_dot": lambda: ops.fp8_dot(x, w, recipe),
            "mxfp8_dot": lambda: ops.mxfp8_dot(x, w, recipe),
            "nvfp4_dot": lambda: ops.nvfp4_dot(x, w, recipe, keys[key]),
            "dot": lambda: ops.dot(x, w, recipe, key=keys[key])}[fn]
    try:
        y = call()
    except (ValueError, TypeError, RuntimeError) as e:
        line = _one_line(e)
        assert line.split(":")[0] in ("fp8_dot", "mxfp8_dot", "nvfp4_dot", "dot"), line
        return
    r = REGISTRY.get(recipe)
    assert r is not None and r.backend == "repro", recipe
    assert shape and shape[-1] == 32 and 0 not in shape and dtype in (jnp.float32, jnp.bfloat16)
    assert y.shape == shape[:-1] + (8,)
    if r.name == "fp8-current" and dtype == jnp.float32:
        ref = _ref_fp8_current(x, w).reshape(y.shape)
        np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=2e-2, atol=2e-2)


@FUZZ
@given(st.sampled_from([F.fp8_quantize, F.fp8_cast]),
       st.sampled_from([1.0, 0.5, 2.0 ** -10, 0.0, -1.0, NAN, INF, -INF, "1", None,
                        np.array([1.0, 0.0]), jnp.float32(3.0)]),
       st.sampled_from([F.E4M3, F.E5M2, jnp.bfloat16, "e4m3", jnp.int8]))
def test_fuzz_fp8_casts(fn, scale, dtype):
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 2)) * 100, jnp.float32)
    try:
        q = fn(x, dtype, scale)
    except (ValueError, TypeError) as e:
        assert _one_line(e).startswith(f"{fn.__name__}: "), str(e)
        return
    s = float(np.asarray(scale, np.float64))
    assert math.isfinite(s) and s > 0 and dtype in (F.E4M3, F.E5M2)
    fmax = float(ml_dtypes.finfo(dtype).max)
    want = np.clip(np.asarray(x, np.float64) * (1 / np.float32(s)), -fmax, fmax)
    np.testing.assert_array_equal(np.asarray(q).astype(np.float64),
                                  want.astype(np.float32).astype(dtype).astype(np.float64))


@settings(FUZZ, max_examples=40)  # each new shape compiles
@given(st.sampled_from([(1, 16), (4, 32), (16, 16), (0, 16), (4, 15), (16,), ()]),
       st.sampled_from([(1, 16), (16, 16), (2, 16), (16, 1)]),
       st.sampled_from([0.0, 1.0, INF, -INF, NAN]),
       st.sampled_from(["nearest", "stochastic", "up"]),
       st.sampled_from(["key", "none", "int"]))
def test_fuzz_nvfp4_quantize(shape, block, fill, rounding, key):
    x = jnp.full(shape, fill, jnp.float32) if shape else jnp.float32(fill)
    keys = {"key": jax.random.key(0), "none": None, "int": 3}
    try:
        t = F.nvfp4_quantize(x, block, rounding=rounding, key=keys[key])
    except (ValueError, TypeError) as e:
        assert _one_line(e).startswith(("nvfp4_quantize: ", "nvfp4: ")), str(e)
        return
    d = np.asarray(F.nvfp4_dequantize(t))
    want = {0.0: 0.0, 1.0: 1.0, INF: 2688.0, -INF: -2688.0}.get(fill)
    if want is None:
        assert np.isnan(d).all()  # a NaN block dequantizes to NaN
    else:
        assert np.all(d == want), (fill, d)


# ------------------------------------------------------------------------ verdict files

VERDICT = {"claim": "A2", "verdict": "partly", "key_number": "1.38x", "hardware": "h200",
           "source": "results/h200/rl_throughput", "note": "", "emulated": False}


@FUZZ
@given(st.sampled_from(list(VERDICT) + ["verdic", "stale", "stale_note", "numbers", "stalle",
                                         None]),
       st.sampled_from(ANY_VALUES + ["maybe", "reproduced", "A3", "A2", False, "drop"]),
       st.sampled_from([None, 0.2, 0.7]))
def test_fuzz_verdict_files(tmp_path_factory, monkeypatch, key, value, cut):
    from repro.claims import ledger
    from repro.claims.verdicts import VERDICTS

    folder = tmp_path_factory.mktemp("verdicts")
    monkeypatch.setenv("REPRO_VERDICTS", str(folder))
    data = dict(VERDICT)
    if key is not None:
        if value == "drop":
            data.pop(key, None)
        else:
            data[key] = value
    kinds = {"claim": str, "emulated": bool, "stale": bool, "numbers": dict}
    good = (not cut and set(data) <= set(VERDICT) | {"stale", "stale_note", "numbers"} and data.get("claim") == "A2"
            and data.get("verdict") in VERDICTS and all(
                type(data[k]) is kinds.get(k, str) for k in data))
    path = folder / "A2.json"
    text = json.dumps(data)
    path.write_text(text[: int(len(text) * cut)] if cut else text)
    try:
        rows = ledger.ledger()
    except ValueError as e:
        assert not good and _one_line(e).startswith(f"{path}: "), (data, str(e))
        return
    assert good, (key, value, cut)
    row = next(r for r in rows if r["claim"] == "A2")
    assert {k: row[k] for k in data if k in row} == {k: data[k] for k in data if k in row}


@pytest.mark.parametrize("section,sub,key,value", [
    ("lm", "common", "min_lr_ratio", -0.1),
    ("lm", "common", "min_lr_ratio", 1.5),
    ("lm", "common", "weight_decay", -0.01),
    ("legged", "smoke", "ppo", {"learning_rat": 0.001}),
])
def test_the_fuzzers_findings_are_rejected_naming_their_key(section, sub, key, value):
    name = next(n for n, s in SECTIONS.items() if s == section)
    raw = copy.deepcopy(RAW)
    raw[section].setdefault(sub, {})[key] = value
    with pytest.raises(ValueError) as e:
        _validate(name, raw)
    assert key in _one_line(e.value), str(e.value)
