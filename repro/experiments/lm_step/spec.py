"""The ``lm_step`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Trace

SPEC = Experiment("lm_step", "repro.experiments.lm_step.measure", "06_perfmodel",
                  step_workload="lm", trace=Trace("lm", ("bf16", "fp8-delayed"), 1),
                  formerly=("repro.studies.lm_step",))
