"""The spec dataclasses: what each experiment's ``spec.py`` declares (:class:`Experiment`) and
the notebooks' stages (:class:`Notebook`). Imports nothing of the package, so that any module
may import :mod:`repro.experiments`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Trace:
    """How ``repro trace WORKLOAD`` (:mod:`repro.experiments.kernel_times.measure`) traces an
    experiment's step: ``recipes`` when none are given; ``rank``: the workload's place in the
    command's list of workloads."""

    workload: str
    recipes: tuple[str, ...]
    rank: int


@dataclass(frozen=True)
class Experiment:
    """One experiment. ``name``: its records' folder (``results/HW/NAME``), its params.yaml
    section and ``repro record NAME``. ``study``: the module exporting its ``STUDY``;
    ``modules``: other modules that are the experiment's alone (a study's helpers);
    ``analysis``: its tables; ``verdicts``: its claims' rules; ``notebook``: the notebook
    that shows its records. ``folders``: other record folders its study writes (a repeat of
    recorded cells). ``recorded``: ``repro record`` runs it (False: ``repro trace``, its
    parameters from the command line). ``quality``: every record is training quality;
    ``quality_metrics``: its metrics that are quality (a stale one still decides its verdict:
    :mod:`repro.claims.staleness`). ``step_workload``: the performance model reads its step
    times as steps of this workload (:mod:`repro.perfmodel.measured`). ``trace``: how
    ``repro trace`` traces its step. ``formerly``: module paths its study had before a move:
    records made there name them, and their code is found here (:mod:`repro.provenance`)."""

    name: str
    study: str
    notebook: str
    analysis: str | None = None
    verdicts: str | None = None
    modules: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    recorded: bool = True
    quality: bool = False
    quality_metrics: tuple[str, ...] = ()
    step_workload: str | None = None
    trace: Trace | None = None
    formerly: tuple[str, ...] = ()

    def source(self, *metrics: str) -> str:
        """A verdict's ``source``: this experiment's records, with the ``metrics`` it reads."""
        return f"results/*/{self.name} ({', '.join(metrics)})"

    @property
    def owned(self) -> tuple[str, ...]:
        """The modules that belong to this experiment (no other experiment imports them)."""
        return tuple(m for m in (self.study, *self.modules, self.analysis, self.verdicts) if m)


@dataclass(frozen=True)
class Notebook:
    """One notebook (``notebooks/NAME.py``) and its DVC stage ``stage``; ``params``: the
    params.yaml sections it reads besides ``profile``."""

    name: str
    stage: str
    params: tuple[str, ...] = ()


RL_RETURNS = ("final_return", "eval_return", "random_return")


#: The returns an RL experiment reports (each a quality metric).
RL_RETURNS = ("final_return", "eval_return", "random_return")
