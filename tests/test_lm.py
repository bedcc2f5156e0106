"""The decoder LM (repro.lm): model properties, recipe policy, corpus, pre-training errors,
training that learns, and checkpoint resume that reproduces an uninterrupted run."""

from __future__ import annotations

import dataclasses
import gzip

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repro import config
from repro.claims import verdicts
from repro.experiments.lm import measure as E
from repro.experiments.lm import tables as lm_analysis
from repro.models import lm as M
from repro.models import lm_data as D
from repro.models import lm_train as T
from repro.precision import resolve
from repro.studies import runner

TINY = M.get_config("tiny")


@pytest.fixture(scope="module")
def tiny_vars():
    model = M.Decoder(TINY, "bf16")
    tokens = jnp.zeros((2, TINY.seq_len), jnp.int32)
    return model, model.init(jax.random.key(0), tokens)


# ------------------------------------------------------------------------------ model


def test_shapes_and_param_count(tiny_vars):
    model, variables = tiny_vars
    tokens = jax.random.randint(jax.random.key(1), (3, TINY.seq_len), 0, 256)
    logits = model.apply(variables, tokens)
    assert logits.shape == (3, TINY.seq_len, 256) and logits.dtype == jnp.float32
    n = sum(p.size for p in jax.tree.leaves(variables["params"]))
    assert n == M.param_count(TINY)
    for name, lo, hi in (("20m", 18e6, 22e6), ("120m", 110e6, 130e6)):
        assert lo < M.param_count(M.get_config(name)) < hi


def test_causal_mask(tiny_vars):
    """Changing a future token leaves every earlier position's logits unchanged."""
    model, variables = tiny_vars
    tokens = jax.random.randint(jax.random.key(2), (1, TINY.seq_len), 0, 256)
    t = 40
    changed = tokens.at[0, t].set((tokens[0, t] + 7) % 256)
    a, b = model.apply(variables, tokens), model.apply(variables, changed)
    np.testing.assert_array_equal(np.asarray(a[0, :t]), np.asarray(b[0, :t]))
    assert not np.allclose(np.asarray(a[0, t:]), np.asarray(b[0, t:]))


def test_rope_relative_position():
    """<rope(q, m), rope(k, n)> depends only on m - n, and rope keeps the norm."""
    q = jax.random.normal(jax.random.key(3), (1, 1, 16))
    k = jax.random.normal(jax.random.key(4), (1, 1, 16))

    def score(m, n):
        qm = M.rope(q, jnp.array([m]))[0, 0]
        kn = M.rope(k, jnp.array([n]))[0, 0]
        return float(jnp.dot(qm, kn))

    for (m, n), (m2, n2) in [((5, 2), (13, 10)), ((0, 7), (20, 27)), ((3, 3), (50, 50))]:
        assert score(m, n) == pytest.approx(score(m2, n2), rel=1e-4, abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), rel=1e-3)
    np.testing.assert_allclose(jnp.linalg.norm(M.rope(q, jnp.array([9]))), jnp.linalg.norm(q),
                               rtol=1e-5)


def test_layer_recipe_policy():
    cfg = M.get_config("20m")  # 6 blocks
    last = cfg.n_layers - 1
    for kind in ("embed", "head", "attn_core", "norm"):
        assert M.layer_recipe("nvfp4", kind, 0, cfg).name == "bf16", kind
    for kind in M.BLOCK_LINEAR_KINDS:
        assert M.layer_recipe("nvfp4", kind, 0, cfg).gemm == "nvfp4"
        assert M.layer_recipe("nvfp4", kind, last, cfg).name == "bf16"  # last block BF16
    two = cfg.replace(n_bf16_last_blocks=2)
    assert M.layer_recipe("nvfp4", "mlp_in", last - 1, two).name == "bf16"
    every = "nvfp4-all-layers"  # scope "all"
    assert M.layer_recipe(every, "head", None, cfg).gemm == "nvfp4"
    assert M.layer_recipe(every, "mlp_out", last, cfg).gemm == "nvfp4"
    assert M.layer_recipe(every, "attn_core", 0, cfg).name == "bf16"
    assert M.layer_recipe(every, "embed", None, cfg).name == "bf16"
    mlp = "nvfp4-mlp-only"  # scope "mlp"
    assert M.layer_recipe(mlp, "attn_qkv", 0, cfg).name == "bf16"
    assert M.layer_recipe(mlp, "mlp_in", 0, cfg).gemm == "nvfp4"
    # Ablation fields travel through the policy; FP8 stays in every block, head BF16.
    assert M.layer_recipe("nvfp4-no-rht", "mlp_in", 0, cfg).rht is False
    assert M.layer_recipe("fp8-delayed", "attn_out", last, cfg).gemm == "fp8"
    assert M.layer_recipe("fp8-delayed", "head", None, cfg).name == "bf16"
    assert M.layer_recipe("bf16", "head", None, cfg).name == "bf16"
    with pytest.raises(ValueError, match="unknown layer kind"):
        M.layer_recipe("nvfp4", "conv", 0, cfg)


@pytest.mark.slow  # compiles an NVFP4 model's training step (20 s)
def test_nvfp4_model_uses_nvfp4_state():
    """Under nvfp4 exactly the policy's layers carry NVFP4 state (FP8_META step counters)."""
    from repro.precision.layers import FP8_META

    v = M.Decoder(TINY, "nvfp4").init(jax.random.key(0), jnp.zeros((1, TINY.seq_len), jnp.int32))
    meta = jax.tree_util.tree_flatten_with_path(v[FP8_META])[0]
    paths = {"/".join(str(getattr(k, "key", k)) for k in p[:-1]) for p, _ in meta}
    assert paths == {"block0/attn/qkv", "block0/attn/out", "block0/mlp/wi", "block0/mlp/wo"}


def test_jax_nvfp4_is_gpu_only():
    if jax.default_backend() == "gpu":
        pytest.skip("GPU present")
    with pytest.raises(RuntimeError, match="needs a GPU"):
        M.Decoder(TINY, "jax-nvfp4").init(jax.random.key(0),
                                          jnp.zeros((1, TINY.seq_len), jnp.int32))


# ------------------------------------------------------------------------------- data


def test_corpus_loads_offline_and_splits():
    tokens = D.load_corpus()
    assert tokens.dtype == np.uint8 and tokens.size > 6_000_000
    text = D.decode(tokens[:200_000])
    assert "In the beginning" in text and " the " in text
    s = D.load_splits()
    assert s.train.size + s.heldout.size == tokens.size
    assert 0.04 < s.heldout.size / tokens.size < 0.06
    assert D.decode(D.encode("naïve café")) == "naïve café"
    x, y = D.train_batch(s.train, 3, 4, 32, seed=1)
    x2, _ = D.train_batch(s.train, 3, 4, 32, seed=1)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])


def test_bad_inputs_raise_before_training(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(T, "_functions", lambda *a, **k: calls.append(a))  # must not compile
    tc = T.TrainConfig(steps=5, batch_size=2)
    with pytest.raises(D.DataError, match="missing"):
        T.train(TINY, tc, corpus=tmp_path / "nope.txt", progress=False)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(D.DataError, match="empty"):
        T.train(TINY, tc, corpus=tmp_path / "empty.txt", progress=False)
    (tmp_path / "empty.txt.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(D.DataError, match="empty"):
        T.train(TINY, tc, corpus=tmp_path / "empty.txt.gz", progress=False)
    (tmp_path / "small.txt").write_text("a short corpus. " * 200)  # 3200 bytes, 160 held out
    with pytest.raises(D.DataError, match="sequence length 256 is larger"):
        T.train(TINY.replace(seq_len=256), tc, corpus=tmp_path / "small.txt", progress=False)
    with pytest.raises(D.DataError, match="needs about .* GiB"):
        T.train(M.get_config("120m"), tc.replace(batch_size=64), progress=False,
                bytes_limit=8 * 2**30)
    monkeypatch.setenv("REPRO_MEMORY_LIMIT_BYTES", str(2**30))
    with pytest.raises(D.DataError, match="device has 1.00 GiB"):
        T.train(M.get_config("120m"), tc, progress=False)
    assert calls == []


# ------------------------------------------------------------------------------ train


def test_loss_decreases_on_tiny():
    res = T.train(TINY, T.TrainConfig(steps=30, batch_size=8, eval_every=10, eval_batches=2),
                  "bf16", progress=False)
    losses = [h["eval_loss"] for h in res.eval_history]
    assert [h["step"] for h in res.eval_history] == [10, 20, 30]
    assert losses[-1] < losses[0] - 0.5 and losses[0] < np.log(256)
    assert res.finished and res.final_eval_loss == losses[-1]
    # step 10's last update was update 9 of a 10-step linear warmup from 0: 9/10 of the peak lr
    tc = T.TrainConfig()
    assert tc.warmup_steps == 10
    assert res.eval_history[0]["lr"] == pytest.approx(0.9 * tc.lr, rel=1e-6)


@pytest.mark.slow
def test_checkpoint_resume_is_identical(tmp_path):
    """2N steps straight == N steps, killed, restarted from the checkpoint, N more."""
    tc = T.TrainConfig(steps=12, batch_size=4, eval_every=4, eval_batches=1, warmup_steps=3)
    recipe = "nvfp4"  # stochastic rounding + RHT keys must also resume exactly
    straight = T.train(TINY, tc, recipe, progress=False, keep_variables=True)
    ck = tmp_path / "ck"
    first = T.train(TINY, tc, recipe, ckpt_dir=ck, stop_after=6, progress=False)
    assert not first.finished and first.steps_done == 6
    resumed = T.train(TINY, tc, recipe, ckpt_dir=ck, progress=False, keep_variables=True)
    assert resumed.resumed_from == 6 and resumed.finished
    assert resumed.eval_history == straight.eval_history  # every loss bit-identical
    for a, b in zip(jax.tree.leaves(straight.variables), jax.tree.leaves(resumed.variables)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="different run configuration"):
        T.train(TINY, tc.replace(lr=1e-4), recipe, ckpt_dir=ck, progress=False)


def test_time_budget_stops_with_a_checkpoint(tmp_path):
    tc = T.TrainConfig(steps=4, batch_size=4, eval_every=2, eval_batches=1, warmup_steps=1)
    first = T.train(TINY, tc, "bf16", ckpt_dir=tmp_path, time_budget_s=0.0, progress=False)
    assert not first.finished and first.steps_done == 1 and first.final_eval_loss is None
    rest = T.train(TINY, tc, "bf16", ckpt_dir=tmp_path, progress=False)
    assert rest.finished and rest.resumed_from == 1 and len(rest.eval_history) == 2


# ---------------------------------------------------------------------- experiments


def test_stored_bytes_follow_the_formats():
    cfg = TINY
    t = 512
    nv = E.stored_bytes(cfg, resolve("nvfp4"), t)
    bf = E.stored_bytes(cfg, resolve("bf16"), t)
    # NVFP4 16x16 weights: 4 bits + 1 byte per 256 elements + 4 bytes per tensor.
    assert nv["weight_bytes_quantized_only"] == pytest.approx(
        sum((0.5 + 1 / 256) * di * do + 4 for di, do in
            [(64, 192), (64, 64), (64, 384), (192, 64)]))
    # NVFP4 1x16 activations: 4 bits + 1 byte per 16 elements (+4 per tensor).
    ratio = nv["activation_bytes_quantized_only"] / nv["activation_bytes_quantized_only_bf16"]
    assert ratio == pytest.approx((0.5 + 1 / 16) / 2, rel=1e-3)
    assert nv["weight_bytes_bf16"] == bf["weight_bytes"]
    assert bf["quantized_layers"] == 0 and nv["quantized_layers"] == 4
    fp8 = E.stored_bytes(cfg, resolve("fp8-delayed"), t)
    assert fp8["quantized_layers"] == 8  # every block linear layer, head BF16


def test_smoke_profile_plan():
    runs = E.plan("smoke")
    assert runs[0].size == "tiny" and len(runs[0].seeds) >= 2  # a paired gap needs two
    names = {v.name for v in runs[0].variants}
    assert {"bf16", "fp8-delayed", "nvfp4"} <= names
    full = E.plan("full")
    assert {r.size for r in full} == {"20m", "120m"}
    r20 = next(r for r in full if r.size == "20m")
    assert r20.train.steps * r20.train.batch_size * M.get_config("20m").seq_len >= \
        20 * M.param_count(M.get_config("20m"))
    assert all(len(r.seeds) >= 3 for r in full)


# ------------------------------------------------------------------ loss analysis (notebook 05)


def _lm_frame(tmp_path, runs):
    """Records like ``_train_records`` writes, for runs {(recipe, seed): [(eval, train)...]}."""
    from repro import evidence, hardware, results

    hw = hardware.lookup("cpu")
    for (recipe, seed), points in runs.items():
        recs = [results.make_record(
            E.EXPERIMENT, "eval_loss", ev, "nats/byte", recipe=recipe, profile="full",
            sizes={"model": "20m", "seed": seed, "step": 100 * (i + 1)},
            extra={"train_loss": tr}, hardware=hw) for i, (ev, tr) in enumerate(points)]
        recs.append(results.make_record(E.EXPERIMENT, "final_eval_loss", points[-1][0],
                                        "nats/byte", recipe=recipe, profile="full",
                                        sizes={"model": "20m", "seed": seed}, hardware=hw))
        results.write_records(recs, E.EXPERIMENT, f"20m_{recipe}_s{seed}", root=tmp_path)
    return evidence.load_records(E.EXPERIMENT, roots=[tmp_path])


def test_run_losses_best_final_and_overfit(tmp_path):
    df = _lm_frame(tmp_path, {("bf16", 0): [(2.0, 2.1), (1.5, 1.2), (3.0, 0.5)],
                              ("nvfp4", 0): [(2.2, 2.3), (1.9, 1.8), (1.8, 1.6)]})
    r = lm_analysis.run_losses(df).set_index("recipe")
    assert r.loc["bf16", "best_eval_loss"] == 1.5 and r.loc["bf16", "best_step"] == 200
    assert r.loc["bf16", "final_eval_loss"] == 3.0
    assert r.loc["bf16", "final_train_loss"] == 0.5
    assert r.loc["bf16", "overfit"] == pytest.approx(1.0)       # 3.0 / 1.5 - 1
    assert r.loc["nvfp4", "best_eval_loss"] == 1.8                # still falling: best = final
    assert r.loc["nvfp4", "overfit"] == pytest.approx(0.0)


def test_paired_gaps_by_metric_and_interval(tmp_path):
    # best held-out losses: bf16 1.0 each seed; nvfp4 1.01, 1.02, 1.03 -> gaps 0.01..0.03
    runs = {}
    for s, d in enumerate((0.01, 0.02, 0.03)):
        runs[("bf16", s)] = [(1.2, 1.2), (1.0, 0.9), (1.5, 0.4)]
        runs[("nvfp4", s)] = [(1.2, 1.2), (1.0 + d, 0.9), (1.4, 0.5)]
    df = _lm_frame(tmp_path, runs)
    g = lm_analysis.paired_gaps(df, "bf16").iloc[0]
    assert g["metric"] == "best_eval_loss" and g["n_seeds"] == 3
    # mean 0.02, sd 0.01, t(0.975, 2) = 4.302653: half width 0.0248414
    assert g["gap_nats"] == pytest.approx(0.02)
    assert g["gap_lo"] == pytest.approx(0.02 - 0.0248414, abs=1e-6)
    assert g["gap_hi"] == pytest.approx(0.02 + 0.0248414, abs=1e-6)
    assert g["overfit"] == pytest.approx(0.5)                     # bf16: 1.5 / 1.0 - 1
    f = lm_analysis.paired_gaps(df, "bf16", metric="final_eval_loss").iloc[0]
    assert f["gap_nats"] == pytest.approx(-0.1)
    t = lm_analysis.paired_gaps(df, "bf16", metric="final_train_loss").iloc[0]
    assert t["gap_nats"] == pytest.approx(0.1)
    v = verdicts.b4(lm_analysis.paired_gaps(df, "bf16"), lm_analysis.paired_gaps(df, "nvfp4"))
    # relative gap CI upper bound 4.48% > 1.5%, lower bound < 1.5%: straddles the margin
    assert v.verdict == "inconclusive" and "best held-out loss" in v.key_number
    with pytest.raises(ValueError, match="choose one of"):
        lm_analysis.paired_gaps(df, "bf16", metric="eval")


def test_best_gap_uses_the_evaluation_steps_both_runs_have(tmp_path):
    # bf16 was evaluated at steps 100, 200, 300; nvfp4 also earlier (its own extra point at
    # 50 is lower than anything bf16 saw): the pair is compared at 100-300 only.
    from repro import evidence, hardware, results

    hw = hardware.lookup("cpu")

    def write(recipe, points):
        recs = [results.make_record(E.EXPERIMENT, "eval_loss", v, "nats/byte", recipe=recipe,
                                    profile="full", sizes={"model": "20m", "seed": 0, "step": s},
                                    extra={"train_loss": v}, hardware=hw) for s, v in points]
        recs.append(results.make_record(E.EXPERIMENT, "final_eval_loss", points[-1][1],
                                        "nats/byte", recipe=recipe, profile="full",
                                        sizes={"model": "20m", "seed": 0}, hardware=hw))
        results.write_records(recs, E.EXPERIMENT, f"20m_{recipe}_s0", root=tmp_path)

    write("bf16", [(100, 1.2), (200, 1.0), (300, 1.1)])
    write("nvfp4", [(50, 0.5), (100, 1.3), (200, 1.05), (300, 1.2)])
    df = evidence.load_records(E.EXPERIMENT, roots=[tmp_path])
    g = lm_analysis.paired_gaps(df, "bf16").iloc[0]
    assert g["baseline_loss"] == pytest.approx(1.0) and g["loss"] == pytest.approx(1.05)
    assert lm_analysis.run_losses(df).set_index("recipe").loc["nvfp4", "best_eval_loss"] == 0.5


def test_early_eval_steps_and_schedule():
    assert E.early_eval_steps(200, 1192, 5) == (200, 286, 408, 584, 834)
    assert E.early_eval_steps(200, 100, 5) == () and E.early_eval_steps(1, 50, 0) == ()
    tc = T.TrainConfig(steps=100, eval_every=40, eval_extra=(5, 10, 40, 500))
    assert tc.eval_steps() == [5, 10, 40, 80, 100]


def test_stored_ratios_match_hand_counted_bytes_and_name_the_hardware():
    """NVFP4 stores 4 bits a value plus one E4M3 scale per block: 16x16 weight blocks give
    0.25 + 1/512 of BF16's bytes, 1x16 activation blocks 0.25 + 1/32 (ignoring the one FP32
    per-tensor scale). The verdict names the hardware of the records it used."""
    import pandas as pd

    run = next(r for r in E.plan("full") if r.size == "20m")
    v = next(x for x in run.variants if x.name == "nvfp4")
    recs = E._memory_records(run, v, "full")
    for r in recs:
        r["hardware"] = "h200"
    frame = pd.DataFrame(recs)
    frame["size_model"] = [r["sizes"]["model"] for r in recs]
    out = lm_analysis.stored_ratios(frame).iloc[0]
    assert out["weights"] == pytest.approx(0.25 + 1 / 512, abs=1e-4)
    assert out["activations"] == pytest.approx(0.25 + 1 / 32, abs=1e-4)
    assert out["hardware"] == "h200" and out["model"] == "20m"


@pytest.mark.slow
def test_force_rerecord_cut_short_resumes(tmp_path, monkeypatch):
    """--force re-records from step 0, and a forced re-record cut short resumes on the next
    --force (a 20m re-record on the GPU may span two calls); a checkpoint left by a run that
    was not forced is not resumed by --force."""
    params = config.section("lm", E.Params, "smoke", {"lm": {"full": {}, "smoke": {
        "variants": ["bf16"], "eval_points": 2, "eval_batches": 1,
        "runs": [{"size": "tiny", "steps": 4, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1,
                  "seeds": [0], "checkpoint_every": 1}]}}})
    params = dataclasses.replace(params, checkpoints=str(tmp_path / "ck"))
    real_train, calls, cut = T.train, [], []

    def train(*a, **kw):  # stops the next run at the step popped from `cut`, as a budget would
        res = real_train(*a, **kw, **({"stop_after": cut.pop()} if cut else {}))
        calls.append(res)
        return res

    monkeypatch.setattr(E.T, "train", train)
    root = tmp_path / "results"
    recorded = lambda: sorted(p.name for p in root.rglob("tiny_bf16_s0*.json"))  # noqa: E731

    def record(force=False):
        runner.run(E.STUDY, params, root, only=["tiny_bf16_s0"], force=force, progress=False)

    cut.append(2)
    record()  # a plain run, cut at step 2 ...
    assert not calls[-1].finished and recorded() == []
    record()  # ... resumes (as before)
    assert calls[-1].finished and calls[-1].resumed_from == 2 and len(recorded()) == 1

    cut.append(3)
    record(force=True)  # a re-record cut at step 3 ...
    assert not calls[-1].finished and not calls[-1].resumed_from
    record(force=True)  # ... resumes at step 3
    assert calls[-1].finished and calls[-1].resumed_from == 3
    assert len(calls) == 4 and not list((tmp_path / "ck").rglob("*.forced"))

    cut.append(1)  # a leftover checkpoint of a plain run (its cell removed, then cut) ...
    for p in root.rglob("tiny_bf16_s0*.json"):
        p.unlink()
    record()
    assert not calls[-1].finished and calls[-1].steps_done == 1
    record(force=True)  # ... is not what --force resumes
    assert calls[-1].finished and not calls[-1].resumed_from
    assert len(recorded()) == 1


def test_truncated_run_is_the_whole_runs_prefix():
    """stop_at ends a run early under the WHOLE run's schedule: its evaluations are the whole
    run's up to that step (bit for bit on the CPU), with one at the stop, and it counts as
    finished and truncated."""
    tc = T.TrainConfig(steps=8, batch_size=4, eval_every=4, eval_extra=(2,), eval_batches=1,
                       warmup_steps=2)
    whole = T.train(TINY, tc, "bf16", progress=False)
    cut = T.train(TINY, tc, "bf16", stop_at=5, progress=False)
    assert [h["step"] for h in whole.eval_history] == [2, 4, 8]
    assert cut.finished and cut.truncated_at == 5 and cut.steps_done == 5
    assert [h["step"] for h in cut.eval_history] == [2, 4, 5]
    assert cut.eval_history[:2] == whole.eval_history[:2]
    # step 5's last update (index 4) used the schedule of the 8-step run: 2 warmup steps,
    # then cosine from 3e-3 to 3e-4 over 6 steps, 2 in: 3e-4 + 2.7e-3 * (1 + cos(pi/3)) / 2;
    # a 5-step run's schedule (cosine over 3) would give 3e-4 + 2.7e-3 * (1 + cos(2pi/3)) / 2
    assert cut.eval_history[2]["lr"] == pytest.approx(3e-4 + 2.7e-3 * 0.75, rel=1e-5)
    assert whole.truncated_at is None and T.train(
        TINY, tc, "bf16", stop_at=8, progress=False).truncated_at is None
    with pytest.raises(ValueError, match="stop_at"):
        T.train(TINY, tc, "bf16", stop_at=9, progress=False)


def test_truncated_runs_are_compared_over_their_evaluations(tmp_path):
    """A truncated variant (params.yaml stop_at) is compared to whole baseline runs over the
    evaluation steps both have; it has no final losses, so final-loss gaps leave it out."""
    from repro import evidence, hardware, results

    hw = hardware.lookup("cpu")

    def write(recipe, seed, points, cut=None):
        extra = {} if cut is None else {"truncated_at": cut}
        recs = [results.make_record(E.EXPERIMENT, "eval_loss", v, "nats/byte", recipe=recipe,
                                    profile="full", sizes={"model": "20m", "seed": seed,
                                                           "step": st},
                                    extra={**extra, "train_loss": v}, hardware=hw)
                for st, v in points]
        recs.append(results.make_record(E.EXPERIMENT, "final_eval_loss", points[-1][1],
                                        "nats/byte", recipe=recipe, profile="full",
                                        sizes={"model": "20m", "seed": seed}, extra=extra,
                                        hardware=hw))
        results.write_records(recs, E.EXPERIMENT, f"20m_{recipe}_s{seed}", root=tmp_path)

    for seed, d in enumerate((0.01, 0.03)):
        # every run is best at step 100; bf16 then overfits (final 1.6), jax-nvfp4 stops at 200
        write("bf16", seed, [(100, 1.0), (200, 1.1), (300, 1.6)])
        write("jax-nvfp4", seed, [(100, 1.0 + d), (200, 1.2)], cut=200)
        write("nvfp4", seed, [(100, 1.0 + d), (200, 1.1), (300, 1.5)])
    df = evidence.load_records(E.EXPERIMENT, roots=[tmp_path])
    r = lm_analysis.run_losses(df).set_index(["recipe", "seed"])
    assert r.loc[("jax-nvfp4", 0), "truncated_at"] == 200
    assert np.isnan(r.loc[("jax-nvfp4", 0), "final_eval_loss"])
    assert np.isnan(r.loc[("jax-nvfp4", 0), "overfit"])
    assert r.loc[("jax-nvfp4", 1), "best_eval_loss"] == pytest.approx(1.03)
    assert np.isnan(r.loc[("nvfp4", 0), "truncated_at"])
    g = lm_analysis.paired_gaps(df, "bf16").set_index("recipe")
    assert g.loc["jax-nvfp4", "gap_nats"] == pytest.approx(0.02)  # (0.01 + 0.03) / 2
    assert g.loc["jax-nvfp4", "truncated_at"] == 200
    assert np.isnan(g.loc["nvfp4", "truncated_at"])
    assert g.loc["jax-nvfp4", "overfit"] == pytest.approx(0.6)    # bf16's 1.6 / 1.0 - 1
    f = lm_analysis.paired_gaps(df, "bf16", metric="final_eval_loss")
    assert list(f.recipe) == ["nvfp4"]


def test_stop_at_in_params_names_known_variants():
    params = {"variants": ["bf16"], "runs": [{"size": "tiny", "steps": 10, "batch_size": 4,
                                              "lr": 1e-3, "stop_at": {"bf16": 4}}]}

    def section():
        return config.section("lm", E.Params, "smoke", {"lm": {"smoke": params, "full": {}}})

    assert E.plan(section())[0].stop_at == {"bf16": 4}
    params["runs"][0]["stop_at"] = {"bf-16": 4}
    with pytest.raises(ValueError, match="unknown variant.*bf-16"):
        E.check(section())
