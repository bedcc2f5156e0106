"""The ``inference`` experiment's spec (:class:`repro.experiments.Experiment`)."""

from repro.experiments._spec import Experiment, Statistic, Trace

SPEC = Experiment("inference", "repro.experiments.inference.measure", "11_inference",
                  formerly=("repro.studies.inference",),
                  analysis="repro.experiments.inference.tables",
                  verdicts="repro.experiments.inference.rules",
                  modules=("repro.experiments.inference.speed",),
                  quality_metrics=("eval_loss", "heldout_loss", "bits_per_byte", "kl_to_bf16",
                                   "top1_agreement"),
                  trace=Trace("inference", ("bf16", "fp8-w"), 4), statistics={
                      "prefill_tokens_per_s": Statistic(
                          "samples_s", work=("sizes.batch", "sizes.seq_len"), rates=True),
                      "decode_tokens_per_s": Statistic(
                          "samples_s", work=("sizes.batch", "sizes.steps"), rates=True)})
