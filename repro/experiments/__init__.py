"""Every experiment and notebook of the repository, declared once.

Each experiment is one package, ``repro/experiments/<name>/``: ``measure.py`` its study (the
module exporting its ``STUDY``: cells and programs), ``tables.py`` its tables from records,
``rules.py`` its claims' decision rules (each where it has its own), any helper module that
is its alone, and ``spec.py``: its :class:`Experiment`, which says where each part lives,
which record folders its study writes, which of its records are training quality, and how
``repro trace`` and the performance model read it. :data:`EXPERIMENTS` collects the specs. A
:class:`Notebook` is one DVC stage. Every list of experiment names elsewhere is derived from
these two tables (``tests/test_experiment_specs.py`` fails on a list kept by hand). Which
claims an experiment's records decide is said once, by each claim's rule in
``repro/data/claims.yaml`` (its ``studies``); the same test checks each study's own ``claims``
against it. This module imports only the specs (not the experiments' code), so any module may
import it.

    from repro import experiments
    experiments.get("gemm").study          # 'repro.experiments.gemm.measure'
    [e.name for e in experiments.RECORDED]  # what `repro record all` runs, in order
"""

from __future__ import annotations

from repro.experiments._spec import RL_RETURNS, Experiment, Notebook, Trace
from repro.experiments.gemm import spec as _gemm
from repro.experiments.grpo import spec as _grpo
from repro.experiments.inference import spec as _inference
from repro.experiments.kernel_times import spec as _kernel_times
from repro.experiments.legged import spec as _legged
from repro.experiments.lm import spec as _lm
from repro.experiments.lm_step import spec as _lm_step
from repro.experiments.mlp_step import spec as _mlp_step
from repro.experiments.multigpu import spec as _multigpu
from repro.experiments.rl_purejaxrl import spec as _rl_purejaxrl
from repro.experiments.rl_quality import spec as _rl_quality
from repro.experiments.rl_throughput import spec as _rl_throughput

__all__ = ["RL_RETURNS", "Experiment", "Notebook", "Trace", "EXPERIMENTS", "NOTEBOOKS",
           "RECORDED", "SECTIONS", "RECORDED_BY", "QUALITY_EXPERIMENTS", "QUALITY_METRICS",
           "TRACED", "FORMER", "get", "notebook"]

# `repro record all` runs the recorded ones in this order.
EXPERIMENTS: tuple[Experiment, ...] = tuple(m.SPEC for m in (
    _gemm, _mlp_step, _lm_step, _rl_throughput, _rl_quality, _lm, _multigpu, _rl_purejaxrl,
    _inference, _legged, _grpo, _kernel_times))

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
