"""GRPO of the decoder LM on a verifiable task, with FP8 rollouts and truncated importance
sampling; PureJaxRL-shaped: ``make_train(config) -> train(rng)``.

    train = jax.jit(grpo.make_train({"n_digits": 1, "steps": 40, "rollout_fp8": True}))
    out = train(jax.random.key(0))
    out["metrics"]["reward"]          # [steps] mean reward of each step's rollouts
    out["heldout_reward"]             # [2] greedy accuracy on held-out problems, before/after

The task (:mod:`repro.models.grpo_task`: multi-digit addition, its verifier), the
configuration (:mod:`repro.models.grpo_config`: one-line errors before anything is traced)
and the rollouts (:mod:`repro.models.grpo_rollout`, FP8 rollouts among them) have their
modules; this one is the loss and the training loop, and hands on their names.

One step (GRPO, arXiv 2402.03300, as NeMo RL runs it): ``prompts_per_step`` problems, a
group of ``group_size`` completions of each sampled by the rollout engine (the KV-cache decoder
of ``repro.models.lm_decode``), rewards, group-normalized advantages, then
``updates_per_step`` gradient steps of :func:`grpo_loss` on the trainer's log-probabilities."""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from repro.config import ConfigError
from repro.models import lm as M
from repro.models import lm_data as D
from repro.models.grpo_config import GRPOConfig, validate
from repro.models.grpo_rollout import (Rollout, completion_mask, fp8_activations,
                                       fp8_rollout_params, policy_logits, sample_groups,
                                       sequence_logprobs)
from repro.models.grpo_task import (ALPHABET, END, END_TOKEN, MAX_DIGITS, SPACE_TOKEN,
                                    ZERO_TOKEN, answer_tokens, check_task, is_heldout,
                                    prompt_text, prompt_tokens, reward, reward_tokens,
                                    sample_problems)
from repro.precision import layers

__all__ = [
    "GRPOConfig", "validate", "Rollout", "completion_mask", "fp8_activations",
    "fp8_rollout_params", "policy_logits", "sample_groups", "sequence_logprobs", "ALPHABET",
    "END", "END_TOKEN", "MAX_DIGITS", "SPACE_TOKEN", "ZERO_TOKEN", "answer_tokens",
    "check_task", "is_heldout", "prompt_text", "prompt_tokens", "reward", "reward_tokens",
    "sample_problems", "group_advantages", "grpo_loss", "make_optimizer", "make_train",
    "Phases",
]


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
