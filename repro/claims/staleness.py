"""What a verdict says about stale records (:mod:`repro.provenance`).

A verdict never rests on stale evidence silently. Stale *speed* records (timings, throughputs,
memory) are left out before the verdict is computed, and :func:`mark` names them in the
verdict's ``stale_note``: how many, of which experiment, why, and since which commit. Stale
*quality* records (every record of a ``QUALITY_EXPERIMENTS`` experiment, and a record of any
experiment whose metric is one of :data:`QUALITY_METRICS`: returns, losses, agreement; both
from the experiment catalogue, :mod:`repro.catalogue`) still decide the verdict, and
:func:`mark` sets ``stale=True`` with the reason. The ledger, its page (docs/ledger.md) and
the site show ``stale_note`` beside the verdict.

The same note counts the speed records a verdict rests on that ran beside another job (their
``conditions``: checked with ``nvidia-smi``, or parsed from the free-text ``run_note`` of
older records by :func:`conditions_of_note`; :func:`beside`); records without ``conditions``
say nothing either way. Where a rule requires its speed cells to have run alone, :func:`split`
leaves the others out as it leaves out stale ones.

    fresh, left_out = split(records)                 # speed: verdict from ``fresh`` only
    v = mark(a2(table_of(fresh)), left_out=left_out, beside_rows=fresh)
    v = mark(a5(quality_table), used=quality_records[quality_records.stale])
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pandas as pd

from repro.catalogue import QUALITY_EXPERIMENTS, QUALITY_METRICS


def split(records: pd.DataFrame, alone: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the records a verdict may use, the stale speed records it must leave out). Quality
    records stay in the first table, stale or not (their ``stale`` column says which).
    ``alone``: a rule that requires its speed cells to have run alone also leaves out those
    that ran beside another job (:func:`beside`; their ``stale_summary`` says so)."""
    if not len(records):
        return records, records.iloc[:0]
    out = (records["stale"].fillna(False).astype(bool) if "stale" in records
           else pd.Series(False, index=records.index)) & ~_quality(records)
    if alone and len(shared := beside(records, keep_index=True)):
        crowded = records.index.isin(shared.index) & ~out
        records = records.copy()
        if "stale_summary" not in records:
            records["stale_summary"] = None
        records.loc[crowded, "stale_summary"] = "ran beside another job (the rule requires alone)"
        out = out | crowded
    return records[~out].reset_index(drop=True), records[out].reset_index(drop=True)


def _quality(records: pd.DataFrame) -> pd.Series:
    quality = records["experiment"].isin(QUALITY_EXPERIMENTS)
    if "metric" in records:
        quality |= records["metric"].isin(QUALITY_METRICS)
    return quality


_ALONE = re.compile(r"alone on the (GPU|chip|TPU)\b", re.I)
_BESIDE = re.compile(r"GPU (\d+) of (\d+); beside it on GPU (\d+): (.+)", re.S)
_JOB = re.compile(r"(?=\brepro\.[a-z_.]+ )")


def conditions_of_note(note: Any) -> dict[str, Any] | None:
    """A record's free-text ``run_note`` as structured ``conditions`` (what ran beside it):
    "alone on the GPU" (or chip, TPU) gives ``{"alone": true}``; "GPU 1 of 2; beside it on GPU
    0: <commands>" gives ``{"alone": false, "gpu": 1, "gpus": 2, "beside": [{"gpu": 0, "job":
    <command>}, ...]}`` (one entry per ``repro.`` command named). ``"from": "run_note"`` says
    where it came from (:func:`repro.conditions.run_conditions` checks with nvidia-smi
    instead). None where the note says neither, or is not text."""
    if not isinstance(note, str):
        return None
    text = " ".join(note.split())
    if m := _BESIDE.fullmatch(text):
        gpu, gpus, other, jobs = int(m[1]), int(m[2]), int(m[3]), m[4]
        if not (gpu < gpus and other < gpus and gpu != other):
            return None
        return {"alone": False, "from": "run_note", "gpu": gpu, "gpus": gpus,
                "beside": [{"gpu": other, "job": j.strip()} for j in _JOB.split(jobs)
                           if j.strip()]}
    if _ALONE.fullmatch(text.split(" (")[0]):
        return {"alone": True, "from": "run_note"}
    return None


def beside(records: pd.DataFrame, keep_index: bool = False) -> pd.DataFrame:
    """The speed records of ``records`` made beside another job: their ``conditions`` say
    ``alone: false`` (checked by nvidia-smi, :func:`repro.conditions.merge_conditions`, or
    parsed from their run note, :func:`conditions_of_note`). Records without ``conditions``,
    or whose conditions were not checked, are not among them."""
    if not len(records) or "conditions" not in records:
        return records.iloc[:0]
    found = records["conditions"].map(lambda c: isinstance(c, dict) and c.get("alone") is False)
    shared = records[found & ~_quality(records)]
    return shared if keep_index else shared.reset_index(drop=True)


def describe_beside(rows: pd.DataFrame, of: pd.DataFrame | None = None) -> list[str]:
    """One phrase per experiment of :func:`beside` ``rows``: how many records (of how many
    speed records of ``of``, where given) ran beside another job, and what ran there: the
    processes nvidia-smi saw, or the jobs their run notes name."""
    out = []
    for exp, g in rows.groupby("experiment", sort=True):
        seen = dict.fromkeys(
            [f"{o.get('name')}" for c in g["conditions"]
             for s in (c.get("before") or {}, c.get("after") or {})
             for o in s.get("others") or ()]
            + [" ".join(str(b.get("job", "")).split()[:2]) for c in g["conditions"]
               for b in c.get("beside") or ()])
        names = ", ".join(list(seen)[:2]) + (f" and {len(seen) - 2} more" if len(seen) > 2
                                             else "")
        total = ""
        if of is not None and len(of) and "experiment" in of:
            speed = of[(of["experiment"] == exp) & ~_quality(of)]
            total = f" of {len(speed)}"
        out.append(f"{len(g)}{total} {exp} speed record(s) ran beside another job ({names})")
    return out


def _commits(rows: pd.DataFrame, column: str) -> str:
    vals = sorted({str(c)[:7] for c in rows[column].dropna() if str(c)}) \
        if column in rows else []
    return ", ".join(vals[:4]) + (f" and {len(vals) - 4} more" if len(vals) > 4 else "")


#: why a record is stale, in words: what each part of :class:`repro.provenance.Staleness`'s
#: reason says, without the program text it may quote (``repro status`` shows that)
_WHY = ((re.compile(r"its program( \(.*?\))? changed"), "program changed"),
        (re.compile(r"its measuring kit \(.*?\) changed"), "measuring kit changed"),
        (re.compile(r"its program was traced with jax ([\w.]+)"),
         r"traced under jax \1, to verify again there"),
        (re.compile(r"its code cannot be fingerprinted"), "its code cannot be fingerprinted"),
        (re.compile(r"recorded before code fingerprints"), "recorded before code fingerprints"),
        (re.compile(r"the code has been restructured"), "code restructured since"))


#: a program's text quoted in a reason (the first line where two programs differ, which may
#: hold "; " itself): `repro status` shows it; notes and footnotes say in words that the
#: program changed
PROGRAM_TEXT = re.compile(r": first difference at line \d+: .*?(?= \((?:since [0-9a-f]+|"
                          r"uncommitted edits)\)|; (?:its|recorded|no|the) |\)$|$)")


def why(reason: str) -> str:
    """A stale record's reason in a few words (:data:`_WHY`): each of its parts named once,
    any program text left out."""
    said = []
    for part in re.split(r";\s*(?![^()]*\))", PROGRAM_TEXT.sub("", str(reason))):
        part = part.strip()
        for pattern, words in _WHY:
            if m := pattern.search(part):
                said.append(m.expand(words))
                break
        else:
            if part:
                said.append(part.split(":")[0][:60])
    return ", ".join(dict.fromkeys(said))


def describe(rows: pd.DataFrame) -> list[str]:
    """One phrase per experiment of stale ``rows``, in words and counts: how many cells
    (record files; rows without a ``source``: records), why (:func:`why`), recorded at which
    commits, and since which commits the code changed (``repro status`` lists each record and
    what changed)."""
    out = []
    for exp, g in rows.groupby("experiment", sort=True):
        reasons = (g["stale_summary"].dropna() if "stale_summary" in g
                   else g["stale_reason"].dropna())
        words = ", ".join(dict.fromkeys(w for r in dict.fromkeys(reasons)
                                        for w in why(r).split(", ") if w))
        since = _commits(g, "stale_since")
        n = f"{g['source'].nunique()} {exp} cell(s)" if "source" in g else \
            f"{len(g)} {exp} record(s)"
        out.append(f"{n} ({words}; recorded at {_commits(g, 'git_commit')}"
                   + (f"; code changed since {since}" if since else "") + ")")
    return out


def mark(verdict, left_out: pd.DataFrame | None = None, used: pd.DataFrame | None = None,
         beside_rows: pd.DataFrame | None = None):
    """``verdict`` saying what is stale in its ``stale_note``: ``left_out`` stale speed
    records (the verdict was computed without them), ``used`` stale quality records (the
    verdict rests on them: ``stale=True``). Rows of either table that are not stale are
    ignored. ``beside_rows``: records it rests on; the speed records among them made beside
    another process on their GPU (:func:`beside`) are named in the same note."""
    def stale(rows):
        return rows[rows["stale"].fillna(False).astype(bool)] if rows is not None and len(
            rows) and "stale" in rows else pd.DataFrame()

    left, kept = stale(left_out), stale(used)
    shared = beside(beside_rows) if beside_rows is not None else pd.DataFrame()
    said = [verdict.stale_note] if verdict.stale_note else []
    if len(kept):
        said.append("measured with other code than this checkout's: " + "; ".join(
            describe(kept)))
    if len(left):
        said.append("left out as stale: " + "; ".join(describe(left)))
    if len(shared):
        said.append("; ".join(describe_beside(shared, beside_rows)))
    if len(said) == bool(verdict.stale_note):
        return verdict
    return dataclasses.replace(verdict, stale=verdict.stale or bool(len(kept)),
                               stale_note="; ".join(said))
