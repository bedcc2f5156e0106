"""The ``lm`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment

SPEC = Experiment("lm", "repro.experiments.lm.measure", "05_lm_nvfp4",
                  analysis="repro.experiments.lm.tables", quality=True,
                  quality_metrics=("eval_loss", "final_eval_loss"),
                  formerly=("repro.studies.lm_quality",))
