"""The task GRPO learns (:mod:`repro.models.grpo`): multi-digit addition in the LM's byte tokens,
its problems, prompts, answers and verifier.

The task is multi-digit addition rendered in the LM's byte tokens: the prompt ``"07+45="``
(operands zero-padded to ``n_digits``), the answer ``"52"`` and the end marker ``"\\n"``.
Problems are drawn on the fly from a PRNG key; a hash of the unordered operand pair puts one
problem in ``heldout_every`` in the held-out split (``a+b`` and ``b+a`` always together), which
training never draws. :func:`reward` is the exact-match verifier on text,
:func:`reward_tokens` the same rule on token arrays, inside the jitted run.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from repro.config import ConfigError


END = "\n"


END_TOKEN = ord(END)


SPACE_TOKEN = ord(" ")


ZERO_TOKEN = ord("0")


ALPHABET = "0123456789" + END  # what a completion needs; ``constrained`` sampling keeps to it


MAX_DIGITS = 8  # sums stay inside int32


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
