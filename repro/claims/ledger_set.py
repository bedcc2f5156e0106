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
with each cell's estimated device time (:func:`plan`).

    ledger_set.select(records, "A2")              # the records A2's verdict may read
    ledger_set.plan("h200")                       # the H200 speed set, with estimates
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

ANY, CPU = "any", "cpu"  # where-keys that accept records of any hardware
ANYWHERE = (ANY, CPU)


@dataclass(frozen=True)
class Entry:
    """One ledger pattern: ``claim`` reads the cells of ``experiment`` (a records folder)
    matching ``pattern`` (expanded: a glob without braces) recorded on ``where``."""

    claim: str
    where: str
    experiment: str
    pattern: str

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
        from repro.claims.verdicts._base import definitions

        claims = definitions()
    out = []
    for cid, c in claims.items():
        led = c.get("ledger") or {}
        if not isinstance(led, dict):
            raise ValueError(f"claims.yaml: {cid}: ledger must map a hardware (or any, cpu) "
                             f"to experiments, got {type(led).__name__}")
        for where, exps in led.items():
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
                    out.extend(Entry(cid, str(where), str(exp), p) for p in expand(cell))
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
    """The rows of ``records`` (``results.load_records``: each row's ``source`` is its cell
    file) that the verdicts of ``claims`` may read: their ledger set. For a cell an
    ``any``/``cpu`` pattern names, the records of one hardware: fresh before stale, then the
    newest."""
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


def _one_hardware(rows: pd.DataFrame) -> pd.DataFrame:
    """Of the rows of cells any hardware may hold: per (experiment, cell), the rows of one
    hardware: the one whose records are all fresh, else any; then the newest."""
    if not len(rows):
        return rows
    key = rows["source"].map(lambda s: cell_of(s)[1:])
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


# ------------------------------------------------------------------------- the plan


def _study_cells(experiment: str, platform: str, kind: str) -> list[str] | None:
    """The full-profile cell names of the study that writes ``experiment`` on ``platform``
    (None: no such study, or one ``repro record`` does not run)."""
    import contextlib
    import io

    from repro import hardware, studies

    name = studies.of_records(experiment)
    if name not in studies.EXPERIMENTS:
        return None
    st = studies.study(name)
    with contextlib.redirect_stdout(io.StringIO()), hardware.target(platform, kind):
        cells = st.cells(studies.params(name, "full"))
    if experiment != name:  # a folder another study writes (its repeats): the cells it holds
        return None
    return [c.name for c in cells]


def _platform(hardware: str) -> tuple[str, str]:
    """(platform, device kind) a registry hardware name runs as (``cpu`` for unknown)."""
    from repro import hardware as hw

    if hardware == CPU:
        return "cpu", ""
    try:
        info = hw.lookup(hardware)
    except (KeyError, ValueError):
        return "gpu", ""
    return getattr(info, "backend", None) or "gpu", getattr(info, "name", "") or ""


def projections(claims: dict[str, Any] | None = None) -> set[str]:
    """The claims whose verdict is projected onto hardware not measured (``kind:
    projection``): their cells calibrate a model, and a hardware's default plan leaves them
    out."""
    if claims is None:
        from repro.claims.verdicts._base import definitions

        claims = definitions()
    return {cid for cid, c in claims.items() if c.get("kind") == "projection"}


def plan(hardware: str, claims: Iterable[str] = (), quality: bool | None = None
         ) -> list[dict[str, Any]]:
    """The ledger cells ``hardware`` records (``repro record --ledger``): those named for it,
    plus with ``quality`` the ``any`` cells (an accelerator) and the ``cpu`` cells (any
    machine); ``quality`` None: only the ``cpu`` cells on a CPU, else only the hardware's own.
    Without ``claims``, the claims judged on this hardware: a projection's cells only where
    ``claims`` names it (a cell it shares with another claim stays).
    One row per concrete cell: ``experiment``, ``cell``, ``claims``, ``status`` (missing,
    stale or fresh, of this hardware's records), ``estimate_s`` (:func:`repro.refresh.
    cell_estimate`: from the cell's own records here, else another hardware's, else a
    default) and ``recordable`` (``repro record`` runs its study). Ordered so that the
    verdicts needing the fewest cells to record come first."""
    from repro import refresh, results

    if quality is None:
        quality = hardware == CPU
    wanted = set(claims)
    skip = set() if wanted else projections()
    ents = [e for e in entries() if (e.claim in wanted if wanted else e.claim not in skip) and (
        e.where == hardware or (quality and (e.where == CPU or
                                             (e.where == ANY and hardware != CPU))))]
    platform, kind = _platform(hardware)
    root = results.results_dir()
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    known: dict[str, list[str] | None] = {}
    for e in ents:
        if e.experiment not in known:
            try:
                known[e.experiment] = _study_cells(e.experiment, platform, kind)
            except ValueError:
                known[e.experiment] = None
        names = known[e.experiment]
        if names is None:  # not a study of `repro record`: the cells on disk
            names = sorted({p.stem for p in root.glob(f"*/{e.experiment}/*.json")})
        hits = [n for n in names if fnmatch.fnmatchcase(n, e.pattern)]
        if not hits and not any(ch in e.pattern for ch in "*?["):
            hits = [e.pattern]  # named, but not among the study's cells now: listed as missing
        for n in hits:
            c = cells.setdefault((e.experiment, n), {
                "experiment": e.experiment, "cell": n, "claims": [], "hardware": hardware,
                "recordable": known[e.experiment] is not None and n in known[e.experiment]})
            if e.claim not in c["claims"]:
                c["claims"].append(e.claim)
    stale = {(c["folder"], c["cell"]) for c in results.stale_cells()
             if c["hardware"] == hardware}
    for (exp, n), c in cells.items():
        path = root / hardware / exp / f"{n}.json"
        c["status"] = "missing" if not path.is_file() else \
            "stale" if (exp, n) in stale else "fresh"
        c["estimate_s"], c["estimate_from"] = refresh.cell_estimate(root, hardware, exp, n)
    need: dict[str, int] = {}
    for c in cells.values():
        for cl in c["claims"]:
            need[cl] = need.get(cl, 0) + (c["status"] != "fresh")
    rank = {cl: (need.get(cl, 0), i) for i, cl in enumerate(dict.fromkeys(
        e.claim for e in ents))}
    return sorted(cells.values(), key=lambda c: (min(rank[cl] for cl in c["claims"]),
                                                 c["experiment"]))


def describe(rows: list[dict[str, Any]], hardware: str) -> list[str]:
    """The plan as lines: one per cell (status, estimate, claims), then the totals."""
    from repro.refresh import human

    lines = []
    for c in rows:
        note = "" if c["recordable"] else " (not by `repro record`: docs/RECORDING.md)"
        lines.append(f"{c['status']:7s} ~{human(c['estimate_s']):>6s}  {c['experiment']}/"
                     f"{c['cell']}  [{', '.join(c['claims'])}]"
                     + (f" (estimate: {c['estimate_from']})" if c["estimate_from"] != "own"
                        else "") + note)
    todo = [c for c in rows if c["status"] != "fresh"]
    lines.append(f"ledger set on {hardware}: {len(rows)} cell(s), ~"
                 f"{human(sum(c['estimate_s'] for c in rows))} to record all of it; "
                 f"{len(todo)} to record now (missing or stale), ~"
                 f"{human(sum(c['estimate_s'] for c in todo))}")
    return lines
