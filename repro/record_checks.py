"""What a record must be, checked when it is written and when it is read, and what it checks of
itself.

:func:`check_record`: the fields every analysis reads, and the value by unit: a throughput or
a duration must be a finite number > 0, a size or a count finite and >= 0, the optional
``conditions`` (what ``nvidia-smi`` saw beside the run) an object whose ``alone`` is true, false
or null. A record that is not is refused at write (:mod:`repro.results`) and named, with its
file, at load (:class:`RecordError`), never dropped. :func:`verify`: its value against the
samples it holds (:func:`check_value`, the statistic its experiment's entry in
:mod:`repro.catalogue` names), its commit and time against the history: a record that fails
is defective, left out of every analysis and named (:class:`DefectiveRecordWarning`).
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from repro import catalogue
from repro.checkout import History

# How far a record's time may precede its commit's, or lie ahead of now: the clocks of the
# machine that committed and of the one that measured may differ by this much.
CLOCK_SKEW = _dt.timedelta(minutes=10)


class DefectiveRecordWarning(UserWarning):
    """A record that fails its own check (:func:`verify`): left out of every analysis."""


def check_value(rec: dict[str, Any]) -> tuple[str, str | None]:
    """Whether a record's ``value`` is the statistic its experiment computes from the samples
    it holds (the experiment's ``statistics``: :class:`repro.catalogue.Statistic`), as
    ``(outcome, detail)``: ``("checked", None)``; ``("mismatch", the problem)``; ``("not
    derived", why)``: its value is not a statistic of its lists (a memory size beside step
    times), as its spec says; ``("no samples", what)``: the record holds none (a GEMM's
    timings keep only their median); ``("no rule", what)``: it holds lists of numbers its
    spec says nothing about (the committed records' test refuses that)."""
    lists = [k for k, v in (rec.get("extra") or {}).items() if isinstance(v, list) and v
             and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)]
    try:
        rule = catalogue.get(str(rec.get("experiment"))).statistics.get(
            str(rec.get("metric")))
    except ValueError:
        rule = None
    if isinstance(rule, str):
        return "not derived", rule
    if rule is None:
        return ("no rule", f"its spec says nothing of {', '.join(lists)}") if lists else \
            ("no samples", "it holds no samples")
    rules = rule if isinstance(rule, tuple) else (rule,)
    for stat in rules:
        try:
            got = stat.of(rec)
        except ValueError as e:
            return "mismatch", f"its samples give no value: {e}"
        if got is None:
            continue
        want, tolerance = got
        v = rec.get("value")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or abs(v - want) > tolerance * abs(want):
            return "mismatch", f"value {v!r} is not {stat.describe()} ({want:.7g})"
        return "checked", None
    return "no samples", f"it holds none of {', '.join('extra.' + r.samples for r in rules)}"


def value_problem(rec: Any) -> str | None:
    """The problem :func:`check_value` finds with a record's value (None: none)."""
    if not isinstance(rec, dict):
        return None
    outcome, detail = check_value(rec)
    return detail if outcome == "mismatch" else None


def verify(rec: dict[str, Any], known: History | None) -> str | None:
    """What is wrong with a record's numbers or its origin (a phrase), or None: its value
    against its samples (:func:`check_value`); where the history is ``known`` (:func:`history`
    of the records' folder), its ``git_commit`` against it (each of a comma-separated list;
    ``-dirty`` allowed) and its ``timestamp`` against its commit's time; everywhere, its
    ``timestamp`` against now (both within :data:`CLOCK_SKEW`)."""
    if problem := value_problem(rec):
        return problem
    when = None
    if known is not None:
        commit = rec.get("git_commit")
        for part in str(commit or "").split(","):
            t = known.time_of(part.strip().removesuffix("-dirty"))
            if t is None:
                return f"git_commit {commit!r} is not a commit of the history"
            when = t if when is None else min(when, t)
    raw = rec.get("timestamp")
    if raw is None:
        return None
    try:
        ts = _dt.datetime.fromisoformat(str(raw))
    except ValueError:
        return f"timestamp {raw!r} is not a date"
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=_dt.timezone.utc)
    if ts > _dt.datetime.now(_dt.timezone.utc) + CLOCK_SKEW:
        return f"timestamp {raw} is in the future"
    if when is not None and ts.timestamp() < when - CLOCK_SKEW.total_seconds():
        made = _dt.datetime.fromtimestamp(when, _dt.timezone.utc).isoformat()
        return (f"timestamp {raw} is before its commit {str(rec.get('git_commit'))[:12]} "
                f"({made})")
    return None


class RecordError(ValueError):
    """A record file or a record that cannot be used: one line naming the file."""


# A throughput or a duration is what ratios divide by: finite and > 0 (0 is a failed
# measurement). A share of a step by kernel class (kernel_times' ``attention_ms_per_step``...)
# may be 0. Sizes and counts: finite and >= 0. Any other unit is an outcome (a return, a loss,
# an error, a flag): a number, where NaN or inf stand for a run that diverged.
_DURATIONS = ("ms", "s", "us", "ns")


_SIZES = ("bytes", "kernels")


_WHOLE_STEP = ("wall_ms_per_step", "kernel_ms_per_step")


REQUIRED = ("experiment", "hardware", "metric", "value", "unit")


def _kind(metric: str, unit: str) -> str:
    if unit.endswith("/s"):
        return "throughput"
    if unit in _DURATIONS:
        share = metric.endswith("_ms_per_step") and metric not in _WHOLE_STEP
        return "share" if share else "duration"
    return "size" if unit in _SIZES else "outcome"


def check_record(rec: Any) -> str | None:
    """What is wrong with one record (a phrase), or None: the fields every analysis reads,
    and the value by unit (see the module docstring)."""
    if not isinstance(rec, dict):
        return f"expected an object, got {type(rec).__name__}"
    if missing := [k for k in REQUIRED if k not in rec]:
        return f"missing field(s) {', '.join(missing)}"
    if "conditions" in rec and (problem := _check_conditions(rec["conditions"])):
        return problem
    metric, unit, v = rec["metric"], rec["unit"], rec["value"]
    if not isinstance(metric, str) or not isinstance(unit, str):
        return f"metric and unit must be strings, got {metric!r}, {unit!r}"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"value must be a number, got {v!r}"
    kind = _kind(metric, unit)
    if kind == "outcome":
        return None
    if not math.isfinite(v):
        return f"value {v} is not finite; a {kind} ({unit}) must be a finite number"
    if kind in ("throughput", "duration") and v <= 0:
        return f"value {v!r} is not > 0; a {kind} ({unit}) must be > 0"
    if v < 0:
        return f"value {v!r} is negative; a {kind} ({unit}) must be >= 0"
    return None


def _check_conditions(c: Any) -> str | None:
    """What is wrong with a record's optional ``conditions`` (an object whose ``alone`` is
    true, false or null: :func:`repro.conditions.merge_conditions`), or None."""
    if not isinstance(c, dict):
        return f"conditions must be an object, got {type(c).__name__}"
    if "alone" not in c or not (c["alone"] is None or isinstance(c["alone"], bool)):
        return f"conditions.alone must be true, false or null, got {c.get('alone', 'nothing')!r}"
    return None


def what(rec: Any) -> str:
    """`` (metric, recipe)`` of a record, for a message."""
    if not isinstance(rec, dict):
        return ""
    bits = [str(rec[k]) for k in ("metric", "recipe") if rec.get(k)]
    return f" ({', '.join(bits)})" if bits else ""
