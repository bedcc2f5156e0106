"""The LM training step the performance model reads (notebook 06): ``measure`` (its study);
``spec``: its entry of :mod:`repro.experiments`."""
