"""GRPO's rollouts (:mod:`repro.models.grpo`): groups of completions sampled by the KV-cache
decoder, their log-probabilities, and the rollout engine's precision.

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
"""

from __future__ import annotations

import contextlib
import re
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from repro.models import lm as M
from repro.models import lm_decode as G
from repro.models.grpo_task import END_TOKEN
from repro.precision import blockfp8 as B
from repro.precision import layers


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
