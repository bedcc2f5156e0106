"""The ``rl_quality`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, RL_RETURNS

SPEC = Experiment("rl_quality", "repro.experiments.rl_quality.measure", "04_rl_quality",
                  formerly=("repro.studies.rl_quality",),
                  verdicts="repro.experiments.rl_quality.rules",
                  folders=("rl_quality_repeat",), quality=True, quality_metrics=(
                      *RL_RETURNS, "same_seed_identical", "different_seeds_differ"),
                  statistics={"final_return": "the mean return of the episodes completed "
                              "over the last updates; its curve holds means over chunks of "
                              "updates, not those episodes"})
