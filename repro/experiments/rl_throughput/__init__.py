"""PPO throughput: the whole loop, the update step (notebook 03): ``measure`` (its study),
``rules``; ``spec``: its entry of :mod:`repro.experiments`."""
