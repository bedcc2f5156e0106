"""The ``legged`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import RL_RETURNS, Experiment, Statistic

_APART = ("timed apart from the samples: a Python loop of the raw environment's step, "
          "and its first two calls")
SPEC = Experiment("legged", "repro.experiments.legged.measure", "10_legged",
                  formerly=("repro.studies.legged",),
                  analysis="repro.experiments.legged.tables",
                  verdicts="repro.experiments.legged.rules", quality_metrics=RL_RETURNS,
                  statistics={
                      "physics_env_steps_per_s": Statistic(
                          "samples_s", work=("sizes.steps", "sizes.num_envs")),
                      # a speed cell's whole loop; a peer cell's trainer, epoch by epoch
                      "env_steps_per_s": (Statistic("samples_s", work=(
                          "sizes.updates", "sizes.num_envs", "sizes.num_steps")),
                          Statistic("epoch_rates")),
                      "loop_ms_per_update": Statistic("samples_s", scale=1e3,
                                                      per=("sizes.updates",)),
                      "update_ms": Statistic("update_samples_ms"),
                      "policy_ms_per_update": Statistic("policy_samples_ms"),
                      "loop_env_steps_per_s": _APART, "first_call_s": _APART,
                      "second_call_s": _APART,
                      "eval_return": "the mean return of evaluation episodes; epoch_rates "
                      "are the trainer's speeds",
                      "final_return": "the mean return of the episodes completed over the "
                      "last updates; its curve holds means over chunks of updates"})
