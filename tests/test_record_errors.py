"""Records are checked when written and when read: a bad value is refused or named with its
file, never dropped; a truncated file names itself; ratios guard their denominators."""

import json
import math

import pandas as pd
import pytest

from repro import evidence, record_checks, results
from repro.analysis import rl as rl_analysis
from repro.analysis import stats
from repro.claims import ledger
from repro.hardware import lookup

HW = lookup("cpu")


def rec(metric="env_steps_per_s", value=1000.0, unit="steps/s", **kw):
    return results.make_record("rl_throughput", metric, value, unit, recipe="bf16",
                               hardware=HW, **kw)


@pytest.mark.parametrize("metric, value, unit", [
    ("env_steps_per_s", math.nan, "steps/s"),
    ("env_steps_per_s", math.inf, "steps/s"),
    ("env_steps_per_s", 0.0, "steps/s"),
    ("tflops", -3.0, "TFLOP/s"),
    ("step_time_ms", 0.0, "ms"),
    ("step_time_ms", math.nan, "ms"),
    ("update_memory_bytes", -1.0, "bytes"),
    ("update_memory_bytes", math.inf, "bytes"),
    ("attention_ms_per_step", -0.5, "ms"),
])
def test_a_bad_measurement_is_refused_at_write_and_nothing_is_written(tmp_path, metric,
                                                                      value, unit):
    with pytest.raises(record_checks.RecordError) as e:
        results.write_records([rec(), rec(metric, value, unit)], "rl_throughput", "cell1",
                              root=tmp_path)
    line = str(e.value)
    assert line.startswith(f"rl_throughput/cell1: record 1 ({metric}, bf16): value ")
    assert "nothing was written" in line and "\n" not in line
    assert not list(tmp_path.rglob("*"))  # no file, no folder, no temp file


@pytest.mark.parametrize("metric, value, unit", [
    ("final_return", math.nan, "return"),  # a diverged seed: an outcome, recorded as such
    ("final_return", -83.9, "return"),
    ("attention_ms_per_step", 0.0, "ms"),  # no attention kernel in this step
    ("stored_weight_bytes_quantized_only", 0.0, "bytes"),
    ("fp8_stores", 0.0, "of 4"),
])
def test_outcomes_shares_and_sizes_may_be_what_they_are(tmp_path, metric, value, unit):
    path = results.write_records([rec(metric, value, unit)], "rl_throughput", "c", tmp_path)
    df = evidence.load_records("rl_throughput", roots=[tmp_path])
    got = df.value.iloc[0]
    assert (math.isnan(got) and math.isnan(value)) or got == value
    assert df.source.iloc[0] == str(path)


def test_value_must_be_a_number_and_fields_present(tmp_path):
    bad = rec()
    bad["value"] = "fast"
    assert record_checks.check_record(bad) == "value must be a number, got 'fast'"
    del bad["unit"]
    assert record_checks.check_record(bad) == "missing field(s) unit"
    assert record_checks.check_record([1]) == "expected an object, got list"


def _write_raw(root, name, records):
    path = root / "cpu" / "rl_throughput" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))  # json writes NaN for a float nan, as json.dump did
    return path


def test_a_nan_in_a_committed_record_is_named_with_its_file_not_dropped(tmp_path):
    good = _write_raw(tmp_path, "a.json", [rec(value=1000.0)])
    bad = _write_raw(tmp_path, "b.json", [rec(value=900.0), rec(value=math.nan)])
    assert good.exists()
    with pytest.raises(record_checks.RecordError) as e:
        evidence.load_records("rl_throughput", roots=[tmp_path])
    assert str(e.value).startswith(f"{bad}: record 1 (env_steps_per_s, bf16): value nan is "
                                   "not finite")
    assert "repro/data/defects.yaml" in str(e.value)


def test_a_zero_throughput_is_named_at_load(tmp_path):
    bad = _write_raw(tmp_path, "z.json", [rec(value=0.0)])
    with pytest.raises(record_checks.RecordError, match=rf"^{bad}: record 0 .*is not > 0"):
        evidence.load_records("rl_throughput", roots=[tmp_path])


def test_a_truncated_record_file_names_itself(tmp_path):
    path = results.write_records([rec()], "rl_throughput", "t", root=tmp_path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    for read in (lambda: evidence.load_records(roots=[tmp_path]),
                 lambda: results.have_cell("rl_throughput", "t", "cpu", tmp_path)):
        with pytest.raises(record_checks.RecordError) as e:
            read()
        assert str(e.value).startswith(f"{path}: not valid JSON (")
        assert "\n" not in str(e.value)


def test_writes_stay_atomic_when_the_dump_fails(tmp_path):
    path = results.write_records([rec(value=5.0)], "rl_throughput", "w", root=tmp_path)
    before = path.read_text()

    class Boom:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        results.write_records([rec(value=7.0, extra={"bad": Boom()})], "rl_throughput", "w",
                              root=tmp_path)
    assert [p.name for p in path.parent.iterdir()] == ["w.json"]  # no temp file left
    assert path.read_text() == before  # the previous cell intact


# ---------------------------------------------------------------------------- ratios


@pytest.mark.parametrize("num, den", [(1.0, 0.0), (1.0, -2.0), (math.inf, 1.0), (1.0, math.inf)])
def test_a_ratio_refuses_a_bad_denominator(num, den):
    with pytest.raises(ValueError, match=r"^speedup of x: cannot divide"):
        stats.ratio(num, den, "speedup of x")


def test_a_ratio_of_a_missing_cell_is_nan_and_a_good_one_exact():
    assert math.isnan(stats.ratio(math.nan, 2.0, "x")) and stats.ratio(3.0, 2.0, "x") == 1.5


def test_speedups_name_the_cell_whose_denominator_is_zero():
    row = dict(hardware="h200", network="mlp", width=4096, num_envs=2048, emulated=False,
               update_memory_bytes=1.0, git_commit="abc")
    table = pd.DataFrame([{**row, "recipe": "fp8-delayed", "env_steps_per_s": 2.0,
                           "update_time_ms": 1.0},
                          {**row, "recipe": "bf16", "env_steps_per_s": 0.0,
                           "update_time_ms": 1.0}])
    with pytest.raises(ValueError, match=r"env_steps_per_s of fp8-delayed vs bf16 at h200, "
                                         r"mlp, 4096, 2048: cannot divide 2.0 by 0.0"):
        rl_analysis.speedups(table, "fp8-delayed", ["bf16"])


# --------------------------------------------------------------------------- verdicts


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_VERDICTS", str(tmp_path))
    return tmp_path


GOOD = {"claim": "A2", "verdict": "partly", "key_number": "1.38x", "hardware": "h200",
        "source": "results/h200/rl_throughput", "note": "", "emulated": False}


@pytest.mark.parametrize("data, want", [
    ({**GOOD, "verdict": "maybe"}, "unknown verdict 'maybe' for claim A2; valid: reproduced"),
    ({**GOOD, "verdic": "partly"}, "unknown field 'verdic' (did you mean 'verdict'?)"),
    ({k: v for k, v in GOOD.items() if k != "verdict"}, "missing field(s) verdict"),
    ({**GOOD, "claim": "A3"}, "holds claim 'A3', not 'A2'"),
    ({**GOOD, "emulated": "no"}, "emulated must be bool, got 'no'"),
    ({**GOOD, "key_number": 1.38}, "key_number must be str, got 1.38"),
    ([GOOD], "expected a JSON object, got list"),
])
def test_a_bad_verdict_file_is_named_not_accepted(verdicts, data, want):
    path = verdicts / "A2.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as e:
        ledger.ledger()
    assert str(e.value).startswith(f"{path}: ") and want in str(e.value)


def test_a_truncated_verdict_file_names_itself(verdicts):
    path = verdicts / "A2.json"
    path.write_text(json.dumps(GOOD, indent=1)[:60])
    with pytest.raises(ValueError, match=rf"^{path}: not valid JSON \(Unterminated string"):
        ledger.ledger()


def test_a_good_verdict_file_reads_back_exactly(verdicts):
    (verdicts / "A2.json").write_text(json.dumps(GOOD))
    row = next(r for r in ledger.ledger() if r["claim"] == "A2")
    assert {k: row[k] for k in GOOD} == GOOD


def test_write_verdict_refuses_the_wrong_types(verdicts):
    with pytest.raises(ValueError, match="emulated must be bool, got 1"):
        ledger.write_verdict("A2", "partly", "1.38x", "h200", "x", "", 1)
    assert not list(verdicts.iterdir())
