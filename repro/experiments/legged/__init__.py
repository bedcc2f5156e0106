"""Legged locomotion with Brax (notebook 10): ``measure`` (its study), ``tables``, ``rules``;
``spec``: its entry of :mod:`repro.experiments`."""
