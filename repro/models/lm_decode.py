"""Serving the decoder LM: a KV cache, a jitted prefill, a jitted decode loop, sampling.

    from repro.models import lm as M, lm_decode as G
    model = M.Decoder(M.get_config("tiny"))
    variables = model.init(jax.random.key(0), prompt)
    out = G.generate(model, variables, prompt, n_new=32)                       # greedy
    out = G.generate(model, variables, prompt, 32, temperature=0.8, key=key)   # sampled

The model is ``repro.models.lm.Decoder`` itself, applied with ``decode="prefill"`` (the prompt,
writing its keys and values into the "cache" collection) and ``decode="step"`` (new tokens
attending to the cache): the same parameters and layers as the uncached forward pass, so a
post-training-quantized model (``repro.precision.export``) serves through the same code. The
cache is ``[B, max_len, H, D]`` per block (BF16 for every recipe but FP32), one position for the
whole batch (prompts of one length, as in the benchmarks). Prefill logits equal the uncached
forward pass's; a decode step's logits equal the uncached logits at that position up to the
rounding of a different attention kernel (tested on CPU).

The decode loop is a ``lax.scan`` inside one jitted function: ``decode_loop(...)`` returns a
function ``(variables, cache, token, start, key) -> (tokens[B, n], cache)`` that runs ``n``
steps, what ``repro.experiments.inference.measure`` times for decode tokens/s.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from repro.models import lm as M


def cache_dtype(model: nn.Module) -> jnp.dtype:
    """The dtype attention runs in under the model's recipe (BF16 but for FP32 recipes)."""
    return M.layer_recipe(model.recipe, "attn_core", 0, model.cfg).dtype


def init_cache(model: nn.Module, batch: int, max_len: int, fp8: bool = False
               ) -> dict[str, Any]:
    """An empty KV cache for ``batch`` sequences of up to ``max_len`` tokens: the "cache"
    collection ``{"block0": {"attn": {"k": [B, max_len, H, D], "v": ...}}, ...}``. ``fp8``:
    keys and values stored in FP8 E4M3 with a per-tensor scale each per block (``k_scale``,
    ``v_scale``, set by the prefill: ``repro.models.lm``'s FP8 cache), emulated: attention
    still computes in the model's dtype."""
    cfg = model.cfg
    if batch < 1 or max_len < 1:
        raise ValueError(f"init_cache: batch and max_len must be >= 1, got {batch}, {max_len}")
    shape = (batch, max_len, cfg.n_heads, cfg.head_dim)
    if fp8:
        one = jnp.ones((), jnp.float32)
        return {f"block{i}": {"attn": {"k": jnp.zeros(shape, M.KV_FP8),
                                       "v": jnp.zeros(shape, M.KV_FP8),
                                       "k_scale": one, "v_scale": one}}
                for i in range(cfg.n_layers)}
    dt = cache_dtype(model)
    return {f"block{i}": {"attn": {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}}
            for i in range(cfg.n_layers)}


def _variables(variables, cache=None):
    out = {k: v for k, v in variables.items() if k != "cache"}
    if cache is not None:
        out["cache"] = cache
    return out


def prefill(model: nn.Module, variables, prompt, cache):
    """``(logits[B, T, V], cache)`` of the prompt ``[B, T]``, its keys and values written to
    ``cache`` at positions ``0 .. T-1`` (not jitted: callers jit)."""
    if prompt.shape[1] > jax.tree.leaves(cache)[0].shape[1]:
        raise ValueError(f"prefill: prompt of {prompt.shape[1]} tokens does not fit a cache of "
                         f"{jax.tree.leaves(cache)[0].shape[1]}")
    logits, upd = model.apply(_variables(variables, cache), prompt, decode="prefill",
                              mutable=["cache"])
    return logits, upd["cache"]


def decode_step(model: nn.Module, variables, cache, tokens, start):
    """``(logits[B, T, V], cache)`` of ``tokens[B, T]`` at positions ``start ..`` (usually
    T = 1), attending to the cache; their keys and values are written into it."""
    logits, upd = model.apply(_variables(variables, cache), tokens, decode="step",
                              start=start, mutable=["cache"])
    return logits, upd["cache"]


def sample(logits, key, temperature: float = 0.0):
    """Next tokens ``[B]`` from ``logits[B, V]``: the argmax when ``temperature`` is 0
    (greedy), else a draw from ``softmax(logits / temperature)``."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits.astype(jnp.float32) / temperature,
                                  axis=-1).astype(jnp.int32)


def _scan_steps(model, variables, cache, token, start, key, n: int, temperature: float):
    """``n`` decode steps from ``token[B]`` at position ``start``: the ``n`` tokens sampled
    (the first one from ``token``'s logits) and the cache after them."""
    def body(carry, i):
        cache, tok, key = carry
        key, sub = jax.random.split(key)
        logits, cache = decode_step(model, variables, cache, tok[:, None], start + i)
        nxt = sample(logits[:, -1], sub, temperature)
        return (cache, nxt, key), nxt

    (cache, _, _), toks = jax.lax.scan(body, (cache, token, key), jnp.arange(n))
    return toks.T, cache


@functools.lru_cache(maxsize=64)
def decode_loop(model: nn.Module, n_steps: int, temperature: float = 0.0):
    """A jitted ``(variables, cache, token[B], start, key) -> (tokens[B, n_steps], cache)``:
    ``n_steps`` decode steps in one ``lax.scan`` (a flax module is hashable, so the compiled
    function is shared by every call with the same model, length and temperature)."""
    if n_steps < 1:
        raise ValueError(f"decode_loop: n_steps must be >= 1, got {n_steps}")
    return jax.jit(functools.partial(_scan_steps, model, n=n_steps, temperature=temperature))


@functools.lru_cache(maxsize=64)
def prefill_fn(model: nn.Module):
    """A jitted ``(variables, prompt, cache) -> (logits, cache)``."""
    return jax.jit(functools.partial(prefill, model))


def generate(model: nn.Module, variables, prompt, n_new: int, *, temperature: float = 0.0,
             key=None, max_len: int | None = None):
    """``n_new`` tokens ``[B, n_new]`` continuing ``prompt[B, T]``: one prefill, then a jitted
    decode loop. Greedy when ``temperature`` is 0, else sampled with ``key``. The cache holds
    ``max_len`` positions (default T + n_new)."""
    if n_new < 1:
        raise ValueError(f"generate: n_new must be >= 1, got {n_new}")
    if temperature > 0 and key is None:
        raise ValueError("generate: sampling (temperature > 0) needs a key")
    key = jax.random.key(0) if key is None else key
    b, t = prompt.shape
    max_len = t + n_new if max_len is None else max_len
    if max_len < t + n_new - 1:
        raise ValueError(f"generate: max_len={max_len} < prompt {t} + n_new {n_new} - 1")
    logits, cache = prefill_fn(model)(variables, prompt, init_cache(model, b, max_len))
    key, sub = jax.random.split(key)
    first = sample(logits[:, -1], sub, temperature)
    if n_new == 1:
        return first[:, None]
    rest, _ = decode_loop(model, n_new - 1, float(temperature))(variables, cache, first,
                                                                jnp.int32(t), key)
    return jnp.concatenate([first[:, None], rest], axis=1)
