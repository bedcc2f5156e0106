"""The ``mlp_step`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Statistic, Trace

SPEC = Experiment("mlp_step", "repro.experiments.mlp_step.measure", "07_fp8_train_step",
                  formerly=("repro.studies.mlp_step",),
                  analysis="repro.experiments.mlp_step.tables", step_workload="mlp",
                  trace=Trace("mlp", ("bf16", "fp8-delayed"), 0), statistics={
                      "step_time_ms": Statistic("samples_ms"),
                      # measure.step_flops: 6 x batch x width^2 x depth per step
                      "tflops": Statistic("samples_ms", scale=6e3 / 1e12, work=(
                          "sizes.batch", "sizes.width", "sizes.width", "sizes.depth")),
                      "step_memory_bytes": "XLA's memory analysis of the compiled step; "
                      "the samples are the step's times"})
