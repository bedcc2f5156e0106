"""Our PPO against PureJaxRL's (notebook 09): ``measure`` (its study); ``spec``: its entry of
:mod:`repro.experiments`."""
