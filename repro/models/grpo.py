"""GRPO of the decoder LM on a verifiable task, with FP8 rollouts and truncated importance
sampling; PureJaxRL-shaped: ``make_train(config) -> train(rng)``.

    train = jax.jit(grpo.make_train({"n_digits": 1, "steps": 40, "rollout_fp8": True}))
    out = train(jax.random.key(0))
    out["metrics"]["reward"]          # [steps] mean reward of each step's rollouts
    out["heldout_reward"]             # [2] greedy accuracy on held-out problems, before/after

The task is multi-digit addition rendered in the LM's byte tokens: the prompt ``"07+45="``
(operands zero-padded to ``n_digits``), the answer ``"52"`` and the end marker ``"\\n"``.
Problems are drawn on the fly from a PRNG key; a hash of the unordered operand pair puts one
problem in ``heldout_every`` in the held-out split (``a+b`` and ``b+a`` always together), which
training never draws. :func:`reward` is the exact-match verifier on text,
:func:`reward_tokens` the same rule on token arrays, inside the jitted run.

One step (GRPO, arXiv 2402.03300, as NeMo RL runs it): ``prompts_per_step`` problems, a
group of ``group_size`` completions of each sampled by the rollout engine (the KV-cache decoder
of ``repro.models.lm_decode``), rewards, group-normalized advantages, then
``updates_per_step`` gradient steps of :func:`grpo_loss` on the trainer's log-probabilities.

FP8 rollouts (NVIDIA's NeMo RL end-to-end FP8 RL): with ``rollout_fp8`` the rollout engine
runs the block linear layers (``repro.models.lm.BLOCK_LINEAR_PATH``) in DeepSeek-V3's
block-scaled FP8 (``repro.precision.blockfp8``): the weights the trainer
hands it in 128x128 blocks, each layer's input activations in 1x128 blocks, FP32 scales. This
is emulated: quantize-dequantize, then the GEMM in ``rollout_recipe``'s compute dtype (FP32:
the FP8 products exactly, up to FP32 accumulation). Embedding, head, attention and norms stay
in ``rollout_recipe``. The trainer (``recipe``) then scores tokens a slightly different
policy drew; the truncated importance-sampling weight ``min(pi_trainer / pi_rollout, is_cap)``
corrects the gradient for it. With ``rollout_kv_fp8`` the rollout engine's KV cache is FP8
too (E4M3, a per-tensor scale per block and for keys and values, set from each rollout's
prompts: ``repro.models.lm``), as the source's 1.48x setup had; emulated likewise.

Configuration errors raise ``repro.config.ConfigError`` with one line, in ``make_train``,
before anything is traced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from repro.config import ConfigError
from repro.models import lm as M
from repro.models import lm_data as D
from repro.models import lm_decode as G
from repro.precision import blockfp8 as B
from repro.precision import layers
from repro.precision.recipes import resolve

END = "\n"
END_TOKEN = ord(END)
SPACE_TOKEN = ord(" ")
ZERO_TOKEN = ord("0")
ALPHABET = "0123456789" + END  # what a completion needs; ``constrained`` sampling keeps to it
MAX_DIGITS = 8  # sums stay inside int32


# -------------------------------------------------------------------------------- task


def _mix(a, b):
    """A 32-bit hash of the unordered pair {a, b} (jnp; the same on every platform)."""
    lo = jnp.minimum(a, b).astype(jnp.uint32)
    hi = jnp.maximum(a, b).astype(jnp.uint32)
    h = lo * jnp.uint32(0x9E3779B1) ^ (hi + jnp.uint32(0x7F4A7C15)) * jnp.uint32(0x85EBCA77)
    h = (h ^ (h >> 15)) * jnp.uint32(0x2C1B3C6D)
    h = (h ^ (h >> 12)) * jnp.uint32(0x297A2D39)
    return h ^ (h >> 15)


def is_heldout(a, b, heldout_every: int):
    """Whether the problem ``a + b`` belongs to the held-out split (bool array)."""
    return _mix(jnp.asarray(a), jnp.asarray(b)) % jnp.uint32(heldout_every) == 0


def sample_problems(key, n: int, n_digits: int, heldout_every: int, split: str = "train"):
    """``(a, b)``: ``n`` problems of ``split`` ("train" or "heldout"), int32 ``[n]`` each,
    operands uniform in ``[0, 10**n_digits)``; a pure function of ``key``. Problems of the
    other split are redrawn (``lax.while_loop``), so both splits must be non-empty
    (:func:`check_task`)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"sample_problems: split must be 'train' or 'heldout', got {split!r}")
    hi = 10 ** n_digits

    def wrong(ab):
        return is_heldout(ab[0], ab[1], heldout_every) != (split == "heldout")

    def redraw(state):
        key, ab = state
        key, sub = jax.random.split(key)
        return key, jnp.where(wrong(ab), jax.random.randint(sub, (2, n), 0, hi), ab)

    key, sub = jax.random.split(key)
    _, ab = jax.lax.while_loop(lambda s: jnp.any(wrong(s[1])), redraw,
                               (key, jax.random.randint(sub, (2, n), 0, hi)))
    return ab[0], ab[1]


def check_task(n_digits: int, heldout_every: int) -> None:
    """Both splits of the task must hold a problem (else drawing one never ends)."""
    if not (isinstance(n_digits, int) and 1 <= n_digits <= MAX_DIGITS):
        raise ConfigError(f"n_digits must be an int in [1, {MAX_DIGITS}], got {n_digits!r}")
    if not (isinstance(heldout_every, int) and heldout_every >= 2):
        raise ConfigError(f"heldout_every must be an int >= 2, got {heldout_every!r}")
    if n_digits <= 3:
        a, b = np.meshgrid(np.arange(10 ** n_digits), np.arange(10 ** n_digits))
        held = np.asarray(is_heldout(a.ravel(), b.ravel(), heldout_every))
        if held.all() or not held.any():
            raise ConfigError(f"heldout_every={heldout_every} leaves an empty split of the "
                              f"{n_digits}-digit problems")


def prompt_text(a: int, b: int, n_digits: int) -> str:
    """``"07+45="`` for (7, 45) with 2 digits."""
    return f"{a:0{n_digits}d}+{b:0{n_digits}d}="


def prompt_tokens(a, b, n_digits: int):
    """Byte tokens of :func:`prompt_text`, int32 ``[n, 2 * n_digits + 2]`` (jnp)."""
    pw = 10 ** jnp.arange(n_digits - 1, -1, -1)

    def digits(x):
        return (jnp.asarray(x)[:, None] // pw) % 10 + ZERO_TOKEN

    n = jnp.shape(a)[0]
    plus, eq = jnp.full((n, 1), ord("+")), jnp.full((n, 1), ord("="))
    return jnp.concatenate([digits(a), plus, digits(b), eq], axis=1).astype(jnp.int32)


def answer_tokens(a, b, length: int):
    """The right completion of each problem ``a + b`` as tokens, int32 ``[n, length]``: the
    sum's canonical digits, then end markers to ``length`` (the first one ends the answer;
    ``length`` must exceed the longest sum's digits). What the supervised warm-up teaches."""
    s = (jnp.asarray(a) + jnp.asarray(b)).astype(jnp.int32)[:, None]
    n_digits = 1 + jnp.sum(s >= 10 ** jnp.arange(1, MAX_DIGITS + 1), axis=1, keepdims=True)
    pos = jnp.arange(length)[None, :]
    pw = 10 ** jnp.clip(n_digits - 1 - pos, 0, MAX_DIGITS)
    return jnp.where(pos < n_digits, (s // pw) % 10 + ZERO_TOKEN, END_TOKEN).astype(jnp.int32)


def reward(prompt: str, completion: str) -> float:
    """Exact match: 1.0 if the completion, up to its first end marker and with spaces around
    it stripped, is the sum in canonical decimal ("52"; not "052" nor "+52"), else 0.0. A
    completion without an end marker (cut at the length limit) scores 0."""
    m = re.fullmatch(r"(\d+)\+(\d+)=", prompt)
    if m is None:
        raise ValueError(f"reward: prompt {prompt!r} is not of the form 'A+B='")
    if END not in completion:
        return 0.0
    return float(completion.split(END, 1)[0].strip(" ") == str(int(m[1]) + int(m[2])))


def reward_tokens(tokens, a, b):
    """:func:`reward` of completions ``tokens[B, L]`` (bytes) for problems ``a + b``
    (``[B]``), float32 ``[B]``, in jnp."""
    tokens = jnp.asarray(tokens)
    length = tokens.shape[1]
    pos = jnp.arange(length)[None, :]
    is_end = tokens == END_TOKEN
    end = jnp.argmax(is_end, axis=1)[:, None]
    body = (tokens != SPACE_TOKEN) & (pos < end)  # the answer between the stripped spaces
    first = jnp.argmax(body, axis=1)[:, None]
    last = length - 1 - jnp.argmax(body[:, ::-1], axis=1)[:, None]
    s = (jnp.asarray(a) + jnp.asarray(b)).astype(jnp.int32)[:, None]
    n_digits = 1 + jnp.sum(s >= 10 ** jnp.arange(1, MAX_DIGITS + 1), axis=1, keepdims=True)
    rel = pos - first  # digit index inside the answer
    pw = 10 ** jnp.clip(n_digits - 1 - rel, 0, MAX_DIGITS)
    want = (s // pw) % 10 + ZERO_TOKEN
    inside = (pos >= first) & (pos <= last)
    ok = (jnp.any(is_end, axis=1) & jnp.any(body, axis=1)
          & (last - first + 1 == n_digits)[:, 0]
          & jnp.all(jnp.where(inside, tokens == want, True), axis=1))
    return ok.astype(jnp.float32)


# ------------------------------------------------------------------------------- GRPO


def group_advantages(rewards, eps: float = 1e-6):
    """GRPO's advantages of ``rewards[P, G]`` (G completions of each of P prompts):
    ``(r - group mean) / (group std + eps)``, the population std (ddof 0). A group whose
    rewards are all equal gets advantage exactly 0 (its float32 mean may differ from its
    rewards by an ulp, which ``eps`` alone would blow up)."""
    r = jnp.asarray(rewards, jnp.float32)
    mean = jnp.mean(r, axis=-1, keepdims=True)
    std = jnp.sqrt(jnp.mean(jnp.square(r - mean), axis=-1, keepdims=True))
    same = jnp.all(r == r[..., :1], axis=-1, keepdims=True)
    return jnp.where(same, 0.0, (r - mean) / (std + eps))


def grpo_loss(logp_new, logp_old, logp_rollout, advantages, mask, clip_eps: float = 0.2,
              is_cap: float | None = 2.0, kl_coef: float = 0.0, logp_ref=None):
    """GRPO's clipped policy-gradient loss, a mean over the valid tokens of the batch.

    Per token: ``-min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A) * w``, with
    ``ratio = exp(logp_new - logp_old)`` (``logp_old``: the trainer's log-probabilities before
    this step's updates) and ``w = min(exp(logp_old - logp_rollout), is_cap)``, the truncated
    importance-sampling weight of the trainer's over the rollout engine's probabilities
    (a constant: no gradient; ``is_cap=None``: ``w = 1``, no correction). With ``kl_coef``,
    plus ``kl_coef * (exp(r) - r - 1)``, ``r = logp_ref - logp_new`` (the k3 estimator of
    KL(new || ref)). ``logp_*``, ``mask``: ``[B, T]``; ``advantages``: ``[B]`` (one per
    sequence) or ``[B, T]``. Tokens where ``mask`` is 0 (padding, tokens after the end marker)
    contribute nothing, not even through a NaN or inf in their log-probabilities; an all-zero
    mask gives loss 0.

    Returns ``(loss, diagnostics)``: ``mismatch_kl`` (the k3 estimate of
    KL(rollout || trainer) on the rollout's tokens), ``is_capped_frac`` (valid tokens whose
    weight was truncated), ``clip_frac`` (valid tokens with ``|ratio - 1| > clip_eps``),
    ``kl_ref`` (the mean k3 to the reference; 0 without one).
    """
    if is_cap is not None and not is_cap > 0:
        raise ValueError(f"grpo_loss: is_cap must be > 0 or None, got {is_cap!r}")
    if kl_coef and logp_ref is None:
        raise ValueError("grpo_loss: kl_coef != 0 needs logp_ref")
    valid = jnp.asarray(mask) > 0
    n = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)

    def clean(x):  # masked entries replaced before any arithmetic: no NaN reaches a gradient
        return jnp.where(valid, jnp.asarray(x, jnp.float32), 0.0)

    def mean(x):
        return jnp.sum(jnp.where(valid, x, 0.0)) / n

    new, old, roll = clean(logp_new), clean(logp_old), clean(logp_rollout)
    adv = jnp.asarray(advantages, jnp.float32)
    adv = clean(adv[:, None] if adv.ndim == 1 else adv)
    ratio = jnp.exp(new - old)
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    raw = jax.lax.stop_gradient(jnp.exp(old - roll))
    w = jnp.ones_like(raw) if is_cap is None else jnp.minimum(raw, is_cap)
    per_token = w * pg
    kl_ref = jnp.zeros_like(new)
    if logp_ref is not None:
        r = clean(logp_ref) - new
        kl_ref = jnp.expm1(r) - r  # exp(r) - r - 1, accurate for small r
        per_token = per_token + kl_coef * kl_ref
    d = old - roll
    diag = {
        "mismatch_kl": mean(jnp.expm1(d) - d),
        "is_capped_frac": mean((raw > is_cap) if is_cap is not None else jnp.zeros_like(raw)),
        "clip_frac": mean(jnp.abs(ratio - 1) > clip_eps),
        "kl_ref": mean(kl_ref),
    }
    return mean(per_token), jax.tree.map(jax.lax.stop_gradient, diag)


# ---------------------------------------------------------------------------- rollouts


class Rollout(NamedTuple):
    prompts: jax.Array  # int32 [P * G, Tp], prompt p repeated in rows p * G .. p * G + G - 1
    tokens: jax.Array  # int32 [P * G, L], the completions
    logp: jax.Array  # float32 [P * G, L], the rollout engine's log-probabilities of them
    mask: jax.Array  # bool [P * G, L], tokens up to and including the first end marker


def policy_logits(logits, temperature: float, allowed=None):
    """The logits the policy samples from: disallowed tokens (``allowed``: bool ``[V]``)
    removed, divided by ``temperature`` (> 0)."""
    logits = jnp.asarray(logits, jnp.float32)
    if allowed is not None:
        logits = jnp.where(allowed, logits, -1e9)
    return logits / temperature


def completion_mask(tokens, end_token: int = END_TOKEN):
    """True up to and including the first ``end_token`` of each row; all True without one."""
    is_end = tokens == end_token
    end = jnp.where(jnp.any(is_end, axis=1), jnp.argmax(is_end, axis=1), tokens.shape[1])
    return jnp.arange(tokens.shape[1])[None, :] <= end[:, None]


def sample_groups(model, variables, prompts, group_size: int, max_new: int, key,
                  temperature: float = 1.0, allowed=None, end_token: int = END_TOKEN, *,
                  kv_fp8: bool = False) -> Rollout:
    """``group_size`` completions of ``max_new`` tokens for each of ``prompts[P, Tp]``, drawn
    from ``softmax(policy_logits)`` through the KV cache (``repro.models.lm_decode``: one
    prefill, then a scan of decode steps; ``kv_fp8``: an FP8 cache), with the
    log-probability of every token drawn. ``temperature`` 0 is greedy (log-probabilities then
    at temperature 1). Not jitted: callers jit."""
    if group_size < 1 or max_new < 1:
        raise ValueError(f"sample_groups: group_size and max_new must be >= 1, got "
                         f"{group_size}, {max_new}")
    prompts = jnp.repeat(jnp.asarray(prompts, jnp.int32), group_size, axis=0)
    b, tp = prompts.shape

    def draw(logits, k):
        pl = policy_logits(logits, temperature if temperature > 0 else 1.0, allowed)
        tok = G.sample(pl, k, 1.0 if temperature > 0 else 0.0)  # pl is already scaled
        lp = jnp.take_along_axis(jax.nn.log_softmax(pl, -1), tok[:, None], -1)[:, 0]
        return tok, lp

    keys = jax.random.split(key, max_new)
    logits, cache = G.prefill(model, variables, prompts,
                              G.init_cache(model, b, tp + max_new, fp8=kv_fp8))
    first = draw(logits[:, -1], keys[0])

    def step(carry, x):
        cache, tok = carry
        i, k = x
        logits, cache = G.decode_step(model, variables, cache, tok[:, None], tp + i)
        nxt = draw(logits[:, -1], k)
        return (cache, nxt[0]), nxt

    _, (toks, lps) = jax.lax.scan(step, (cache, first[0]),
                                  (jnp.arange(max_new - 1), keys[1:]))
    tokens = jnp.concatenate([first[0][:, None], toks.T], axis=1)
    logp = jnp.concatenate([first[1][:, None], lps.T], axis=1)
    return Rollout(prompts, tokens, logp, completion_mask(tokens, end_token))


def sequence_logprobs(model, variables, prompts, tokens, temperature: float = 1.0,
                      allowed=None, rngs=None):
    """The log-probabilities ``[B, L]`` of ``tokens`` after ``prompts`` under the same
    policy logits as :func:`sample_groups`, from one uncached forward pass (the trainer's)."""
    tp = prompts.shape[1]
    seq = jnp.concatenate([prompts, tokens], axis=1)
    logits = model.apply(variables, seq[:, :-1], rngs=rngs)[:, tp - 1:]
    lp = jax.nn.log_softmax(policy_logits(logits, temperature if temperature > 0 else 1.0,
                                          allowed), -1)
    return jnp.take_along_axis(lp, tokens[..., None], -1)[..., 0]


def fp8_rollout_params(params):
    """The weights the FP8 rollout engine gets: every block linear kernel quantized to block
    FP8 in 128x128 tiles and dequantized (FP32 values on the E4M3 grid times FP32 scales)."""
    def q(path, x):
        name = "/".join(getattr(k, "key", str(k)) for k in path)
        if name.endswith("kernel") and re.search(M.BLOCK_LINEAR_PATH, name):
            return B.dequantize(B.quantize(x, (128, 128)), x.dtype)
        return x

    return jax.tree_util.tree_map_with_path(q, params)


def _quantize_block_inputs(next_fun, args, kwargs, context):
    module = context.module
    if (context.method_name == "__call__" and isinstance(module, layers.Dense)
            and re.search(M.BLOCK_LINEAR_PATH, "/".join(module.path))):
        x = args[0]
        args = (B.dequantize(B.quantize(x, (1, 128)), x.dtype), *args[1:])
    return next_fun(*args, **kwargs)


@contextlib.contextmanager
def fp8_activations():
    """While tracing inside it, the input of every block linear layer of
    ``repro.models.lm.Decoder`` is quantized to block FP8 in 1x128 blocks along its last
    (contraction) axis and dequantized (a flax method interceptor)."""
    with nn.intercept_methods(_quantize_block_inputs):
        yield


# ------------------------------------------------------------------------------ config


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
            raise ConfigError(f"unknown GRPO config key(s) {bad}; valid keys: {fields}")
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


_COUNTS = ("d_model", "n_layers", "n_heads", "d_ff", "steps", "prompts_per_step",
           "group_size", "updates_per_step", "sft_batch")
_POSITIVE = ("lr", "grad_clip", "adv_eps", "clip_eps", "is_cap", "sft_lr")
_NONNEGATIVE = ("temperature", "kl_coef", "eval_problems", "eval_every", "sft_steps")
_UNIT = ("b1", "b2")  # in [0, 1)


def validate(config: Mapping[str, Any] | GRPOConfig) -> GRPOConfig:
    """The config as a :class:`GRPOConfig`, or a one-line ConfigError naming the field."""
    c = GRPOConfig.from_dict(config)
    hints = typing.get_type_hints(GRPOConfig)
    for f in dataclasses.fields(c):
        v, kinds = getattr(c, f.name), typing.get_args(hints[f.name]) or (hints[f.name],)
        ok = any(v is None if k is type(None) else
                 type(v) is k or (k is float and type(v) is int) for k in kinds)
        if ok and isinstance(v, float) and not math.isfinite(v):
            ok = False
        if not ok:
            want = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(f"GRPO config {f.name}={v!r}: expected {want}")
        rule = ("an int >= 1" if f.name in _COUNTS and v < 1 else
                "> 0" if f.name in _POSITIVE and v is not None and v <= 0 else
                ">= 0" if f.name in _NONNEGATIVE and v < 0 else
                "in [0, 1)" if f.name in _UNIT and not 0 <= v < 1 else None)
        if rule:
            raise ConfigError(f"GRPO config {f.name}={v!r}: must be {rule}")
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


# ------------------------------------------------------------------------------- train


def make_optimizer(c: GRPOConfig) -> optax.GradientTransformation:
    """Global-norm gradient clipping, then Adam at a constant learning rate (FP32 moments)."""
    return optax.chain(optax.clip_by_global_norm(c.grad_clip),
                       optax.adam(c.lr, b1=c.b1, b2=c.b2))


def make_train(config: Mapping[str, Any] | GRPOConfig):
    """Validate ``config`` (one-line ConfigError) and return the pure
    ``train(rng, start=None)``.

    ``start``: the base model, ``train.base(rng)`` (the supervised warm-up), computed apart so
    that every arm of a seed starts from the same bits; None: ``train`` runs the warm-up
    itself.

    ``train(rng)`` returns ``{"metrics": {name: [steps]}, "heldout_reward": [2],
    "variables": ...}`` (no ``heldout_reward`` when ``eval_problems`` is 0), with
    ``eval_every`` also ``heldout_curve`` (``[steps // eval_every + 1]``: before training,
    then after every ``eval_every`` steps) and with ``sft_steps`` ``sft_loss``
    (``[sft_steps]``, the warm-up's cross-entropy per answer token; the "before" accuracy is
    then the warmed-up base model's). Metrics per
    step: ``reward`` (mean over the step's rollouts),
    ``length`` (mean completion tokens, end marker included), ``loss`` and the diagnostics of
    :func:`grpo_loss` (``mismatch_kl``, ``is_capped_frac``, ``clip_frac``, ``kl_ref``) of the
    step's last update. ``heldout_reward``: the rollout engine's greedy accuracy on
    ``eval_problems`` held-out problems before and after training.
    """
    c = validate(config)
    cfg = c.model_config
    trainer = M.Decoder(cfg, c.recipe)
    engine = M.Decoder(cfg, c.rollout_recipe)
    tx = make_optimizer(c)
    allowed = None
    if c.constrained:
        allowed = jnp.zeros((cfg.vocab_size,), bool).at[D.encode(ALPHABET)].set(True)
    tokens0 = jnp.zeros((1, cfg.seq_len), jnp.int32)
    if c.sft_steps:
        tutor = M.Decoder(cfg, c.sft_recipe)
        shapes = [jax.tree.map(lambda x: (x.shape, x.dtype),
                               jax.eval_shape(m.init, jax.random.key(0), tokens0)["params"])
                  for m in (tutor, trainer)]
        if shapes[0] != shapes[1]:
            raise ConfigError(f"GRPO config sft_recipe={c.sft_recipe!r}: its parameters differ "
                              f"from recipe={c.recipe!r}'s; the warm-up cannot hand them over")
        sft_tx = optax.adam(c.sft_lr, b1=c.b1, b2=c.b2)

    def warm_up(params, key):
        """``sft_steps`` of teacher-forced cross-entropy on training problems' answers."""
        def sft_step(carry, k):
            params, o = carry
            a, b = sample_problems(k, c.sft_batch, c.n_digits, c.heldout_every)
            prompts, toks = prompt_tokens(a, b, c.n_digits), answer_tokens(a, b, c.max_new)
            mask = completion_mask(toks)

            def loss_fn(p):
                lp = sequence_logprobs(tutor, {"params": p}, prompts, toks, 1.0, allowed,
                                       rngs={"quant": k})
                return -jnp.sum(jnp.where(mask, lp, 0.0)) / jnp.sum(mask)

            loss, g = jax.value_and_grad(loss_fn)(params)
            u, o = sft_tx.update(g, o, params)
            return (optax.apply_updates(params, u), o), loss

        (params, _), losses = jax.lax.scan(sft_step, (params, sft_tx.init(params)),
                                           jax.random.split(key, c.sft_steps))
        return params, losses

    def rollout(params, prompts, group_size, key, temperature):
        kv = {"kv_fp8": True} if c.rollout_kv_fp8 else {}
        if not c.rollout_fp8:
            return sample_groups(engine, {"params": params}, prompts, group_size, c.max_new,
                                 key, temperature, allowed, **kv)
        with fp8_activations():
            return sample_groups(engine, {"params": fp8_rollout_params(params)}, prompts,
                                 group_size, c.max_new, key, temperature, allowed, **kv)

    def logprobs(variables, roll: Rollout, qkey):
        return sequence_logprobs(trainer, variables, roll.prompts, roll.tokens, c.temperature,
                                 allowed, rngs={"quant": qkey})

    def heldout_reward(params, a, b, key):
        roll = rollout(params, prompt_tokens(a, b, c.n_digits), 1, key, 0.0)
        return jnp.mean(reward_tokens(roll.tokens, a, b))

    def collect(params, key):
        """A GRPO step's rollout phase: the step's problems and their groups of completions."""
        k_prob, k_roll, k_quant = jax.random.split(key, 3)
        a, b = sample_problems(k_prob, c.prompts_per_step, c.n_digits, c.heldout_every)
        roll = rollout(params, prompt_tokens(a, b, c.n_digits), c.group_size, k_roll,
                       c.temperature)
        return roll, a, b, k_quant

    def learn(variables, opt_state, reference, roll, a, b, k_quant):
        """A GRPO step's training phase: rewards, advantages, ``updates_per_step`` updates."""
        rewards = reward_tokens(roll.tokens, jnp.repeat(a, c.group_size),
                                jnp.repeat(b, c.group_size))
        adv = group_advantages(rewards.reshape(-1, c.group_size), c.adv_eps).reshape(-1)
        old = jax.lax.stop_gradient(logprobs(variables, roll, k_quant))
        ref = (jax.lax.stop_gradient(logprobs(reference, roll, k_quant))
               if c.kl_coef else None)

        def loss_fn(v):
            return grpo_loss(logprobs(v, roll, k_quant), old, roll.logp, adv, roll.mask,
                             c.clip_eps, c.is_cap, c.kl_coef, ref)

        def update(carry, _):
            v, o = carry
            (loss, diag), grads = jax.value_and_grad(loss_fn, has_aux=True)(v)
            v, o = layers.apply_gradients(v, grads, tx, o)
            return (v, o), {"loss": loss, **diag}

        (variables, opt_state), out = jax.lax.scan(update, (variables, opt_state), None,
                                                   c.updates_per_step)
        metrics = {k: v[-1] for k, v in out.items()}
        metrics["reward"] = jnp.mean(rewards)
        metrics["length"] = jnp.mean(jnp.sum(roll.mask, axis=1).astype(jnp.float32))
        return (variables, opt_state), metrics

    def init(key):
        """Fresh trainer variables and optimizer state (no warm-up): what the phases take."""
        variables = trainer.init(key, tokens0)
        return variables, tx.init(variables["params"])

    def base(rng):
        """The base model of ``train(rng)``: fresh parameters after the supervised warm-up
        (``{"params", "sft_loss"}``; ``sft_steps`` 0: no warm-up, no loss). It reads the key,
        the model's widths, the task and the ``sft_*`` fields only, so every arm of a seed
        can share one: compile it apart from ``train`` and hand its result over. Inside one
        program with an arm's GRPO, a compiler may fuse and round the warm-up differently
        per arm (seen on a TPU v5e: base models of one seed about 30 points of accuracy apart)."""
        k_init = jax.random.split(rng, 3)[0]
        if not c.sft_steps:
            return {"params": trainer.init(k_init, tokens0)["params"]}
        params, losses = warm_up(tutor.init(k_init, tokens0)["params"],
                                 jax.random.fold_in(k_init, 1))
        return {"params": params, "sft_loss": losses}

    def train(rng, start=None):
        k_init, k_eval, k_steps = jax.random.split(rng, 3)
        variables = trainer.init(k_init, tokens0)
        start = base(rng) if start is None else start
        variables = {**variables, "params": start["params"]}
        extra = {k: v for k, v in start.items() if k == "sft_loss"}
        opt_state = tx.init(variables["params"])
        reference = variables
        if c.eval_problems:
            ea, eb = sample_problems(k_eval, c.eval_problems, c.n_digits, c.heldout_every,
                                     "heldout")
            before = heldout_reward(variables["params"], ea, eb, k_eval)

        def step(carry, key):
            variables, opt_state = carry
            return learn(variables, opt_state, reference, *collect(variables["params"], key))

        keys = jax.random.split(k_steps, c.steps)
        if c.eval_every and c.eval_problems:
            def chunk(carry, ks):
                carry, m = jax.lax.scan(step, carry, ks)
                return carry, (m, heldout_reward(carry[0]["params"], ea, eb, k_eval))

            (variables, _), (metrics, curve) = jax.lax.scan(
                chunk, (variables, opt_state), keys.reshape(-1, c.eval_every))
            metrics = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), metrics)
            extra["heldout_curve"] = jnp.concatenate([before[None], curve])
        else:
            (variables, _), metrics = jax.lax.scan(step, (variables, opt_state), keys)
        out = {"metrics": metrics, "variables": variables, **extra}
        if c.eval_problems:
            after = (extra["heldout_curve"][-1] if "heldout_curve" in extra else
                     heldout_reward(variables["params"], ea, eb, k_eval))
            out["heldout_reward"] = jnp.stack([before, after])
        return out

    train.config = c
    train.base = base
    train.phases = Phases(init, collect, learn)
    return train


class Phases(NamedTuple):
    """One GRPO step in its two phases, for timing them apart (``make_train(c).phases``):
    ``init(key) -> (variables, opt_state)``; ``collect(params, key) -> (roll, a, b, k_quant)``
    (the rollout engine); ``learn(variables, opt_state, reference, roll, a, b, k_quant) ->
    ((variables, opt_state), metrics)`` (the trainer). A step is ``learn(..., *collect(...))``."""

    init: Callable
    collect: Callable
    learn: Callable
