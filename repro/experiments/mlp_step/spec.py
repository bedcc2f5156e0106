"""The ``mlp_step`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Trace

SPEC = Experiment("mlp_step", "repro.experiments.mlp_step.measure", "07_fp8_train_step",
                  analysis="repro.experiments.mlp_step.tables", step_workload="mlp",
                  trace=Trace("mlp", ("bf16", "fp8-delayed"), 0),
                  formerly=("repro.studies.mlp_step",))
