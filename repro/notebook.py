"""What every notebook does first, and how it ends: parameters, records, figures, conclusion.

Each notebook opens with ::

    nb = notebook.start("03_rl_throughput", "rl_throughput", profile)

which resolves the profile (``smoke`` / ``full`` / ``auto``), reads the notebook's section of
``params.yaml`` (``nb.params``), detects this machine (``nb.machine``), and sets a plotting style.

**Evidence and scratch.** ``nb.records(experiment)`` are the committed full-profile records under
``results/``: the measurements every verdict and every committed figure (``figures/``) rests on.
``nb.smoke_records(experiment)`` are this machine's smoke records under ``build/results/``: a
check that the pipeline runs, drawn only into scratch figures (``build/figures/``), never into
``figures/`` and never into a verdict. ``nb.save(fig, name, records)`` writes a figure with a
caption naming the hardware and profile of the records it shows, into ``figures/`` or, for smoke
records, ``build/figures/``. ``nb.conclusion(*verdicts)`` writes a notebook's closing paragraph
from the computed verdicts, so no number in it is typed by hand.

**Stale records** (:mod:`repro.provenance`: made by code that has changed since) never count
silently. ``nb.records`` leaves stale speed records out (a verdict and a figure are computed
without them; the figure's caption counts them) and keeps stale quality records;
``nb.conclusion`` says in each verdict which were left out or relied on, and since which commit
(:mod:`repro.claims.staleness`), and which speed records it rests on were made beside another
process on their GPU (their ``conditions``). **Metrics**: ``nb.conclusion`` also writes the
verdicts' key numbers as numbers to ``metrics/<notebook>.json`` (``dvc metrics show``);
``nb.metrics(...)`` adds numbers of a notebook that decides no claim.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from repro import config, hardware, results
from repro.claims import ledger, staleness
from repro.claims.verdicts import Verdict
from repro.claims.verdicts._base import tidy


@dataclass
class Notebook:
    name: str
    profile: str
    params: dict[str, Any]
    machine: hardware.HardwareInfo
    root: Path
    left_out: list[pd.DataFrame] = field(default_factory=list)  # stale speed records
    stale_used: list[pd.DataFrame] = field(default_factory=list)  # stale quality records
    beside: list[pd.DataFrame] = field(default_factory=list)  # speed records not made alone
    numbers: dict[str, Any] = field(default_factory=dict)  # metrics/<notebook>.json

    @property
    def figures(self) -> Path:
        return ledger.outputs_root() / "figures"

    @property
    def scratch_figures(self) -> Path:
        return self.root / "build" / "figures"

    def records(self, experiment: str, keep_defective: bool = False) -> pd.DataFrame:
        """The committed full-profile records of ``experiment`` (``results/``): evidence.
        Stale speed records are left out (kept in ``left_out`` for the verdicts and
        captions to name); stale quality records stay (``stale`` column), noted in
        ``stale_used``; speed records made beside another process on their GPU stay, noted
        in ``beside`` for the verdicts to name (:func:`repro.claims.staleness.beside`)."""
        df = results.load_records(experiment, roots=results.results_dir(),
                                  keep_defective=keep_defective)
        df = df[df["profile"] == "full"].reset_index(drop=True) if len(df) else df
        fresh, left = staleness.split(df)
        if len(left):
            self.left_out.append(left)
        if len(fresh) and "stale" in fresh and fresh["stale"].fillna(False).any():
            self.stale_used.append(fresh[fresh["stale"].fillna(False).astype(bool)])
        if len(shared := staleness.beside(fresh)):
            self.beside.append(shared)
        return fresh

    def record_smoke(self, experiment: str) -> list[Path]:
        """Run ``experiment``'s study in the smoke profile into the scratch folder (a pipeline
        check on this machine; full-profile records are made on a GPU by ``repro record``)."""
        from repro import studies

        written = studies.record(experiment, "smoke", progress=False).written
        print(f"smoke: wrote {len(written)} cell(s) under {results.record_root('smoke')}")
        return written

    def smoke_records(self, experiment: str) -> pd.DataFrame:
        """This machine's smoke records of ``experiment`` (``build/results/``): scratch."""
        return results.load_records(experiment, roots=results.scratch_results_dir())

    def save(self, fig, stem: str, records: pd.DataFrame | str | None = None) -> Path:
        """Caption ``fig`` with the hardware and profile of ``records`` (or a text) and save
        it as ``stem.png``: under ``figures/`` for committed records, ``build/figures/`` when
        any of them is a smoke record. The canvas grows to fit titles, legends and caption."""
        text, smoke = self.caption(records)
        fig.canvas.draw()  # lays the figure out, so the caption goes below all it shows
        box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
        fig.text(box.x0 / fig.get_figwidth(), (box.y0 - 0.08) / fig.get_figheight(), text,
                 ha="left", va="top", fontsize=7.5, color="0.35", transform=fig.transFigure)
        folder = self.scratch_figures if smoke else self.figures
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stem}.png"
        # No software version or date in the file: the same records give the same bytes.
        fig.savefig(path, dpi=130, bbox_inches="tight", pad_inches=0.15,
                    metadata={"Software": None})
        return path

    def caption(self, records: pd.DataFrame | str | None) -> tuple[str, bool]:
        """:func:`caption`, plus what is stale for a figure of committed records: those it
        draws that other code made, and those of its experiments left out."""
        text, smoke = caption(records)
        if smoke:
            return text, smoke
        said = []
        if isinstance(records, pd.DataFrame) and "stale" in records:
            drawn = records[records["stale"].fillna(False).astype(bool)]
            if len(drawn):
                said.append("Drawn from records of other code than this checkout's: "
                            + "; ".join(staleness.describe(drawn)))
        if left := self._left_out_of(records):
            said.append(f"Left out as stale: {left}")
        if said:
            text = textwrap.fill(f"{text.rstrip('.')}. {'. '.join(said)} (`repro status`)", 140)
        return text, smoke

    def _stale(self, kept: list[pd.DataFrame], v: Verdict) -> pd.DataFrame:
        """The rows of ``kept`` a verdict rests on: records of its claim, or of an
        experiment its ``source`` names."""
        rows = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()
        if not len(rows):
            return rows
        named = {e for e in rows["experiment"].unique()
                 if re.search(rf"\b{re.escape(str(e))}\b", v.source or "")}
        ours = rows["claims"].map(lambda cs: v.claim in (cs or [])) | rows["experiment"].isin(
            named)
        return rows[ours].drop_duplicates("source" if "source" in rows else None)

    def _left_out_of(self, records) -> str:
        if not self.left_out:
            return ""
        rows = pd.concat(self.left_out, ignore_index=True).drop_duplicates("source")
        if isinstance(records, pd.DataFrame) and len(records) and "experiment" in records:
            rows = rows[rows["experiment"].isin(records["experiment"].unique())]
        return "; ".join(staleness.describe(rows)) if len(rows) else ""

    def plot_data(self, stem: str, table: pd.DataFrame, records: pd.DataFrame | str | None
                  ) -> Path:
        """Write a figure's headline series as ``figures/data/<stem>.csv`` for ``dvc plots``
        (``repro pipeline`` declares it: x the first column, one line per other column), so
        ``dvc plots diff`` overlays two commits. ``table``: the x values as its index, one
        column per series; rows sorted by x, columns by name, floats to 4 significant digits
        (whole-number x values as integers), so the same records give the same bytes. Where ``records`` hold smoke records it goes
        to ``build/figures/data/`` instead, as :meth:`save` does with the figure."""
        _, smoke = self.caption(records)
        folder = (self.scratch_figures if smoke else self.figures) / "data"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stem}.csv"
        t = table.rename(columns=str).sort_index()
        t = t[sorted(t.columns)]
        if t.index.dtype.kind == "f" and (t.index == t.index.round()).all():
            t.index = t.index.astype("int64")  # counts (tokens, steps) kept whole
        t.index.name = t.index.name or "x"
        t.to_csv(path, float_format="%.4g", lineterminator="\n")
        return path

    def metrics(self, **numbers: Any) -> Path:
        """Add ``numbers`` (nested mappings of numbers) to ``metrics/<notebook>.json``, which
        DVC shows (``dvc metrics show``); the file is rewritten whole, keys sorted."""
        self.numbers.update(numbers)
        path = ledger.outputs_root() / "metrics" / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(tidy(self.numbers), indent=1, sort_keys=True) + "\n")
        return path

    def conclusion(self, *verdicts: Verdict, write: bool = True):
        """The notebook's conclusion as Markdown, one paragraph per claim, from the computed
        verdicts; each is also written to the claims ledger unless ``write`` is False."""
        from IPython.display import Markdown

        statements = ledger.claims()
        paras = []
        verdicts = tuple(staleness.mark(v, left_out=self._stale(self.left_out, v),
                                        used=self._stale(self.stale_used, v),
                                        beside_rows=self._stale(self.beside, v))
                         for v in verdicts)
        for v in verdicts:
            if write:
                ledger.write_verdict(v)
                self.metrics(**{v.claim: v.numbers})
            para = (f"**{v.claim} ({statements[v.claim]['claim']}): {v.verdict}.** "
                    f"{v.key_number}.")
            note = "; ".join(p for p in v.note.split("; ") if not p.startswith("notebook "))
            if note:
                para += f" {note.rstrip('.')}."
            if v.stale_note:
                para += f" *{'Stale' if v.stale else 'Note'}: {v.stale_note}.*"
            hw = f"{v.hardware}, " if v.hardware else ""
            para += (f" Evidence: {hw}`{v.source}`"
                     + (" (FP8/FP4 emulated)." if v.emulated else "."))
            paras.append(para)
        return Markdown("\n\n".join(paras))


def empty_figure(title: str):
    """A figure that says it has nothing to show: saved where a notebook's figure has no
    fresh record to draw (``Notebook.save``'s caption says which records were left out), so a
    figure the pipeline declares always exists and never shows numbers of older code."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.8))
    ax.axis("off")
    ax.text(0.5, 0.5, "no fresh records to show", ha="center", va="center", color="0.4")
    ax.set_title(title)
    return fig


def caption(records: pd.DataFrame | str | None) -> tuple[str, bool]:
    """(caption text, whether it shows smoke records) for a figure drawn from ``records``."""
    if isinstance(records, str):
        return records, False
    if records is None or not len(records) or "hardware" not in records:
        return "No records yet.", False
    names = []
    for slug, g in records.groupby("hardware"):
        name = g["hardware_name"].iloc[0] if "hardware_name" in g else slug
        names.append(f"{name} ({slug})" if name and name != slug else slug)
    profiles = sorted(records["profile"].dropna().unique()) if "profile" in records else []
    smoke = "smoke" in profiles
    text = (f"Records: {', '.join(names)}; {' and '.join(profiles) or 'unknown'} profile"
            + (" (a pipeline check on this machine, not evidence)" if smoke else
               ", committed under results/"))
    return textwrap.fill(text, 140), smoke


def start(name: str, section: str | None, profile: str = "smoke",
          scratch: str | None = None) -> Notebook:
    """Open notebook ``name``: resolve ``profile``, read ``params.yaml``'s ``section``, point
    smoke records at ``scratch`` (``repro notebook`` gives each notebook a fresh folder), detect
    this machine, set the plotting style; print one line saying so."""
    import matplotlib.pyplot as plt

    profile = config.resolve_profile(profile)
    if scratch:
        results.use_scratch(scratch)
    params = config.stage_params(section, profile) if section else {"profile": profile}
    machine = hardware.detect()
    plt.rcParams.update({"figure.dpi": 100, "figure.constrained_layout.use": True,
                         "axes.grid": True, "grid.alpha": 0.3,
                         "axes.titlesize": 10, "legend.fontsize": 8,
                         "axes.spines.top": False, "axes.spines.right": False})
    pd.set_option("display.width", 160)
    print(f"{name}: profile {profile}; this machine {machine.slug} ({machine.name})")
    return Notebook(name, profile, params, machine, results.repo_root())
