"""The ``rl_purejaxrl`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Statistic

SPEC = Experiment("rl_purejaxrl", "repro.experiments.rl_purejaxrl.measure", "09_ppo_speed",
                  formerly=("repro.studies.purejaxrl",),
                  quality_metrics=("final_return",), statistics={
                      "env_steps_per_s": Statistic("run_s", work=("sizes.env_steps",),
                                                   rates=True)})
