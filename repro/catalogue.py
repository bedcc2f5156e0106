"""Every experiment and notebook of the repository, declared once: the catalogue.

An experiment is one package, ``repro/experiments/<name>/``: ``measure.py`` its study (the
module exporting its ``STUDY``: cells and programs), ``tables.py`` its tables from records,
``rules.py`` its claims' decision rules (each where it has its own) and any helper module that
is its alone. Its entry here (:class:`Experiment`) says where each part lives, which record
folders its study writes, which of its records are training quality, how ``repro trace`` and
the performance model read it and how a record's value follows from its samples. A
:class:`Notebook` is one DVC stage. Every list of experiment names elsewhere is derived from
these two tables (``tests/test_experiment_specs.py`` fails on a list kept by hand). Which
claims an experiment's records decide is said once, by each claim's rule in
``repro/data/claims.yaml`` (its ``studies``); the same test checks each study's own ``claims``
against it.

The catalogue is data: it imports nothing of the package (not the experiments' code), so any
module may import it.

    from repro import catalogue
    catalogue.get("gemm").study          # 'repro.experiments.gemm.measure'
    [e.name for e in catalogue.RECORDED]  # what `repro record all` runs, in order
"""

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
    it (:func:`repro.record_checks.check_value`)."""

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
    against it when it is written and when it is read (:func:`repro.record_checks.check_value`).
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


#: The returns an RL experiment reports (each a quality metric).
RL_RETURNS = ("final_return", "eval_return", "random_return")


# ------------------------------------------------------------------------ the experiments

GEMM = Experiment("gemm", "repro.experiments.gemm.measure", "02_gemm_roofline",
                  trace=Trace("gemm", ("bf16", "fp8"), 2),
                  formerly=("repro.studies.gemm",))

MLP_STEP = Experiment("mlp_step", "repro.experiments.mlp_step.measure", "07_fp8_train_step",
                      formerly=("repro.studies.mlp_step",),
                      analysis="repro.experiments.mlp_step.tables", step_workload="mlp",
                      trace=Trace("mlp", ("bf16", "fp8-delayed"), 0), statistics={
                          "step_time_ms": Statistic("samples_ms"),
                          # measure.step_flops: 6 x batch x width^2 x depth per step
                          "tflops": Statistic("samples_ms", scale=6e3 / 1e12, work=(
                              "sizes.batch", "sizes.width", "sizes.width", "sizes.depth")),
                          "step_memory_bytes": "XLA's memory analysis of the compiled step; "
                          "the samples are the step's times"})

LM_STEP = Experiment("lm_step", "repro.experiments.lm_step.measure", "06_perfmodel",
                     formerly=("repro.studies.lm_step",),
                     step_workload="lm", trace=Trace("lm", ("bf16", "fp8-delayed"), 1),
                     statistics={
                         "step_time_ms": Statistic("samples_ms"),
                         "tokens_per_s": Statistic("samples_ms", scale=1e3,
                                                   work=("sizes.tokens",)),
                         "compile_time_s": "the step's compile time; the samples are its run "
                         "times",
                         "step_memory_bytes": "XLA's memory analysis of the compiled step; "
                         "the samples are the step's times"})

RL_THROUGHPUT = Experiment("rl_throughput", "repro.experiments.rl_throughput.measure",
                           "03_rl_throughput", verdicts="repro.experiments.rl_throughput.rules",
                           formerly=("repro.studies.rl_throughput",),
                           trace=Trace("ppo", ("bf16", "fp8-delayed"), 3), statistics={
                               "env_steps_per_s": Statistic("samples_s", work=(
                                   "extra.updates_per_call", "sizes.batch")),
                               "update_time_ms": Statistic("samples_ms")})

RL_QUALITY = Experiment("rl_quality", "repro.experiments.rl_quality.measure", "04_rl_quality",
                        formerly=("repro.studies.rl_quality",),
                        verdicts="repro.experiments.rl_quality.rules",
                        folders=("rl_quality_repeat",), quality=True, quality_metrics=(
                            *RL_RETURNS, "same_seed_identical", "different_seeds_differ"),
                        statistics={"final_return": "the mean return of the episodes "
                                    "completed over the last updates; its curve holds means "
                                    "over chunks of updates, not those episodes"})

LM = Experiment("lm", "repro.experiments.lm.measure", "05_lm_nvfp4",
                analysis="repro.experiments.lm.tables", quality=True,
                quality_metrics=("eval_loss", "final_eval_loss"),
                formerly=("repro.studies.lm_quality",))

_MULTIGPU_RATE = Statistic("samples_s", work=("extra.work_per_sample",))
MULTIGPU = Experiment("multigpu", "repro.experiments.multigpu.measure", "08_multigpu",
                      formerly=("repro.studies.multigpu",),
                      analysis="repro.experiments.multigpu.tables",
                      statistics={"tokens_per_s": _MULTIGPU_RATE,
                                  "env_steps_per_s": _MULTIGPU_RATE})

RL_PUREJAXRL = Experiment("rl_purejaxrl", "repro.experiments.rl_purejaxrl.measure",
                          "09_ppo_speed", formerly=("repro.studies.purejaxrl",),
                          modules=("repro.experiments.rl_purejaxrl.peer",
                                   "repro.experiments.rl_purejaxrl.runs"),
                          quality_metrics=("final_return",), statistics={
                              "env_steps_per_s": Statistic("run_s", work=("sizes.env_steps",),
                                                           rates=True)})

INFERENCE = Experiment("inference", "repro.experiments.inference.measure", "11_inference",
                       formerly=("repro.studies.inference",),
                       analysis="repro.experiments.inference.tables",
                       verdicts="repro.experiments.inference.rules",
                       modules=("repro.experiments.inference.speed",),
                       quality_metrics=("eval_loss", "heldout_loss", "bits_per_byte",
                                        "kl_to_bf16", "top1_agreement"),
                       trace=Trace("inference", ("bf16", "fp8-w"), 4), statistics={
                           "prefill_tokens_per_s": Statistic(
                               "samples_s", work=("sizes.batch", "sizes.seq_len"), rates=True),
                           "decode_tokens_per_s": Statistic(
                               "samples_s", work=("sizes.batch", "sizes.steps"), rates=True)})

_LEGGED_APART = ("timed apart from the samples: a Python loop of the raw environment's "
                 "step, and its first two calls")
LEGGED = Experiment("legged", "repro.experiments.legged.measure", "10_legged",
                    formerly=("repro.studies.legged",),
                    modules=("repro.experiments.legged.cells",
                             "repro.experiments.legged.schema"),
                    analysis="repro.experiments.legged.tables",
                    verdicts="repro.experiments.legged.rules", quality_metrics=RL_RETURNS,
                    statistics={
                        "physics_env_steps_per_s": Statistic(
                            "samples_s", work=("sizes.steps", "sizes.num_envs")),
                        # a speed cell's whole loop; a peer cell's trainer, epoch by epoch
                        "env_steps_per_s": (Statistic("samples_s", work=(
                            "sizes.updates", "sizes.num_envs", "sizes.num_steps")),
                            Statistic("epoch_rates")),
                        "loop_ms_per_update": Statistic("samples_s", scale=1e3,
                                                        per=("sizes.updates",)),
                        "update_ms": Statistic("update_samples_ms"),
                        "policy_ms_per_update": Statistic("policy_samples_ms"),
                        "loop_env_steps_per_s": _LEGGED_APART, "first_call_s": _LEGGED_APART,
                        "second_call_s": _LEGGED_APART,
                        "eval_return": "the mean return of evaluation episodes; epoch_rates "
                        "are the trainer's speeds",
                        "final_return": "the mean return of the episodes completed over the "
                        "last updates; its curve holds means over chunks of updates"})

_GRPO_ACCURACY = ("the accuracy of a policy on held-out problems; its lists are the "
                  "training curves")
GRPO = Experiment("grpo", "repro.experiments.grpo.measure", "12_grpo",
                  formerly=("repro.studies.grpo",),
                  analysis="repro.experiments.grpo.tables",
                  verdicts="repro.experiments.grpo.rules",
                  quality_metrics=("heldout_accuracy", "base_accuracy"), statistics={
                      "rl_step_s": Statistic("step_samples_s"),
                      "rollout_tokens_per_s": Statistic(
                          "rollout_samples_s", work=("extra.rollout_tokens",), rates=True),
                      "update_s": Statistic("update_samples_s"),
                      "heldout_accuracy": _GRPO_ACCURACY, "base_accuracy": _GRPO_ACCURACY})

KERNEL_TIMES = Experiment("kernel_times", "repro.experiments.kernel_times.measure",
                          "06_perfmodel", analysis="repro.experiments.kernel_times.tables",
                          recorded=False, formerly=("repro.studies.kernel_times",))

# `repro record all` runs the recorded ones in this order.
EXPERIMENTS: tuple[Experiment, ...] = (
    GEMM, MLP_STEP, LM_STEP, RL_THROUGHPUT, RL_QUALITY, LM, MULTIGPU, RL_PUREJAXRL, INFERENCE,
    LEGGED, GRPO, KERNEL_TIMES)

# One stage per notebook, in this order.
NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("01_formats", "formats", ("formats",)),
    Notebook("02_gemm_roofline", "gemm_roofline", ("gemm",)),
    Notebook("03_rl_throughput", "rl_throughput", ("rl_throughput",)),
    Notebook("04_rl_quality", "rl_quality", ("rl_quality",)),
    Notebook("05_lm_nvfp4", "lm", ("lm",)),
    Notebook("06_perfmodel", "perfmodel", ("perfmodel",)),
    Notebook("07_fp8_train_step", "fp8_train_step", ("mlp_step",)),
    Notebook("08_multigpu", "multigpu", ("multigpu",)),
    Notebook("09_ppo_speed", "ppo_speed"),
    Notebook("10_legged", "legged", ("legged",)),
    Notebook("11_inference", "inference", ("inference",)),
    Notebook("12_grpo", "grpo", ("grpo",)),
)

_BY_NAME = {e.name: e for e in EXPERIMENTS}
#: What ``repro record`` runs (its params.yaml section is named as the experiment).
RECORDED = tuple(e for e in EXPERIMENTS if e.recorded)
#: The sections of params.yaml: each notebook's and each recorded experiment's.
SECTIONS = tuple(dict.fromkeys([*(s for n in NOTEBOOKS for s in n.params),
                                *(e.name for e in RECORDED)]))
#: Record folders named otherwise than the experiment whose study writes them.
RECORDED_BY = {f: e.name for e in EXPERIMENTS for f in e.folders}
#: Experiments (and their record folders) whose every record is training quality.
QUALITY_EXPERIMENTS = frozenset(x for e in EXPERIMENTS if e.quality for x in (e.name, *e.folders))
#: Metrics that say how well a run learned or how close a result is to its reference.
QUALITY_METRICS = frozenset(m for e in EXPERIMENTS for m in e.quality_metrics)
#: A study's former module path -> its module now (records made before a move name the old one).
FORMER = {old: e.study for e in EXPERIMENTS for old in e.formerly}
#: ``repro trace``'s workloads, in the order it lists them.
TRACED = tuple(sorted((e for e in EXPERIMENTS if e.trace), key=lambda e: e.trace.rank))


def get(name: str) -> Experiment:
    """The experiment ``name``; a one-line ``ValueError`` naming the valid ones if none."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown experiment {name!r}; valid experiments: "
                         f"{', '.join(e.name for e in RECORDED)}")
    return _BY_NAME[name]


def notebook(name: str) -> Notebook:
    """The notebook ``name`` (``01_formats``)."""
    found = [n for n in NOTEBOOKS if n.name == name]
    if not found:
        raise ValueError(f"unknown notebook {name!r}; valid notebooks: "
                         f"{', '.join(n.name for n in NOTEBOOKS)}")
    return found[0]
