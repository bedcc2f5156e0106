"""The ``rl_throughput`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Statistic, Trace

SPEC = Experiment("rl_throughput", "repro.experiments.rl_throughput.measure",
                  "03_rl_throughput", verdicts="repro.experiments.rl_throughput.rules",
                  formerly=("repro.studies.rl_throughput",),
                  trace=Trace("ppo", ("bf16", "fp8-delayed"), 3), statistics={
                      "env_steps_per_s": Statistic("samples_s", work=(
                          "extra.updates_per_call", "sizes.batch")),
                      "update_time_ms": Statistic("samples_ms")})
