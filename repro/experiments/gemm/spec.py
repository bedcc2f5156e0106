"""The ``gemm`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Trace

SPEC = Experiment("gemm", "repro.experiments.gemm.measure", "02_gemm_roofline",
                  trace=Trace("gemm", ("bf16", "fp8"), 2),
                  formerly=("repro.studies.gemm",))
