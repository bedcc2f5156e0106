"""The ``rl_throughput`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Trace

SPEC = Experiment("rl_throughput", "repro.experiments.rl_throughput.measure",
                  "03_rl_throughput", verdicts="repro.experiments.rl_throughput.rules",
                  trace=Trace("ppo", ("bf16", "fp8-delayed"), 3),
                  formerly=("repro.studies.rl_throughput",))
