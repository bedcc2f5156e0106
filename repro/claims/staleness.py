"""What a verdict says about stale records (:mod:`repro.provenance`).

A verdict never rests on stale evidence silently. Stale *speed* records (timings, throughputs,
memory) are left out before the verdict is computed, and :func:`mark` names them in the
verdict's ``stale_note``: how many, of which experiment, why, and since which commit. Stale
*quality* records (every record of a ``QUALITY_EXPERIMENTS`` experiment, and a record of any
experiment whose metric is one of :data:`QUALITY_METRICS`: returns, losses, agreement; both
from the experiment catalogue, :mod:`repro.catalogue`) still decide the verdict, and
:func:`mark` sets ``stale=True`` with the reason. The ledger, its page (docs/ledger.md) and
the site show ``stale_note`` beside the verdict.

The same note says when a verdict rests on speed records made beside another process on their
GPU (their ``conditions``, checked with ``nvidia-smi``: :func:`beside`); records without
``conditions`` say nothing either way.

    fresh, left_out = split(records)                 # speed: verdict from ``fresh`` only
    v = mark(a2(table_of(fresh)), left_out=left_out, beside_rows=fresh)
    v = mark(a5(quality_table), used=quality_records[quality_records.stale])
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from repro.catalogue import QUALITY_EXPERIMENTS, QUALITY_METRICS


def split(records: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the records a verdict may use, the stale speed records it must leave out). Quality
    records stay in the first table, stale or not (their ``stale`` column says which)."""
    if not len(records) or "stale" not in records:
        return records, records.iloc[:0]
    out = records["stale"].fillna(False).astype(bool) & ~_quality(records)
    return records[~out].reset_index(drop=True), records[out].reset_index(drop=True)


def _quality(records: pd.DataFrame) -> pd.Series:
    quality = records["experiment"].isin(QUALITY_EXPERIMENTS)
    if "metric" in records:
        quality |= records["metric"].isin(QUALITY_METRICS)
    return quality


def beside(records: pd.DataFrame) -> pd.DataFrame:
    """The speed records of ``records`` made beside another process on their GPU: their
    ``conditions`` (:func:`repro.conditions.merge_conditions`) say ``alone: false``. Records
    without ``conditions``, or whose conditions were not checked, are not among them."""
    if not len(records) or "conditions" not in records:
        return records.iloc[:0]
    found = records["conditions"].map(lambda c: isinstance(c, dict) and c.get("alone") is False)
    return records[found & ~_quality(records)].reset_index(drop=True)


def describe_beside(rows: pd.DataFrame) -> list[str]:
    """One phrase per experiment of :func:`beside` ``rows``: how many cells (record files;
    rows without a ``source``: records) and the processes nvidia-smi saw beside them."""
    out = []
    for exp, g in rows.groupby("experiment", sort=True):
        seen = dict.fromkeys(f"{o.get('name')} (pid {o.get('pid')})" for c in g["conditions"]
                             for s in (c.get("before") or {}, c.get("after") or {})
                             for o in s.get("others") or ())
        names = ", ".join(list(seen)[:3]) + (f" and {len(seen) - 3} more" if len(seen) > 3
                                             else "")
        n = f"{g['source'].nunique()} cell(s)" if "source" in g else f"{len(g)} record(s)"
        out.append(f"{n} of {exp} recorded beside another process (nvidia-smi: {names})")
    return out


def _commits(rows: pd.DataFrame, column: str) -> str:
    vals = sorted({str(c)[:7] for c in rows[column].dropna() if str(c)}) \
        if column in rows else []
    return ", ".join(vals[:4]) + (f" and {len(vals) - 4} more" if len(vals) > 4 else "")


def describe(rows: pd.DataFrame) -> list[str]:
    """One phrase per experiment of stale ``rows``: how many cells (record files; rows
    without a ``source``: records), why (the reason without the record's commit), recorded at
    which commits, and since which commit the code changed."""
    out = []
    for exp, g in rows.groupby("experiment", sort=True):
        why = "; ".join(dict.fromkeys(
            g["stale_summary"].dropna() if "stale_summary" in g else g["stale_reason"].dropna()))
        since = _commits(g, "stale_since")
        n = f"{g['source'].nunique()} {exp} cell(s)" if "source" in g else \
            f"{len(g)} {exp} record(s)"
        out.append(f"{n} ({why}; recorded at {_commits(g, 'git_commit')}"
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
        said.append("; ".join(describe_beside(shared)))
    if len(said) == bool(verdict.stale_note):
        return verdict
    return dataclasses.replace(verdict, stale=verdict.stale or bool(len(kept)),
                               stale_note="; ".join(said))
