"""The ``kernel_times`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment

SPEC = Experiment("kernel_times", "repro.experiments.kernel_times.measure", "06_perfmodel",
                  analysis="repro.experiments.kernel_times.tables", recorded=False,
                  formerly=("repro.studies.kernel_times",))
