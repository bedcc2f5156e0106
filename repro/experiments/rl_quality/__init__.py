"""PPO training quality and its determinism repeats (notebook 04): ``measure`` (its study),
``rules``; ``spec``: its entry of :mod:`repro.experiments`."""
