"""Sharded-vs-single-device checks, run by tests/test_distributed.py in ONE subprocess.

The device count must be fixed before JAX initialises, so this runs as a script with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (8 simulated CPU devices) and prints one
line ``RESULTS <json>``; the test functions assert on it. Not collected by pytest (the name
does not start with ``test_``). ``--xla_backend_optimization_level=0`` (set by the test) makes
the CPU compiles ~2-3x faster; single-device and sharded runs share it.

    XLA_FLAGS="--xla_force_host_platform_device_count=8" python tests/_distributed_checks.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from repro.experiments.rl_throughput import measure as RX
from repro.models import lm as M
from repro.models import lm_train as T
from repro.models import ppo
from repro.models import sharding as distributed
from repro.precision import layers, resolve, scaling

OUT: dict = {"timings": {}}


def timed(name):
    def deco(fn):
        t0 = time.perf_counter()
        try:
            OUT[name] = fn()
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails with it
            OUT[name] = {"error": f"{type(e).__name__}: {e}"}
        OUT["timings"][name] = round(time.perf_counter() - t0, 2)
        return fn
    return deco


def tolist(x):
    return np.asarray(x, np.float64).tolist()


def max_rel(a, b) -> float:
    """Largest over the leaves of two trees of max|a-b| / max|a| (leaf-normwise)."""
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.size:
            worst = max(worst, float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-30)))
    return worst


def spec_of(x) -> str:
    return str(getattr(x.sharding, "spec", "single-device"))


# ------------------------------------------------------------------------------- checks

OUT["device_count"] = jax.device_count()
PPO_CFG = dict(env="CartPole-v1", num_envs=16, num_steps=8, total_timesteps=16 * 8 * 3,
               update_epochs=2, num_minibatches=2, width=32)


def ppo_equivalence(recipe):
    cfg = {**PPO_CFG, "recipe": recipe}
    mesh = distributed.make_mesh(8)
    key = jax.random.key(0)
    single = jax.device_get(jax.jit(ppo.make_train(cfg))(key))
    compiled = jax.jit(ppo.make_train(cfg, mesh)).lower(key).compile()
    multi = jax.device_get(compiled(key))
    text = compiled.as_text()
    return {"single": {k: tolist(v) for k, v in single.items()},
            "sharded": {k: tolist(v) for k, v in multi.items()},
            "all_reduce": text.count("all-reduce"),
            # CartPole observations [N/8 = 2 envs, 4] per device in the partitioned program
            "per_device_obs_shape": "f32[2,4]" in text}


@timed("ppo_fp32")
def _():
    return ppo_equivalence("fp32")


@timed("ppo_fp8")
def _():
    return ppo_equivalence("fp8-delayed")


@timed("ppo_update_fp8")
def _():
    """Two PPO updates on a synthetic rollout: params, FP8_META (amax histories) and Adam state
    after them, sharded vs single device; and the all-reduce in the HLO. FP8 GEMMs with FP32
    activations: with the recipe's BF16 activations the bias gradients (BF16 sums) differ in
    the last bits between reduction orders, and Adam's first steps (update ~ lr * sign(g))
    turn that into differences of order lr on near-zero biases."""
    c = ppo.validate({**PPO_CFG, "recipe": "fp8-delayed:compute_dtype=float32"})
    env, env_params = ppo.make_env(c.env)
    net = ppo.build_network(c, env, env_params)
    tx = ppo.make_optimizer(c)
    variables, opt_state = ppo.init_state(c, net, env, env_params, tx, jax.random.key(1))
    traj, adv, tgt = RX.synthetic_rollout(c, env, env_params, jax.random.key(2))
    key = jax.random.key(3)
    # a first update fills the amax histories, so the second quantizes with real scales
    upd1 = jax.jit(ppo.make_update_step(c, net, tx))
    v1, o1 = upd1(variables, opt_state, traj, adv, tgt, key)
    v1, o1 = upd1(v1, o1, traj, adv, tgt, jax.random.key(4))
    mesh = distributed.make_mesh(8)
    args = ppo.place_update_args(mesh, variables, opt_state, traj, adv, tgt, key)
    upd8 = jax.jit(ppo.make_update_step(c, net, tx, mesh=mesh))
    compiled = upd8.lower(*args).compile()
    v8, o8 = compiled(*args)
    v8, o8 = compiled(v8, o8, *args[2:5], jax.device_put(jax.random.key(4),
                                                          distributed.replicated(mesh)))
    text = compiled.as_text()
    meta1, meta8 = v1[layers.FP8_META], v8[layers.FP8_META]
    hist = [k for k in jax.tree_util.tree_flatten_with_path(meta1)[0]
            if "amax_history" in jax.tree_util.keystr(k[0])]
    return {"params_rel": max_rel(v1["params"], v8["params"]),
            "meta_rel": max_rel(meta1, meta8),
            "opt_rel": max_rel(o1, o8),
            "n_histories": len(hist),
            "histories_filled": bool(all(float(np.asarray(h)[0]) > 0 for _, h in hist)),
            "all_reduce": text.count("all-reduce"),
            "params_replicated": all(x.sharding.is_fully_replicated
                                     for x in jax.tree.leaves(v8["params"]))}


@timed("amax")
def _():
    """A jnp.max over a sharded array is the global max (an all-reduce), so delayed scaling
    sees the same amax and computes the same scale as on one device."""
    x = np.array(jax.random.normal(jax.random.key(5), (64, 48)), np.float32)
    x[37, 11] = 23.5  # the global max lives on one shard only
    out = {"expected": float(np.max(np.abs(x)))}
    state = scaling.init_delayed(16)
    fmax = float(jnp.finfo(jnp.float8_e4m3fn).max)

    def amax_and_update(x, state):
        a = scaling.amax(x)
        return a, scaling.delayed_update(state, a, fmax)

    a1, s1 = jax.jit(amax_and_update)(x, state)
    for name, mesh in (("8x1", distributed.make_mesh(8)),
                       ("2x4", distributed.make_mesh(8, fsdp=4))):
        spec = distributed.batch_spec(mesh, 2) if name == "8x1" else \
            jax.sharding.PartitionSpec("data", "fsdp")
        xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
        fn = jax.jit(amax_and_update)
        compiled = fn.lower(xs, state).compile()
        a8, s8 = compiled(xs, state)
        out[name] = {"amax": float(a8), "scale": float(s8.scale),
                     "scale_single": float(s1.scale), "amax_single": float(a1),
                     "local_shard_max": float(np.max(np.abs(np.asarray(
                         xs.addressable_shards[0].data)))),
                     "all_reduce": compiled.as_text().count("all-reduce")}
    return out


LM_CFG = M.get_config("tiny", d_model=32, n_heads=2, d_ff=64, n_layers=1, n_bf16_last_blocks=0,
                      seq_len=32)
LM_TC = T.TrainConfig(steps=3, batch_size=8, eval_every=1, eval_batches=1, warmup_steps=1)
MESHES = {"single": (None, False), "dp8x1": (distributed.make_mesh(8), False),
          "fsdp2x4": (distributed.make_mesh(8, fsdp=4), True)}


def lm_run(recipe, mesh_name, **kw):
    mesh, fsdp = MESHES[mesh_name]
    return T.train(LM_CFG, kw.pop("tc", LM_TC), recipe, mesh=mesh, fsdp=fsdp, progress=False,
                   **kw)


def lm_losses(res):
    return [[h["train_loss"], h["eval_loss"]] for h in res.eval_history]


def lm_check(recipe):
    out = {}
    for name in MESHES:
        res = lm_run(recipe, name, keep_variables=True)
        v = res.variables
        kernel = v["params"]["block0"]["mlp"]["wi"]["kernel"]  # [32, 128]
        out[name] = {"losses": lm_losses(res),
                     "wi_kernel_spec": spec_of(kernel),
                     "wi_kernel_shard_shape": list(kernel.addressable_shards[0].data.shape),
                     "norm_spec": spec_of(v["params"]["block0"]["attn_norm"]["scale"]),
                     "meta_specs": sorted({spec_of(x) for x in
                                           jax.tree.leaves(v.get(layers.FP8_META, {}))})}
    return out


def lm_collectives(recipe, mesh, fsdp, cfg, batch=4):
    """The collectives in the compiled LM training step of ``cfg`` on ``mesh`` (a global
    batch of ``batch`` sequences: 2 a device on 2 devices, where letting XLA keep the weights
    split made it move activations)."""
    from repro.experiments.multigpu import measure as multigpu

    init, step, _ = T._sharded_functions(cfg, resolve(recipe), T._static_key(LM_TC), False,
                                 mesh, fsdp)
    v, o = init(jnp.int32(0), jnp.zeros((1, cfg.seq_len), jnp.int32))
    x = T._batch_putter(mesh)(np.zeros((batch, cfg.seq_len), np.int32))
    text = step.lower(v, o, x, x, jnp.int32(0), jnp.int32(0)).compile().as_text()
    return multigpu.collectives(text)


@timed("lm_bf16")
def _():
    out = lm_check("bf16")
    # the "tiny" preset on 2 devices, as the multigpu study runs the 120m one
    tiny = M.get_config("tiny")
    out["collectives"] = {
        "dp2": lm_collectives("bf16", distributed.make_mesh(2), False, tiny),
        "fsdp1x2": lm_collectives("bf16", distributed.make_mesh(2, fsdp=True), True, tiny)}
    return out


@timed("lm_nvfp4")
def _():
    return lm_check("nvfp4")


@timed("lm_checkpoint")
def _():
    """FSDP run stopped after step 2 (checkpoint), resumed on the same 2x4 mesh and on the
    8x1 data-parallel mesh: both end where the uninterrupted FSDP run ends."""
    ref = lm_run("bf16", "fsdp2x4")
    out = {"reference": lm_losses(ref)}
    with tempfile.TemporaryDirectory() as tmp:
        for resume_on in ("fsdp2x4", "dp8x1"):
            d = Path(tmp) / resume_on
            first = lm_run("bf16", "fsdp2x4", ckpt_dir=d, stop_after=2)
            # what the checkpoint restores into: the FSDP state shardings
            mgr = T._manager(d)
            mesh, fsdp = MESHES["fsdp2x4"]
        
            init, _, _ = T._sharded_functions(LM_CFG, resolve("bf16"), T._static_key(LM_TC),
                                      False, mesh, fsdp)
            v0, o0 = init(jnp.int32(0), jnp.zeros((1, LM_CFG.seq_len), jnp.int32))
            step, v, o, _ = T._restore(mgr, v0, o0)
            k = v["params"]["block0"]["mlp"]["wi"]["kernel"]
            mu = jax.tree.leaves(o, is_leaf=lambda x: hasattr(x, "mu"))
            mu_k = [s.mu["block0"]["mlp"]["wi"]["kernel"] for s in mu if hasattr(s, "mu")]
            second = lm_run("bf16", resume_on, ckpt_dir=d)
            out[resume_on] = {"stopped_at": first.steps_done, "restored_step": int(step),
                              "restored_spec": spec_of(k),
                              "restored_mu_spec": spec_of(mu_k[0]) if mu_k else None,
                              "resumed_from": second.resumed_from,
                              "losses": lm_losses(second)}
    return out


print("RESULTS " + json.dumps(OUT))
sys.stdout.flush()
