"""Probe: how far the supervised warm-up takes the GRPO study's base model, and what GRPO then
adds, for the study's full config or one changed on the command line; for choosing
``params.yaml``'s ``grpo`` settings (A12's rule needs a base model with room to improve: BF16
GRPO must raise held-out accuracy by its ``rl_works``).

One compiled warm-up step and one compiled GRPO step (``make_train(c).phases``), run in Python
loops with the held-out greedy accuracy every ``--every`` steps, so one compilation shows the
whole curve:

    python3 scripts/probe_grpo_base.py --sft-steps 4000 --grpo-steps 300
    python3 scripts/probe_grpo_base.py --set n_digits=2 --set sft_lr=0.002

Numbers from a probe are not records: A12's verdict reads only what ``repro record grpo``
writes.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax
import yaml

from repro import studies
from repro.models import grpo as R
from repro.models import lm as M
from repro.models import lm_data as D


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-steps", type=int, default=4000)
    ap.add_argument("--grpo-steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=250, help="warm-up steps between evaluations")
    ap.add_argument("--grpo-every", type=int, default=50)
    ap.add_argument("--start-at", type=float, default=0.35,
                    help="start GRPO once held-out accuracy reaches this")
    ap.add_argument("--arm", default="bf16-e2e")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    a = ap.parse_args()
    p = studies.params("grpo", "full")
    over = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.set)}
    c = R.validate({**dict(p.grpo), **dict(p.arms[a.arm] or {}), **over, "sft_steps": 0,
                    "eval_problems": 0, "eval_every": 0})
    cfg = c.model_config
    tutor, engine = M.Decoder(cfg, c.sft_recipe), M.Decoder(cfg, c.rollout_recipe)
    allowed = jnp.zeros((cfg.vocab_size,), bool).at[D.encode(R.ALPHABET)].set(True)
    ph = R.make_train(c).phases
    key = jax.random.key(0)
    variables, opt = ph.init(key)
    tx = optax.adam(c.sft_lr, b1=c.b1, b2=c.b2)
    sft_opt = tx.init(variables["params"])
    ea, eb = R.sample_problems(jax.random.key(1), 512, c.n_digits, c.heldout_every, "heldout")

    @jax.jit
    def sft_step(params, o, k):
        a_, b_ = R.sample_problems(k, c.sft_batch, c.n_digits, c.heldout_every)
        prompts, toks = R.prompt_tokens(a_, b_, c.n_digits), R.answer_tokens(a_, b_, c.max_new)
        mask = R.completion_mask(toks)

        def loss_fn(q):
            lp = R.sequence_logprobs(tutor, {"params": q}, prompts, toks, 1.0, allowed,
                                     rngs={"quant": k})
            return -jnp.sum(jnp.where(mask, lp, 0.0)) / jnp.sum(mask)

        loss, g = jax.value_and_grad(loss_fn)(params)
        u, o = tx.update(g, o, params)
        return optax.apply_updates(params, u), o, loss

    @jax.jit
    def heldout(params):
        roll = R.sample_groups(engine, {"params": params}, R.prompt_tokens(ea, eb, c.n_digits),
                               1, c.max_new, jax.random.key(2), 0.0, allowed)
        return jnp.mean(R.reward_tokens(roll.tokens, ea, eb))

    t0 = time.perf_counter()
    params = variables["params"]
    print(f"config: {c}")
    for i in range(1, a.sft_steps + 1):
        params, sft_opt, loss = sft_step(params, sft_opt, jax.random.fold_in(key, i))
        if i % a.every == 0:
            acc = float(heldout(params))
            print(f"warm-up {i}: loss {float(loss):.4f} held-out {acc:.3f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
            if acc >= a.start_at:
                break
    variables, opt = {**variables, "params": params}, ph.init(key)[1]
    reference = variables
    step = jax.jit(lambda v, o, k: ph.learn(v, o, reference, *ph.collect(v["params"], k)))
    base = float(heldout(params))
    for i in range(1, a.grpo_steps + 1):
        (variables, opt), m = step(variables, opt, jax.random.fold_in(key, 10 ** 6 + i))
        if i % a.grpo_every == 0:
            acc = float(heldout(variables["params"]))
            print(f"GRPO {i}: reward {float(m['reward']):.3f} held-out {acc:.3f} "
                  f"(base {base:.3f}, gain {acc - base:+.3f}; "
                  f"{time.perf_counter() - t0:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
