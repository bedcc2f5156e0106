"""The ``lm_step`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Statistic, Trace

SPEC = Experiment("lm_step", "repro.experiments.lm_step.measure", "06_perfmodel",
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
