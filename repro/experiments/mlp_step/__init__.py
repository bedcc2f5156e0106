"""The FP8 MLP training step (notebook 07): ``measure`` (its study), ``tables``; ``spec``: its
entry of :mod:`repro.experiments`."""
