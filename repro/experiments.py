"""Every experiment and notebook of the repository, declared once.

An :class:`Experiment` says where each part of one experiment lives (its study, tables,
verdict rules and notebook), which record folders its study writes, which of its records are
training quality, and how ``repro trace`` and the performance model read it. A
:class:`Notebook` is one DVC stage. Every list of experiment names elsewhere is derived from
these two tables (``tests/test_experiment_specs.py`` fails on a list kept by hand). Which
claims an experiment's records decide is said once, by each claim's rule in
``repro/data/claims.yaml`` (its ``studies``); the same test checks each study's own ``claims``
against it. This module imports nothing of the package, so any module may import it.

    from repro import experiments
    experiments.get("gemm").study          # 'repro.studies.gemm'
    [e.name for e in experiments.RECORDED]  # what `repro record all` runs, in order
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Trace:
    """How ``repro trace WORKLOAD`` (:mod:`repro.studies.kernel_times`) traces an
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
    ``repro trace`` traces its step."""

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

# `repro record all` runs the recorded ones in this order.
EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("gemm", "repro.studies.gemm", "02_gemm_roofline",
               trace=Trace("gemm", ("bf16", "fp8"), 2)),
    Experiment("mlp_step", "repro.studies.mlp_step", "07_fp8_train_step",
               analysis="repro.analysis.train_step", step_workload="mlp",
               trace=Trace("mlp", ("bf16", "fp8-delayed"), 0)),
    Experiment("lm_step", "repro.studies.lm_step", "06_perfmodel", step_workload="lm",
               trace=Trace("lm", ("bf16", "fp8-delayed"), 1)),
    Experiment("rl_throughput", "repro.studies.rl_throughput", "03_rl_throughput",
               verdicts="repro.claims.verdicts.rl",
               trace=Trace("ppo", ("bf16", "fp8-delayed"), 3)),
    Experiment("rl_quality", "repro.studies.rl_quality", "04_rl_quality",
               verdicts="repro.claims.verdicts.quality", folders=("rl_quality_repeat",),
               quality=True, quality_metrics=(
                   *RL_RETURNS, "same_seed_identical", "different_seeds_differ")),
    Experiment("lm", "repro.studies.lm_quality", "05_lm_nvfp4", analysis="repro.analysis.lm",
               quality=True, quality_metrics=("eval_loss", "final_eval_loss")),
    Experiment("multigpu", "repro.studies.multigpu", "08_multigpu",
               analysis="repro.analysis.scaling"),
    Experiment("rl_purejaxrl", "repro.studies.purejaxrl", "09_ppo_speed",
               quality_metrics=("final_return",)),
    Experiment("inference", "repro.studies.inference", "11_inference",
               analysis="repro.analysis.inference", verdicts="repro.claims.verdicts.inference",
               modules=("repro.studies.inference_speed",),
               quality_metrics=("eval_loss", "heldout_loss", "bits_per_byte", "kl_to_bf16",
                                "top1_agreement"),
               trace=Trace("inference", ("bf16", "fp8-w"), 4)),
    Experiment("legged", "repro.studies.legged", "10_legged", analysis="repro.analysis.legged",
               verdicts="repro.claims.verdicts.legged", quality_metrics=RL_RETURNS),
    Experiment("grpo", "repro.studies.grpo", "12_grpo", analysis="repro.analysis.grpo",
               verdicts="repro.claims.verdicts.grpo",
               quality_metrics=("heldout_accuracy", "base_accuracy")),
    Experiment("kernel_times", "repro.studies.kernel_times", "06_perfmodel",
               analysis="repro.analysis.traces", recorded=False),
)

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
