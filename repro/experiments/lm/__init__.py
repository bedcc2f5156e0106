"""LM training quality under NVFP4 and FP8 (notebook 05): ``measure`` (its study), ``tables``;
``spec``: its entry of :mod:`repro.experiments`."""
