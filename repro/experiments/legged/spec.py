"""The ``legged`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, RL_RETURNS

SPEC = Experiment("legged", "repro.experiments.legged.measure", "10_legged",
                  analysis="repro.experiments.legged.tables",
                  verdicts="repro.experiments.legged.rules", quality_metrics=RL_RETURNS,
                  formerly=("repro.studies.legged",))
