"""The ``grpo`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Statistic

_ACCURACY = ("the accuracy of a policy on held-out problems; its lists are the training "
             "curves")
SPEC = Experiment("grpo", "repro.experiments.grpo.measure", "12_grpo",
                  formerly=("repro.studies.grpo",),
                  analysis="repro.experiments.grpo.tables",
                  verdicts="repro.experiments.grpo.rules",
                  quality_metrics=("heldout_accuracy", "base_accuracy"), statistics={
                      "rl_step_s": Statistic("step_samples_s"),
                      "rollout_tokens_per_s": Statistic(
                          "rollout_samples_s", work=("extra.rollout_tokens",), rates=True),
                      "update_s": Statistic("update_samples_s"),
                      "heldout_accuracy": _ACCURACY, "base_accuracy": _ACCURACY})
