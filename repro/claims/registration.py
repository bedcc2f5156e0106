"""Was a claim's rule fixed before its data? What the history says, kept as data.

A claim's rule (:mod:`repro.claims.rulehistory`) is its entry in ``repro/data/claims.yaml`` and
the code that decided its verdict: the verdict function its notebook calls, with every helper it
reaches in the verdict modules, or, before there was one, the notebook's own verdict code. Its
**first rule** is the earliest commit that had any of them; its **first data** the earliest
committed record of its studies (its timestamp, or the commit that added it if earlier). A
commit after the first data **changed** the rule only if the rule before and after it decide
differently on some input: the tables today's verdict was computed from (``verdicts/inputs/``),
or tables generated around the rules' thresholds (:func:`repro.claims.rulehistory.prove`).
Commits that only move, rename or reword a rule (its key number's text, a new field) are
restatements, proven so.

What the history says is computed with the whole history (``repro registration --write``) and
committed as ``repro/data/registration.json`` (:data:`FINDINGS`), with the code of the rule each
claim had when its first data came. A notebook reads that file, never git, so a shallow clone
writes the same verdicts as a full one; ``tests/test_registration.py`` checks the file against
the history.

:func:`judged` computes a verdict under the claim's current rule and says how it was registered:
nothing more where the rule was fixed before its data; ``numbers["registration"]`` marks a rule
whose decisions changed after its data (``changed``: the first commit that changed one), and
where the rule in force when the data came (run as its code was then: :mod:`rulecode`) gives
another verdict on the same inputs, the key number and caveat say so in full.

    v = registration.judged(verdicts.a4, "A4", mem, records=df)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from repro.claims import rulecode, ruleinputs

#: what the history says of each claim's rule, under the package (``repro registration``)
FINDINGS = "data/registration.json"
#: where each verdict's inputs are written, under the verdicts folder
INPUTS = "inputs"


@functools.cache
def findings() -> dict[str, Any]:
    """The committed registration findings (``repro/data/registration.json``): per claim its
    first rule, first data, the commits after it and whether each changed a decision; under
    ``"rules"`` the code of each claim's rule when its data came. Empty where there is none."""
    path = resources.files("repro").joinpath(FINDINGS)
    return json.loads(path.read_text()) if path.is_file() else {}


def inputs_path(claim: str) -> Path:
    """Where :func:`judged` writes ``claim``'s inputs (``verdicts/inputs/<claim>.json``)."""
    from repro.claims.ledger import verdicts_dir

    return verdicts_dir() / INPUTS / f"{claim}.json"


def write_inputs(claim: str, args: tuple, kw: dict[str, Any]) -> Path:
    """Write the inputs a claim's verdict was computed from, for the rules' history to rerun
    every version of the rule on them (:func:`repro.claims.ruleinputs.dump`)."""
    path = inputs_path(claim)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(ruleinputs.dump(args, kw))
    tmp.replace(path)
    return path


def read_inputs(claim: str, root: Path | str | None = None) -> tuple[tuple, dict[str, Any]]:
    """(args, kwargs) of ``claim``'s committed inputs; :class:`FileNotFoundError` naming the
    file where there are none."""
    from repro.results import repo_root

    path = (Path(root) if root else repo_root()) / "verdicts" / INPUTS / f"{claim}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no inputs of {claim}'s verdict; run its notebook "
                                "(dvc repro)")
    return ruleinputs.load(path.read_text())


def _day(date: str) -> str:
    return pd.Timestamp(date).tz_convert("UTC").strftime("%Y-%m-%d")


def first_rule_verdict(claim: str, args: tuple, kw: dict[str, Any],
                       records: pd.DataFrame | None = None,
                       found: dict[str, Any] | None = None) -> tuple[str, str] | None:
    """(verdict, key number) under the rule ``claim`` had when its first data came, run as
    its code was then on today's inputs; None where it had no rule yet. Raises
    :class:`repro.claims.rulecode.RuleError` where that code cannot run on them."""
    found = findings() if found is None else found
    at = (found.get("claims", {}).get(claim) or {}).get("rule_at_data")
    if not at:
        return None
    return rulecode.decide(found["rules"][at["version"]], args, kw, records)


def judged(fn: Callable[..., Any], claim: str, *args: Any, records: pd.DataFrame | None = None,
           claims: dict[str, Any] | None = None, found: dict[str, Any] | None = None,
           **kw: Any):
    """``fn(*args, **kw)`` (a verdict function, under the claim's current rule) with what the
    registration findings say of its rule (see the module's docstring); its inputs are
    written to ``verdicts/inputs/<claim>.json``. ``records``: the committed records of its
    studies, for a rule of the time that read them."""
    from repro.verdict import definitions

    claims = definitions() if claims is None else claims
    takes_rule = "rule" in inspect.signature(fn).parameters
    v = fn(*args, **kw, **({"rule": claims[claim]["rule"]} if takes_rule else {}))
    write_inputs(claim, args, kw)
    found = findings() if found is None else found
    f = found.get("claims", {}).get(claim)
    numbers = dict(v.numbers)
    if f is None:
        numbers["registration"] = {"preregistered": -1}
        return dataclasses.replace(
            v, numbers=numbers,
            key_number=f"{v.key_number}; registration not checked (no registration findings:"
                       " `repro registration --write` with the whole history)")
    reg: dict[str, Any] = {"preregistered": int(bool(f["preregistered"]))}
    numbers["registration"] = reg
    if f["preregistered"]:
        return dataclasses.replace(v, numbers=numbers)
    reg["changed"] = f["changed"]["commit"]
    try:
        old = first_rule_verdict(claim, args, kw, records, found)
    except rulecode.RuleError as e:
        reg["first_rule_verdict"] = "not run"
        said = (f"its rule as first registered ({f['rule_at_data']['commit']}) could not run "
                f"on today's tables ({str(e).split(': ', 1)[-1][:80]})")
        return dataclasses.replace(v, numbers=numbers, key_number=f"{v.key_number}; {said}")
    if old is None:  # no rule before the data
        reg["first_rule_verdict"] = "none"
        return dataclasses.replace(v, numbers=numbers)
    reg["first_rule_verdict"] = old[0]
    if old[0] == v.verdict:
        return dataclasses.replace(v, numbers=numbers)
    at, ch = f["rule_at_data"], f["changed"]
    said = (f"{old[0]} under its rule before the data ({at['commit']}, {_day(at['date'])}); "
            f"changed by {ch['commit']} ({_day(ch['date'])})")
    return dataclasses.replace(v, numbers=numbers,
                               key_number=f"{v.key_number}; {said}",
                               caveat="; ".join(c for c in (said, v.caveat) if c))


def check(claim: str, found: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the findings say of ``claim``'s rule (``repro claims --json``): ``preregistered``
    (True, False, or "unknown" without findings), the first rule, the rule when its data
    came, the first data, and the commit that first changed a decision after it."""
    found = findings() if found is None else found
    f = found.get("claims", {}).get(claim)
    if f is None:
        return {"preregistered": "unknown"}
    return {"preregistered": f["preregistered"], "first_rule": f["first_rule"],
            "rule_at_data": f["rule_at_data"], "first_data": f["first_data"],
            "changed_after_data": f["changed"]}


def table() -> dict[str, dict[str, Any]]:
    """:func:`check` of every claim."""
    from repro.verdict import definitions

    return {cid: check(cid) for cid in definitions()}


def summary(found: dict[str, Any] | None = None, root: Path | str | None = None
            ) -> list[dict[str, str]]:
    """One row per claim: its first rule (commit, date), first data, whether its rule changed
    a decision after its data (and the commit), and its verdict under the rule it had when
    its data came, run as that code was on today's inputs (``verdicts/inputs/``) and the
    committed records. ``repro registration`` prints it."""
    from repro.verdict import definitions

    found = findings() if found is None else found
    rows = []
    order = [c for c in definitions() if c in found.get("claims", {})]
    for claim, f in ((c, found["claims"][c]) for c in order):
        at, ch = f["rule_at_data"], f["changed"]
        if f["first_data"] is None:
            first = "no data yet"
        elif at is None:
            first = "none (no rule before its data)"
        else:
            try:
                args, kw = read_inputs(claim, root)
                studies = list(definitions()[claim]["rule"].get("studies", []))
                first = first_rule_verdict(claim, args, kw, records_of(studies), found)[0]
            except (rulecode.RuleError, FileNotFoundError) as e:
                first = f"not run ({str(e)[:80]})"
        rows.append({
            "claim": claim,
            "first rule": f"{f['first_rule']['commit']} {_day(f['first_rule']['date'])} "
                          f"({f['first_rule']['where']})",
            "rule at data": (f"{at['commit']} {_day(at['date'])}" if at else
                             "none" if f["first_data"] else "no data yet"),
            "first data": (f"{_day(f['first_data']['date'])} ({f['first_data']['source']})"
                           if f["first_data"] else "none yet"),
            "changed after data": f"yes, {ch['commit']} {_day(ch['date'])}" if ch else "no",
            "verdict under first rule": first})
    return rows


def records_of(studies: list[str]) -> pd.DataFrame | None:
    """The committed full-profile records of ``studies`` a verdict may use (stale speed
    records left out, as a notebook leaves them out)."""
    from repro import evidence, results
    from repro.claims import staleness

    parts = []
    for s in studies:
        df = evidence.load_records(s, roots=results.results_dir())
        df = df[df["profile"] == "full"] if len(df) else df
        if len(df):
            parts.append(staleness.split(df.reset_index(drop=True))[0])
    if not parts:
        return None
    with warnings.catch_warnings():  # studies' records have columns the others lack
        warnings.simplefilter("ignore", FutureWarning)
        return pd.concat(parts, ignore_index=True)
