"""The ``grpo`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment

SPEC = Experiment("grpo", "repro.experiments.grpo.measure", "12_grpo",
                  analysis="repro.experiments.grpo.tables",
                  verdicts="repro.experiments.grpo.rules",
                  quality_metrics=("heldout_accuracy", "base_accuracy"),
                  formerly=("repro.studies.grpo",))
