"""The configuration of GRPO (:mod:`repro.models.grpo`): :class:`GRPOConfig` and its checks.

Configuration errors raise ``repro.config.ConfigError`` with one line, in ``make_train``,
before anything is traced.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from repro.config import ConfigError
from repro.models import lm as M
from repro.models.grpo_task import check_task
from repro.precision.recipes import resolve
from repro.schema import CHECK, NONNEGATIVE, POSITIVE, Range, suggest, type_name


@dataclass(frozen=True)
class GRPOConfig:
    # task (one problem in heldout_every is held out)
    n_digits: int = 1
    heldout_every: int = 10
    # model: repro.models.lm.Decoder
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 192
    recipe: str = "bf16"  # the trainer's precision recipe
    # the rollout engine's: unquantized, or fp8-current (native per-tensor FP8 GEMMs, for
    # timing); DeepSeek-V3's block FP8 rollouts are rollout_fp8 (emulated)
    rollout_recipe: str = "bf16"
    rollout_fp8: bool = False  # DeepSeek-V3 block FP8 in the rollout's block linear layers
    # the rollout engine's KV cache in FP8 E4M3, per-tensor scales per block set by each
    # rollout's prefill (repro.models.lm; emulated: attention computes in the model's dtype)
    rollout_kv_fp8: bool = False
    # GRPO
    steps: int = 50
    prompts_per_step: int = 16
    group_size: int = 8
    temperature: float = 1.0
    constrained: bool = True  # sample only ALPHABET (digits, the end marker)
    updates_per_step: int = 1  # gradient steps on each step's rollouts
    clip_eps: float = 0.2
    is_cap: float | None = 2.0  # truncated importance sampling; None: no correction
    kl_coef: float = 0.0  # k3 KL to the initial policy
    adv_eps: float = 1e-6
    # optimizer: global-norm clipping, then Adam
    lr: float = 3e-3
    b1: float = 0.9
    b2: float = 0.99
    grad_clip: float = 1.0
    # greedy accuracy of the rollout engine on held-out problems, before and after training
    # (0: no evaluation), and every ``eval_every`` steps (0: before and after only)
    eval_problems: int = 64
    eval_every: int = 0
    # supervised warm-up before GRPO (0: none): ``sft_steps`` Adam steps at ``sft_lr`` of
    # teacher-forced cross-entropy on ``sft_batch`` training problems' answers each, in
    # ``sft_recipe``; it depends on the key and these fields only, so every arm of a seed
    # starts GRPO from the same base model
    sft_steps: int = 0
    sft_batch: int = 64
    sft_lr: float = 1e-3
    sft_recipe: str = "bf16"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | "GRPOConfig") -> "GRPOConfig":
        if isinstance(d, GRPOConfig):
            return d
        fields = [f.name for f in dataclasses.fields(cls)]
        bad = sorted(set(d) - set(fields))
        if bad:
            raise ConfigError(f"unknown GRPO config key(s) {bad}{suggest(bad[0], fields)}; "
                              f"valid keys: {fields}")
        return cls(**dict(d))

    @property
    def model_config(self) -> M.LMConfig:
        return M.LMConfig("grpo", d_model=self.d_model, n_layers=self.n_layers,
                          n_heads=self.n_heads, d_ff=self.d_ff,
                          seq_len=self.prompt_len + self.max_new,
                          n_bf16_last_blocks=min(1, self.n_layers))

    @property
    def prompt_len(self) -> int:
        return 2 * self.n_digits + 2

    @property
    def max_new(self) -> int:
        return self.n_digits + 2  # the longest answer and its end marker


# the numbers each field may hold (None passes)
_RANGES = {
    **dict.fromkeys(("d_model", "n_layers", "n_heads", "d_ff", "steps", "prompts_per_step",
                     "group_size", "updates_per_step", "sft_batch"), Range(1)),
    **dict.fromkeys(("lr", "grad_clip", "adv_eps", "clip_eps", "is_cap", "sft_lr"), POSITIVE),
    **dict.fromkeys(("temperature", "kl_coef", "eval_problems", "eval_every", "sft_steps"),
                    NONNEGATIVE),
    **dict.fromkeys(("b1", "b2"), Range(0, 1, hi_open=True)),
}


def validate(config: Mapping[str, Any] | GRPOConfig) -> GRPOConfig:
    """The config as a :class:`GRPOConfig`, or a one-line ConfigError naming the field."""
    c = GRPOConfig.from_dict(config)
    hints = typing.get_type_hints(GRPOConfig)
    for f in dataclasses.fields(c):
        v = getattr(c, f.name)
        if not CHECK.conforms(v, hints[f.name]):
            raise ConfigError(f"GRPO config {f.name}={v!r}: expected {type_name(hints[f.name])}")
        rule = _RANGES.get(f.name)
        if rule is not None and v is not None and v not in rule:
            count = "an int " if rule == Range(1) else ""
            raise ConfigError(f"GRPO config {f.name}={v!r}: must be {count}{rule}")
    if c.group_size < 2:
        raise ConfigError(f"GRPO config group_size={c.group_size}: must be >= 2 (advantages "
                          "are relative to the group)")
    if c.eval_every and c.steps % c.eval_every:
        raise ConfigError(f"GRPO config eval_every={c.eval_every}: must divide steps={c.steps}")
    check_task(c.n_digits, c.heldout_every)
    for name in ("recipe", "rollout_recipe", "sft_recipe"):
        try:
            r = resolve(getattr(c, name))
        except ValueError as e:
            raise ConfigError(f"GRPO config {name}: " + " ".join(str(e).split())) from None
        if name == "rollout_recipe" and r.quantized and not (
                r.gemm == "fp8" and r.scaling == "current" and not c.rollout_fp8):
            raise ConfigError(f"GRPO config rollout_recipe={c.rollout_recipe!r}: must be "
                              "unquantized, or per-tensor FP8 with current scaling (no scaling "
                              "state) without rollout_fp8 (block FP8 rollouts)")
        if name == "sft_recipe" and r.quantized:
            raise ConfigError(f"GRPO config sft_recipe={c.sft_recipe!r}: must be unquantized "
                              "(the warm-up makes one base model for every arm)")
    try:
        c.model_config
    except ValueError as e:
        raise ConfigError(f"GRPO config: {e}") from None
    return c
