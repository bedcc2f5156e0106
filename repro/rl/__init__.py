"""Reinforcement learning under precision recipes: networks, PPO, and the RL studies.

``repro.rl.networks`` (actor-critic MLP/CNN), ``repro.rl.ppo`` (PureJaxRL-shaped PPO on
gymnax 1.0), ``repro.rl.experiments`` (``record_throughput``, ``record_quality``).
"""
