"""The committed figures, read back: what each draws is written into its PNG when a notebook
saves it (repro.plotstyle.plotted), and no figure may show an empty panel or a band outside its
metric's range (an accuracy above 1, a probability below 0). Synthetic figures show that the
checks can fail."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from repro import notebook, plotstyle  # noqa: E402
from repro.claims import ledger  # noqa: E402


def problems(axes: list[dict]) -> list[str]:
    """What is wrong with a figure's plotted data: a panel that draws nothing (a text-only
    panel, one saying why there is nothing, is fine), a series outside its axis's bounds."""
    out = []
    for i, ax in enumerate(axes):
        where = f"panel {i} ({ax['title'] or ax['ylabel']!r})"
        if ax["text"]:
            continue
        if not ax["series"]:
            out.append(f"{where} draws nothing")
        for axis, (low, high) in ax["bounds"].items():
            for s in ax["series"]:
                ext = s.get(axis)
                if ext and (ext[0] < low - 1e-9 or ext[1] > high + 1e-9):
                    out.append(f"{where}: {s['kind']} {s['label']!r} spans {ext} on {axis}, "
                               f"outside [{low}, {high}]")
    return out


def saved(tmp_path, fig) -> list[dict]:
    nb = notebook.Notebook("99_test", "full", {}, None, tmp_path)
    path = nb.save(fig, "99_test", "a test figure")
    return notebook.plotted_of(path)


@pytest.fixture
def staged(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_STAGING", str(tmp_path / "out"))
    return tmp_path


def test_each_committed_figure_draws_every_panel_within_its_metrics_range():
    figures = sorted((ledger.outputs_root() / "figures").glob("*.png"))
    assert len(figures) >= 20
    for path in figures:
        axes = notebook.plotted_of(path)
        assert axes is not None, f"{path.name}: says nothing of what it draws: dvc repro"
        assert not problems(axes), (path.name, problems(axes))


def test_one_or_two_seeds_are_drawn_as_seeds_and_a_band_stays_in_range(staged):
    fig, (a, b) = plt.subplots(1, 2)
    x = np.arange(5)
    plotstyle.seed_band(a, x, [[0.2, 0.9, 0.1, 0.5, 0.95], [0.9, 0.1, 0.8, 0.4, 0.99]], "C0",
                        bounds=(0, 1))
    plotstyle.seed_band(b, x, [[0.2, 0.9, 0.1, 0.5, 0.95], [0.9, 0.1, 0.8, 0.4, 0.99],
                               [0.5, 0.5, 0.5, 0.5, 0.5]], "C1", bounds=(0, 1))
    axes = saved(staged, fig)
    kinds = [[s["kind"] for s in ax["series"]] for ax in axes]
    assert kinds[0] == ["line", "line", "line"]  # the mean and the two seeds, no band
    assert "band" in kinds[1] and axes[1]["bounds"] == {"y": [0, 1]}
    band = next(s for s in axes[1]["series"] if s["kind"] == "band")
    assert band["y"][0] >= 0 and band["y"][1] <= 1  # a t-interval of 3 seeds would leave it
    assert not problems(axes)


def test_an_empty_panel_or_a_band_outside_its_range_is_found(staged):
    fig, (a, b) = plt.subplots(1, 2)
    a.set_title("no records here")  # an empty facet, bare axes
    b.fill_between([0, 1], [0.2, 0.4], [1.3, 1.6], alpha=0.2)
    plotstyle.bounded(b, "y", 0, 1)
    said = problems(saved(staged, fig))
    assert any("draws nothing" in p for p in said)
    assert any("band" in p and "outside [0, 1]" in p for p in said)


def test_a_figure_that_says_why_it_is_empty_is_no_empty_panel(staged):
    fig = notebook.empty_figure("Tokens/s vs BF16", "no records yet")
    axes = saved(staged, fig)
    assert axes and all(ax["text"] for ax in axes) and not problems(axes)
    assert json.loads(json.dumps(axes)) == axes  # plain data
