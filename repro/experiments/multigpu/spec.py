"""The ``multigpu`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment

SPEC = Experiment("multigpu", "repro.experiments.multigpu.measure", "08_multigpu",
                  analysis="repro.experiments.multigpu.tables",
                  formerly=("repro.studies.multigpu",))
