"""The ``multigpu`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Statistic

_RATE = Statistic("samples_s", work=("extra.work_per_sample",))
SPEC = Experiment("multigpu", "repro.experiments.multigpu.measure", "08_multigpu",
                  formerly=("repro.studies.multigpu",),
                  analysis="repro.experiments.multigpu.tables",
                  statistics={"tokens_per_s": _RATE, "env_steps_per_s": _RATE})
