"""A calibrated step-time model: what a training step costs, GEMM by GEMM and pass by pass.

Claim B2 (NVFP4 training up to 1.6x faster on Blackwell) cannot be measured on a Hopper GPU (no
FP4 tensor cores). This package turns what CAN be measured there into a labelled projection:

- :mod:`~repro.perfmodel.cost`: what a step does (its GEMMs and memory traffic), from shapes.
- :mod:`~repro.perfmodel.measured`: what the ``gemm``, ``mlp_step``, ``lm_step`` and
  ``kernel_times`` records say, read by experiment name.
- :mod:`~repro.perfmodel.calibrate`: the step time of one chip, fitted on its BF16 steps and
  validated on its FP8 ones.
- :mod:`~repro.perfmodel.project`: projections onto B200/GB200/GB300 beside the published
  numbers.

Notebook 06 computes every table from the measured records; the model writes no records.
(``perfmodel.calibrate`` is the module; its function is ``perfmodel.calibrate.calibrate``.)
"""

from repro.perfmodel.calibrate import (ModelParams, component_table, draw_validation, fit_table,
                                       parameter_table, significant, validate,
                                       validation_table)
from repro.perfmodel.cost import GAP_PER
from repro.perfmodel.measured import measured_records
from repro.perfmodel.project import (ASSUMPTIONS, PUBLISHED, TARGETS, calibrations,
                                     measured_fp4_speedups, projection_setup, projections)

__all__ = ["ASSUMPTIONS", "GAP_PER", "PUBLISHED", "TARGETS", "ModelParams", "calibrations",
           "component_table", "draw_validation", "fit_table", "measured_fp4_speedups",
           "measured_records", "parameter_table", "projection_setup", "projections", "significant",
           "validate", "validation_table"]
