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
without them; the figure's caption counts them, the notebook's text names them) and keeps
stale quality records;
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

from repro import config, evidence, hardware, plotstyle, results
from repro.claims import ledger, staleness
from repro.verdict import Verdict, tidy


#: the PNG text chunk that holds what a saved figure draws (:func:`repro.plotstyle.plotted`)
PLOTTED = "Plotted"


def plotted_of(path: Path) -> list[dict] | None:
    """What the figure saved at ``path`` draws (None where it does not say)."""
    from PIL import Image

    with Image.open(path) as im:
        text = im.info.get(PLOTTED)
    return json.loads(text) if text else None


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
    used: list[pd.DataFrame] = field(default_factory=list)  # the records verdicts may use
    numbers: dict[str, Any] = field(default_factory=dict)  # metrics/<notebook>.json
    said: set[str] = field(default_factory=set)  # stale notes printed above a figure
    read: dict[str, list[pd.DataFrame]] = field(default_factory=dict)  # claim -> its ledger rows

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
        ``stale_used``; speed records made beside another job stay, noted in ``beside`` for
        the verdicts to count (:func:`repro.claims.staleness.beside`), unless a rule of this
        notebook's claims that reads ``experiment`` requires its cells to run alone (its
        ``cells: {alone: true}``): then they are left out too, and named."""
        df = evidence.load_records(experiment, roots=results.results_dir(),
                                  keep_defective=keep_defective)
        df = df[df["profile"] == "full"].reset_index(drop=True) if len(df) else df
        fresh, left = staleness.split(df, alone=self._alone(experiment))
        if len(left):
            self.left_out.append(left)
        self.used.append(fresh)
        if len(fresh) and "stale" in fresh and fresh["stale"].fillna(False).any():
            self.stale_used.append(fresh[fresh["stale"].fillna(False).astype(bool)])
        if len(shared := staleness.beside(fresh)):
            self.beside.append(shared)
        return fresh

    def _alone(self, experiment: str) -> bool:
        """Whether a rule of this notebook's claims that reads ``experiment`` requires its
        speed cells to have run alone."""
        return any(bool(((c.get("rule") or {}).get("cells") or {}).get("alone"))
                   if isinstance((c.get("rule") or {}).get("cells"), dict) else False
                   for c in ledger.claims().values()
                   if c.get("notebook") == self.name
                   and experiment in (c.get("rule") or {}).get("studies", []))

    def ledger(self, records: pd.DataFrame, *claims: str) -> pd.DataFrame:
        """The rows of ``records`` the verdicts of ``claims`` read: their ledger set
        (``ledger`` in ``repro/data/claims.yaml``; :func:`repro.claims.ledger_set.select`).
        Figures draw from every fresh cell; a verdict's tables come from this alone, so no
        other cell can change it."""
        from repro.claims import ledger_set

        chosen = ledger_set.select(records, *claims)
        for c in claims:  # what each verdict rests on: its stale notes name these alone
            self.read.setdefault(c, []).append(chosen)
        return chosen

    def record_smoke(self, experiment: str) -> list[Path]:
        """Run ``experiment``'s study in the smoke profile into the scratch folder (a pipeline
        check on this machine; full-profile records are made on a GPU by ``repro record``)."""
        from repro import studies

        written = studies.record(experiment, "smoke", progress=False).written
        print(f"smoke: wrote {len(written)} cell(s) under {results.record_root('smoke')}")
        return written

    def smoke_records(self, experiment: str) -> pd.DataFrame:
        """This machine's smoke records of ``experiment`` (``build/results/``): scratch."""
        return evidence.load_records(experiment, roots=results.scratch_results_dir())

    def save(self, fig, stem: str, records: pd.DataFrame | str | None = None) -> Path:
        """Caption ``fig`` with the hardware and profile of ``records`` (or a text) and save
        it as ``stem.png``: under ``figures/`` for committed records, ``build/figures/`` when
        any of them is a smoke record. The canvas grows to fit titles, legends and caption.
        The caption holds two lines at most; what is stale is printed in full above the
        figure. A figure that draws no data is replaced by one saying in words why
        (:func:`empty_figure`): no committed figure is a blank axis."""
        import matplotlib.pyplot as plt

        text, smoke = self.caption(records)
        for note in [] if smoke else self.stale_notes(records):
            # each note in full once per notebook; a later figure's names it in a few words
            said = note in self.said
            self.said.add(note)
            print(f"{stem}: {note.split(' (')[0] + ' (as above)' if said else note}"
                  + ("" if said else " (`repro status`)"))
        if not draws_data(fig):
            title = fig.get_suptitle() or next(
                (a.get_title() for a in fig.axes if a.get_title()), stem)
            plt.close(fig)
            fig = empty_figure(title.split(" (")[0], self.why_empty(records))
        fig.canvas.draw()  # lays the figure out, so the caption goes below all it shows
        box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
        fig.text(box.x0 / fig.get_figwidth(), (box.y0 - 0.08) / fig.get_figheight(), text,
                 ha="left", va="top", fontsize=7.5, color="0.35", transform=fig.transFigure)
        folder = self.scratch_figures if smoke else self.figures
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stem}.png"
        # No software version or date in the file: the same records give the same bytes.
        # What each axes draws goes into the file as text (tests read it back: no empty
        # facet, no band outside its metric's range).
        fig.savefig(path, dpi=130, bbox_inches="tight", pad_inches=0.15,
                    metadata={"Software": None, PLOTTED: json.dumps(plotstyle.plotted(fig))})
        return path

    def caption(self, records: pd.DataFrame | str | None) -> tuple[str, bool]:
        """:func:`caption`, plus one line counting what is stale for a figure of committed
        records (those it draws that other code made, those of its experiments left out);
        :meth:`stale_notes` says which, in the notebook's text."""
        text, smoke = caption(records)
        if smoke:
            return text, smoke
        if text == "No records yet." and len(self._left_out_rows(records)):
            text = "No fresh records."
        said = []
        drawn = self._drawn_stale(records)
        if len(drawn):
            said.append(f"{_cells(drawn)} drawn from records of other code than this "
                        "checkout's")
        if len(left := self._left_out_rows(records)):
            said.append(f"{_cells(left)} left out as stale")
        if said:  # the caption's two lines: where the records come from, what is stale
            text = textwrap.shorten(text, 140) + "\n" + textwrap.shorten(
                "; ".join(said) + " (listed above the figure; `repro status`).", 140)
        return text, smoke

    def stale_notes(self, records) -> list[str]:
        """What is stale for a figure of ``records``, in full: one phrase per experiment of the
        stale records it draws and of those left out (:func:`repro.claims.staleness.describe`)."""
        drawn, left = self._drawn_stale(records), self._left_out_rows(records)
        return ([f"drawn from records of other code than this checkout's: {d}"
                 for d in staleness.describe(drawn)] if len(drawn) else []) + \
            ([f"left out as stale: {d}" for d in staleness.describe(left)] if len(left) else [])

    def why_empty(self, records) -> str:
        """Why a figure of ``records`` has nothing to draw, in a few words."""
        left = self._left_out_rows(records)
        if not len(left):
            return "no records yet"
        since = sorted({str(c)[:7] for c in left.get("stale_since", pd.Series()).dropna()
                        if str(c)})
        since = ", ".join(since[:3]) + (f" and {len(since) - 3} more" if len(since) > 3 else "")
        what = " and ".join(sorted(left["experiment"].unique())) if "experiment" in left else ""
        return (f"No fresh records: {_cells(left)} of {what or 'its experiment'} are stale, "
                + (f"their code changed since {since}" if since else
                   "the code that made them has changed")
                + ". The notebook's text lists them; `repro record` makes them anew.")

    def stale_rows(self, experiment: str) -> pd.DataFrame:
        """The stale speed records of ``experiment`` left out of the verdicts: a figure may
        draw them as what an earlier program measured (:func:`earlier`), never a verdict."""
        rows = [d[d["experiment"] == experiment] for d in self.left_out if len(d)]
        return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()

    @staticmethod
    def _drawn_stale(records) -> pd.DataFrame:
        if isinstance(records, pd.DataFrame) and len(records) and "stale" in records:
            return records[records["stale"].fillna(False).astype(bool)]
        return pd.DataFrame()

    def _left_out_rows(self, records) -> pd.DataFrame:
        """The left-out stale records of ``records``' experiments (all of them when
        ``records`` names no experiment)."""
        if not self.left_out:
            return pd.DataFrame()
        rows = pd.concat(self.left_out, ignore_index=True).drop_duplicates("source")
        if isinstance(records, pd.DataFrame) and len(records) and "experiment" in records:
            rows = rows[rows["experiment"].isin(records["experiment"].unique())]
        return rows

    def _stale(self, kept: list[pd.DataFrame], v: Verdict) -> pd.DataFrame:
        """The rows of ``kept`` a verdict rests on: where it read its ledger set
        (:meth:`ledger`), those of its cells (the stale ones it read; of ``left_out``, those
        its ledger names); else records of its claim, or of an experiment its ``source``
        names."""
        rows = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()
        if not len(rows):
            return rows
        if v.claim in self.read and kept is self.left_out:  # its ledger's stale cells
            from repro.claims import ledger_set

            return ledger_set.select(rows, v.claim).drop_duplicates("source")
        if v.claim in self.read:  # its ledger set: the cells it read, and no others
            read = pd.concat(self.read[v.claim], ignore_index=True)
            sources = set(read["source"]) if "source" in read else set()
            return rows[rows["source"].isin(sources)].drop_duplicates("source") \
                if "source" in rows else rows.iloc[:0]
        named = {e for e in rows["experiment"].unique()
                 if re.search(rf"\b{re.escape(str(e))}\b", v.source or "")}
        ours = rows["claims"].map(lambda cs: v.claim in (cs or [])) | rows["experiment"].isin(
            named)
        return rows[ours].drop_duplicates("source" if "source" in rows else None)

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
                                        beside_rows=self._stale(self.used, v))
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


#: how a figure draws a stale record's number: hollow and grey, never in a recipe's colour
EARLIER = {"facecolors": "none", "edgecolors": "0.55", "linewidths": 1.0, "zorder": 2}


def earlier(rows: pd.DataFrame) -> str:
    """The legend label of stale records drawn beside fresh ones: "earlier program" and the
    commits that recorded them."""
    commits = sorted({str(c)[:7] for c in rows.get("git_commit", pd.Series()).dropna()})
    return ("earlier program (" + ", ".join(commits[:3])
            + (f" and {len(commits) - 3} more" if len(commits) > 3 else "") + ")")


def _cells(rows: pd.DataFrame) -> str:
    n = rows["source"].nunique() if "source" in rows else len(rows)
    return f"{n} cell{'s' if n != 1 else ''}" if "source" in rows else \
        f"{n} record{'s' if n != 1 else ''}"


def draws_data(fig) -> bool:
    """Whether ``fig`` draws any data: a line or marker, points, bars, a band or an image
    placed in data coordinates (reference lines, spans and text do not count)."""
    for ax in fig.axes:
        if ax.images or any(len(getattr(c, "get_offsets", lambda: [])()) or
                            len(getattr(c, "get_paths", lambda: [])())
                            for c in ax.collections):
            return True
        if any(ln.get_transform() is ax.transData and len(ln.get_xdata())
               for ln in ax.lines):
            return True
        if any(p.get_data_transform() is ax.transData for p in ax.patches):
            return True
    return False


def empty_figure(title: str, why: str = "no records yet"):
    """A figure that says in words why it has nothing to show (``why``): saved where a
    notebook's figure has no fresh record to draw, so a figure the pipeline declares always
    exists and never shows numbers of older code."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.8))
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(why, 80), ha="center", va="center", color="0.3",
            fontsize=10)
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
    this machine, set the plotting style (:func:`repro.plotstyle.use`); print one line saying so."""
    from repro import plotstyle

    profile = config.resolve_profile(profile)
    if scratch:
        results.use_scratch(scratch)
    params = config.stage_params(section, profile) if section else {"profile": profile}
    machine = hardware.detect()
    plotstyle.use()
    pd.set_option("display.width", 160)
    print(f"{name}: profile {profile}; this machine {machine.slug} ({machine.name})")
    return Notebook(name, profile, params, machine, results.repo_root())
