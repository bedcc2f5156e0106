"""Each claim's ledger set: the recorded cells its verdict reads, named beside its rule.

A claim's entry in ``repro/data/claims.yaml`` has a ``ledger`` mapping: where the records may
come from -> experiment (its records' folder) -> cell names (``results/HW/EXPERIMENT/CELL.json``;
shell globs and ``{a,b}`` alternatives allowed). Where:

* a hardware name (``h200``, ``tpu-v5e``): records of that hardware only. Speed claims are
  judged on the hardware they are about.
* ``any``: records of any hardware on which ``repro check`` passed (the runner refuses to record
  a full profile elsewhere): quality claims (returns, losses, accuracy), which do not depend on
  how fast the chip is, only on computing the formats bit for bit.
* ``cpu``: as ``any``, and small enough to record on a 2-core CPU in under an hour
  (``repro record --ledger --hardware cpu --yes``): the one refresh that needs no lent device.

The verdicts read only their ledger set (:func:`select`); every other cell of a study is a
figure cell: it draws figures and can change no verdict. Where several hardware hold records
of an ``any``/``cpu`` cell, the verdict takes one hardware's: fresh before stale, then the
newest. ``repro record --ledger`` records a hardware's set, cells of the verdicts that need the
fewest cells first (so each verdict is complete as early as possible); ``--plan`` prints it
with each cell's estimated device time (:func:`repro.refresh.ledger_plan`).

    ledger_set.select(records, "A2")              # the records A2's verdict may read
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

ANY, CPU = "any", "cpu"  # where-keys that accept records of any hardware
FALLBACK = "fallback"  # a ledger's cells read only for want of the others (Entry.fallback)
ANYWHERE = (ANY, CPU)


@dataclass(frozen=True)
class Entry:
    """One ledger pattern: ``claim`` reads the cells of ``experiment`` (a records folder)
    matching ``pattern`` (expanded: a glob without braces) recorded on ``where``; a
    ``fallback`` cell only where its rule reads it for want of the others (a speed claim judged
    from paired cells first: the recipes' separate cells where a hardware has no paired one):
    a refresh records the others, never these."""

    claim: str
    where: str
    experiment: str
    pattern: str
    fallback: bool = False

    @property
    def anywhere(self) -> bool:
        return self.where in ANYWHERE

    def matches(self, hardware: str, experiment: str, cell: str) -> bool:
        return (experiment == self.experiment and (self.anywhere or hardware == self.where)
                and fnmatch.fnmatchcase(cell, self.pattern))


def expand(pattern: str) -> list[str]:
    """``{a,b}`` alternatives expanded (nested and several allowed); globs left as they are."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand(pattern[:m.start()] + alt + pattern[m.end():]))
    return list(dict.fromkeys(out))  # an inner group expanded first repeats the outer ones


def entries(claims: dict[str, Any] | None = None) -> list[Entry]:
    """Every claim's ledger patterns, in claims.yaml order; a one-line ``ValueError`` naming
    the claim for a malformed ``ledger``."""
    if claims is None:
        from repro.verdict import definitions

        claims = definitions()
    out = []
    for cid, c in claims.items():
        led = c.get("ledger") or {}
        if not isinstance(led, dict):
            raise ValueError(f"claims.yaml: {cid}: ledger must map a hardware (or any, cpu) "
                             f"to experiments, got {type(led).__name__}")
        fallback = led.get(FALLBACK) or {}
        if not isinstance(fallback, dict):
            raise ValueError(f"claims.yaml: {cid}: ledger.{FALLBACK} must map a hardware to "
                             "experiments")
        items = [(w, e, False) for w, e in led.items() if w != FALLBACK] + \
            [(w, e, True) for w, e in fallback.items()]
        for where, exps, fb in items:
            if not isinstance(exps, dict):
                raise ValueError(f"claims.yaml: {cid}: ledger.{where} must map experiments "
                                 "to lists of cells")
            for exp, cells in exps.items():
                if isinstance(cells, str):
                    cells = [cells]
                if not isinstance(cells, list) or not all(isinstance(x, str) for x in cells):
                    raise ValueError(f"claims.yaml: {cid}: ledger.{where}.{exp} must be a "
                                     "list of cell names")
                for cell in cells:
                    out.extend(Entry(cid, str(where), str(exp), p, fb) for p in expand(cell))
    return out


def of_claims(claims: Iterable[str], all_entries: list[Entry] | None = None) -> list[Entry]:
    wanted = set(claims)
    return [e for e in (entries() if all_entries is None else all_entries)
            if e.claim in wanted]


def claims_of(hardware: str, experiment: str, cell: str,
              all_entries: list[Entry] | None = None) -> list[str]:
    """The claims whose ledger set holds this cell (empty: a figure cell)."""
    return list(dict.fromkeys(e.claim for e in (entries() if all_entries is None
                                                else all_entries)
                              if e.matches(hardware, experiment, cell)))


def cell_of(source: str) -> tuple[str, str, str]:
    """(hardware, experiment folder, cell) of a record file ``HW/EXPERIMENT/CELL.json``."""
    p = Path(str(source))
    return p.parent.parent.name, p.parent.name, p.stem


def select(records: pd.DataFrame, *claims: str) -> pd.DataFrame:
    """The rows of ``records`` (``evidence.load_records``: each row's ``source`` is its cell
    file) that the verdicts of ``claims`` may read: their ledger set. For a cell an
    ``any``/``cpu`` pattern names, the records of one hardware: fresh before stale, then the
    newest (an environment's cells from one hardware together)."""
    if not len(records) or "source" not in records:
        return records
    ents = of_claims(claims)
    where = records["source"].map(cell_of)
    keep = where.map(lambda w: any(e.matches(*w) for e in ents))
    rows = records[keep.values]
    if not len(rows):
        return rows.reset_index(drop=True)
    anywhere = where[keep.values].map(lambda w: not any(
        e.matches(*w) for e in ents if not e.anywhere))
    chosen = _one_hardware(rows[anywhere.values])
    return pd.concat([rows[~anywhere.values], chosen]).sort_index().reset_index(drop=True)


def _stratum(source: str, sizes: Any) -> tuple[str, str]:
    """What one hardware's records must cover together: an environment's cells where the
    records name one (a comparison of variants within an environment must not mix machines),
    else the cell."""
    _, experiment, cell = cell_of(source)
    env = sizes.get("env") if isinstance(sizes, dict) else None
    return (experiment, f"env:{env}") if env else (experiment, cell)


def _one_hardware(rows: pd.DataFrame) -> pd.DataFrame:
    """Of the rows of cells any hardware may hold: per stratum (an environment's cells, else
    a cell: :func:`_stratum`), the rows of one hardware: the one whose records there are all
    fresh, else any; then the newest."""
    if not len(rows):
        return rows
    sizes = rows["sizes"] if "sizes" in rows else pd.Series(None, index=rows.index)
    key = pd.Series([_stratum(s, z) for s, z in zip(rows["source"], sizes)],
                    index=rows.index)
    hw = rows["source"].map(lambda s: cell_of(s)[0])
    stale = rows["stale"].fillna(False).astype(bool) if "stale" in rows else \
        pd.Series(False, index=rows.index)
    when = pd.to_datetime(rows["timestamp"], utc=True, errors="coerce") \
        if "timestamp" in rows else pd.Series(pd.NaT, index=rows.index)
    t = pd.DataFrame({"key": key, "hw": hw, "stale": stale, "when": when})
    best = (t.groupby(["key", "hw"]).agg(stale=("stale", "any"), when=("when", "max"))
            .reset_index().sort_values(["stale", "when"], ascending=[True, False])
            .drop_duplicates("key"))
    chosen = set(zip(best["key"], best["hw"]))
    return rows[[(k, h) in chosen for k, h in zip(key, hw)]]


# ------------------------------------------------------------------- acknowledgements

ACKNOWLEDGED = Path(__file__).resolve().parent.parent / "data" / "acknowledged.yaml"


def acknowledgements(path: Path | None = None) -> list[tuple[str, str]]:
    """(``HARDWARE/EXPERIMENT/CELL`` pattern, why) of every entry of
    ``repro/data/acknowledged.yaml``: stale ledger cells left stale on purpose."""
    import yaml

    path = path or ACKNOWLEDGED
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    out = []
    for i, e in enumerate(data or []):
        if not isinstance(e, dict) or not isinstance(e.get("why"), str) or not e.get("cells"):
            raise ValueError(f"{path.name}: entry {i + 1} needs `cells` (a list of "
                             "HARDWARE/EXPERIMENT/CELL patterns) and `why` (a sentence)")
        for c in e["cells"] if isinstance(e["cells"], list) else [e["cells"]]:
            out.extend((p, " ".join(e["why"].split())) for p in expand(str(c)))
    return out


def acknowledged(hardware: str, experiment: str, cell: str,
                 acks: list[tuple[str, str]] | None = None) -> str | None:
    """Why a stale cell was left stale (its acknowledgement), or None."""
    name = f"{hardware}/{experiment}/{cell}"
    return next((why for pat, why in (acknowledgements() if acks is None else acks)
                 if fnmatch.fnmatchcase(name, pat)), None)


def projections(claims: dict[str, Any] | None = None) -> set[str]:
    """The claims whose verdict is projected onto hardware not measured (``kind:
    projection``): their cells calibrate a model, and a hardware's default plan leaves them
    out."""
    if claims is None:
        from repro.verdict import definitions

        claims = definitions()
    return {cid for cid, c in claims.items() if c.get("kind") == "projection"}
