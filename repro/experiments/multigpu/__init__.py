"""Scaling over several GPUs (notebook 08): ``measure`` (its study), ``tables``; ``spec``: its
entry of :mod:`repro.experiments`."""
