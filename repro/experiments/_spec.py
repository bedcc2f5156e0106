"""The spec dataclasses: what each experiment's ``spec.py`` declares (:class:`Experiment`) and
the notebooks' stages (:class:`Notebook`). Imports nothing of the package, so that any module
may import :mod:`repro.experiments`."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Mapping, Union


@dataclass(frozen=True)
class Trace:
    """How ``repro trace WORKLOAD`` (:mod:`repro.experiments.kernel_times.measure`) traces an
    experiment's step: ``recipes`` when none are given; ``rank``: the workload's place in the
    command's list of workloads."""

    workload: str
    recipes: tuple[str, ...]
    rank: int


@dataclass(frozen=True)
class Statistic:
    """How a record's ``value`` follows from its timed samples, ``extra[samples]``: their
    median times ``scale``, divided by the product of the record's fields ``per``; or, with
    ``work`` (record fields, dotted: ``"sizes.batch"``, ``"extra.work_per_sample"``, whose
    product is the work one sample did), a rate: ``scale * work / median`` (``rates``: the
    median of the per-sample rates ``scale * work / sample``). A record checks itself against
    it (:func:`repro.results.check_value`)."""

    samples: str
    scale: float = 1.0
    work: tuple[str, ...] = ()
    per: tuple[str, ...] = ()
    rates: bool = False

    def of(self, rec: Mapping[str, Any]) -> tuple[float, float] | None:
        """(the value the samples give, the relative tolerance of a comparison with it), or
        None where the record holds no such samples. Samples stored rounded (to ``d`` decimal
        places) move the median by up to half a unit of their last place: the tolerance is
        that, relative to the smallest sample, plus 1e-9. A ``ValueError`` (one phrase) where
        the samples or the fields cannot give a value."""
        s = (rec.get("extra") or {}).get(self.samples)
        if s is None:
            return None
        if not isinstance(s, list) or not s or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                and x > 0 for x in s):
            raise ValueError(f"extra.{self.samples} is not a list of numbers > 0")
        work = scale = self.scale
        for name in self.work:
            work *= _number(rec, name)
        for name in self.per:
            scale /= _number(rec, name)
        if self.rates:
            value = statistics.median(work / x for x in s)
        elif self.work:
            value = work / statistics.median(s)
        else:
            value = scale * statistics.median(s)
        places = max(-min(Decimal(repr(float(x))).as_tuple().exponent, 0) for x in s)
        return value, 1e-9 + 1.01 * 0.5 * 10.0 ** -places / min(s)

    def describe(self) -> str:
        """The statistic in words, for a message."""
        of = f"extra.{self.samples}"
        if self.rates:
            return f"the median of {self._work()} / each of {of}"
        if self.work:
            return f"{self._work()} / the median of {of}"
        per = "".join(f" / {p}" for p in self.per)
        return f"the median of {of}" + (f" x {self.scale:g}" if self.scale != 1 else "") + per

    def _work(self) -> str:
        return " x ".join(([f"{self.scale:g}"] if self.scale != 1 else []) + list(self.work))


def _number(rec: Mapping[str, Any], dotted: str) -> float:
    v: Any = rec
    for part in dotted.split("."):
        v = v.get(part) if isinstance(v, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{dotted} is not a number > 0 ({v!r})")
    return float(v)


#: How each metric's ``value`` follows from a record's lists of numbers (``extra``): one
#: :class:`Statistic`, several (the first whose samples the record holds applies), or a
#: sentence saying why it does not follow from them.
Statistics = Mapping[str, Union[Statistic, tuple[Statistic, ...], str]]


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
    ``repro trace`` traces its step. ``statistics``: how each metric's ``value`` follows
    from the lists of numbers its records hold (:data:`Statistics`); a record is checked
    against it when it is written and when it is read (:func:`repro.results.check_value`).
    ``formerly``: module paths its study had before a move: records made there name them,
    and their code is found here (:mod:`repro.provenance`)."""

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
    statistics: Statistics = field(default_factory=dict, hash=False, compare=False)

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
