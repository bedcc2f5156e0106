"""GRPO with FP8 rollouts (repro.models.grpo) and block-scaled FP8 (repro.precision.formats):
the task and its verifier, advantages and the loss against float64 references written here,
rollouts through the KV-cache decoder, the block FP8 quantizer bit for bit against ml_dtypes,
and a GRPO run whose reward rises."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from repro.config import ConfigError
from repro.models import grpo as R
from repro.models import lm as M
from repro.models import lm_data as D
from repro.precision import blockfp8 as B
from repro.precision import ops
from repro.precision.recipes import resolve

E4M3 = ml_dtypes.float8_e4m3fn
TINY = M.LMConfig("grpo-test", d_model=32, n_layers=1, n_heads=2, d_ff=64, seq_len=8,
                  n_bf16_last_blocks=0)


# ------------------------------------------------------------------------------- task


def test_problems_deterministic_in_range_and_split():
    draw = jax.jit(jax.vmap(lambda k: (R.sample_problems(k, 512, 2, 5, "train"),
                                       R.sample_problems(k, 512, 2, 5, "heldout"))))
    (ta, tb), (ha, hb) = jax.tree.map(np.asarray, draw(jax.random.split(jax.random.key(3), 4)))
    (ta2, tb2), _ = jax.tree.map(np.asarray, draw(jax.random.split(jax.random.key(3), 4)))
    np.testing.assert_array_equal(ta, ta2)
    np.testing.assert_array_equal(tb, tb2)
    assert not np.array_equal(ta[0], ta[1])
    for x in (ta, tb, ha, hb):
        assert x.dtype == np.int32 and 0 <= x.min() and x.max() <= 99
    train = {frozenset((int(a), int(b))) for a, b in zip(ta.ravel(), tb.ravel())}
    held = {frozenset((int(a), int(b))) for a, b in zip(ha.ravel(), hb.ravel())}
    assert len(train) > 500 and len(held) > 100
    assert not train & held  # no problem (nor its operands swapped) in both splits
    # one problem in heldout_every, over all 10^4 two-digit problems
    a, b = np.meshgrid(np.arange(100), np.arange(100))
    frac = float(np.mean(np.asarray(R.is_heldout(a.ravel(), b.ravel(), 5))))
    assert 0.15 < frac < 0.25


def test_prompt_tokens_are_the_prompt_bytes():
    toks = np.asarray(R.prompt_tokens(jnp.array([7, 0]), jnp.array([45, 99]), 2))
    assert bytes(toks[0].astype(np.uint8)) == b"07+45="
    assert bytes(toks[1].astype(np.uint8)) == b"00+99="
    assert R.prompt_text(7, 45, 2) == "07+45="


# (prompt, completion, reward): hand-written
VERIFIER_CASES = [
    ("3+4=", "7\n", 1.0),
    ("3+4=", "8\n", 0.0),
    ("3+4=", "7", 0.0),  # no end marker: cut off
    ("3+4=", "  7\n", 1.0),  # spaces around the number are stripped
    ("3+4=", "7 \n", 1.0),
    ("3+4=", "07\n", 0.0),  # not canonical
    ("3+4=", "+7\n", 0.0),
    ("3+4=", "7\n8\n", 1.0),  # only up to the first end marker
    ("3+4=", "\n7\n", 0.0),
    ("3+4=", " \n", 0.0),
    ("07+45=", "52\n", 1.0),
    ("07+45=", "5 2\n", 0.0),
    ("07+45=", "25\n", 0.0),
    ("9+9=", "18\n", 1.0),
    ("9+9=", "1\n", 0.0),
]


@pytest.mark.parametrize("prompt,completion,want", VERIFIER_CASES)
def test_reward_on_hand_written_completions(prompt, completion, want):
    assert R.reward(prompt, completion) == want


def test_reward_tokens_matches_the_text_verifier():
    rows, a, b, want = [], [], [], []
    for prompt, completion, w in VERIFIER_CASES:
        x, y = prompt[:-1].split("+")
        rows.append(completion.ljust(6, "x")[:6])
        a.append(int(x))
        b.append(int(y))
        want.append(w)
    rng = np.random.default_rng(0)
    alphabet = list("0123456789 \nx")
    for _ in range(400):  # random completions over a small alphabet, scored by reward()
        x, y = rng.integers(0, 100, 2)
        ans = str(x + y)
        text = "".join(rng.choice(alphabet, 6))
        if rng.random() < 0.5:  # plant the answer often enough to hit right ones
            text = (" " * rng.integers(0, 2) + ans + "\n" + text)[:6]
        rows.append(text)
        a.append(int(x))
        b.append(int(y))
        want.append(R.reward(R.prompt_text(int(x), int(y), 2), text))
    tokens = jnp.asarray(np.stack([D.encode(r) for r in rows]).astype(np.int32))
    got = np.asarray(R.reward_tokens(tokens, jnp.array(a), jnp.array(b)))
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    assert 0.1 < np.mean(want) < 0.9


def test_task_errors_are_one_line():
    with pytest.raises(ConfigError, match="empty split"):
        R.check_task(1, 10 ** 6)
    with pytest.raises(ConfigError, match=r"n_digits must be an int in \[1, 8\]"):
        R.check_task(9, 10)
    with pytest.raises(ConfigError, match=r"unknown GRPO config key\(s\) \['lrr'\]"):
        R.make_train({"lrr": 1.0})
    for bad in ({"rollout_recipe": "fp8-delayed"}, {"rollout_recipe": "nvfp4"},
                {"rollout_recipe": "fp8-current", "rollout_fp8": True}):
        with pytest.raises(ConfigError, match=f"rollout_recipe='{bad['rollout_recipe']}': "
                           "must be unquantized, or per-tensor FP8 with current scaling"):
            R.make_train(bad)
    assert R.validate({"rollout_recipe": "fp8-current"}).rollout_recipe == "fp8-current"
    with pytest.raises(ConfigError, match="group_size=1: must be >= 2"):
        R.make_train({"group_size": 1})
    with pytest.raises(ConfigError, match="is_cap=0.0: must be > 0"):
        R.make_train({"is_cap": 0.0})
    with pytest.raises(ConfigError, match="recipe: unknown"):
        R.make_train({"recipe": "fp9"})


# ------------------------------------------------------------------ advantages and loss


def test_group_advantages_hand_computed():
    r = jnp.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]], jnp.float32)
    got = np.asarray(R.group_advantages(r, eps=1e-6))
    s3 = math.sqrt(3 / 16)  # population std of (1, 0, 0, 0)
    want = np.array([[1, -1, -1, 1], [0, 0, 0, 0], [0, 0, 0, 0],
                     [0.75 / s3, -0.25 / s3, -0.25 / s3, -0.25 / s3]])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    same = np.asarray(R.group_advantages(jnp.full((2, 8), 0.7), 1e-6))
    np.testing.assert_array_equal(same, np.zeros((2, 8)))


def ref_loss(new, old, roll, adv, mask, eps, cap, kl_coef=0.0, ref=None):
    """Token by token in float64."""
    tot = mism = capped = clipped = kl_tot = 0.0
    n = 0
    for i in range(new.shape[0]):
        for t in range(new.shape[1]):
            if not mask[i, t]:
                continue
            n += 1
            a = adv[i]
            ratio = math.exp(new[i, t] - old[i, t])
            pg = -min(ratio * a, min(max(ratio, 1 - eps), 1 + eps) * a)
            raw = math.exp(old[i, t] - roll[i, t])
            w = 1.0 if cap is None else min(raw, cap)
            kl = 0.0
            if ref is not None:
                r = ref[i, t] - new[i, t]
                kl = math.exp(r) - r - 1
            tot += w * pg + kl_coef * kl
            d = old[i, t] - roll[i, t]
            mism += math.exp(d) - d - 1
            capped += cap is not None and raw > cap
            clipped += abs(ratio - 1) > eps
            kl_tot += kl
    n = max(n, 1)
    return tot / n, {"mismatch_kl": mism / n, "is_capped_frac": capped / n,
                     "clip_frac": clipped / n, "kl_ref": kl_tot / n}


def _logps(seed, shape=(6, 5)):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 1.0, shape))
    new = old + rng.normal(0, 0.2, shape)
    roll = old + rng.normal(0, 0.5, shape)
    ref = old + rng.normal(0, 0.3, shape)
    adv = rng.normal(0, 1, shape[0])
    lengths = rng.integers(0, shape[1] + 1, shape[0])
    mask = np.arange(shape[1])[None, :] < lengths[:, None]
    for x in (new, old, roll, ref):  # garbage where masked: must not leak
        x[~mask] = rng.choice([np.nan, np.inf, -np.inf, 1e30], (~mask).sum())
    return new, old, roll, ref, adv, mask


@pytest.mark.parametrize("cap,kl_coef", [(2.0, 0.0), (1.1, 0.0), (None, 0.0), (2.0, 0.05)])
def test_loss_against_float64_reference(cap, kl_coef):
    for seed in range(3):
        new, old, roll, ref, adv, mask = _logps(seed)
        f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
        loss, diag = R.grpo_loss(f32(new), f32(old), f32(roll), f32(adv), jnp.asarray(mask),
                                 0.2, cap, kl_coef, f32(ref) if kl_coef else None)
        want, wdiag = ref_loss(new, old, roll, adv, mask, 0.2, cap, kl_coef,
                               ref if kl_coef else None)
        np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
        for k, v in wdiag.items():
            np.testing.assert_allclose(float(diag[k]), v, rtol=1e-4, atol=1e-6, err_msg=k)


def test_loss_hand_computed():
    """Token 1: ratio 1.5 (clipped to 1.2), IS ratio 3 (capped to 2): -2.4. Token 2: ratio 1,
    IS ratio 1: -1. Token 3 is padding."""
    old = jnp.log(jnp.array([[0.2, 0.5, 0.1]]))
    new = old + jnp.log(jnp.array([[1.5, 1.0, 7.0]]))
    roll = old - jnp.log(jnp.array([[3.0, 1.0, 1.0]]))
    mask = jnp.array([[True, True, False]])
    loss, diag = R.grpo_loss(new, old, roll, jnp.array([1.0]), mask, 0.2, 2.0)
    np.testing.assert_allclose(float(loss), -1.7, rtol=1e-6)
    assert float(diag["is_capped_frac"]) == 0.5 and float(diag["clip_frac"]) == 0.5
    k3 = (3 - math.log(3) - 1) / 2  # exp(d) - d - 1 at d = log 3, and 0
    np.testing.assert_allclose(float(diag["mismatch_kl"]), k3, rtol=1e-5)
    # no correction: the weights are 1 (-1.2 and -1)
    loss, diag = R.grpo_loss(new, old, roll, jnp.array([1.0]), mask, 0.2, None)
    np.testing.assert_allclose(float(loss), -1.1, rtol=1e-6)
    assert float(diag["is_capped_frac"]) == 0.0
    # all padding: loss 0, not NaN
    loss, _ = R.grpo_loss(new, old, roll, jnp.array([1.0]), jnp.zeros_like(mask), 0.2, 2.0)
    assert float(loss) == 0.0


def test_gradients_masked_tokens_and_is_weights():
    new, old, roll, ref, adv, mask = _logps(7)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731

    def loss(n, r):
        return R.grpo_loss(n, f32(old), r, f32(adv), jnp.asarray(mask), 0.2, 1.5)[0]

    g_new, g_roll = jax.grad(loss, argnums=(0, 1))(f32(new), f32(roll))
    g_new, g_roll = np.asarray(g_new), np.asarray(g_roll)
    assert np.all(g_new[~mask] == 0) and np.isfinite(g_new).all()
    assert np.all(g_roll == 0)  # the IS weight is a constant
    # valid tokens: d/dlogp_new = -w * A * ratio / n where the unclipped term is the min
    n = mask.sum()
    ratio = np.exp(new - old)
    a = adv[:, None]
    w = np.minimum(np.exp(old - roll), 1.5)
    active = ratio * a <= np.clip(ratio, 0.8, 1.2) * a
    want = np.where(active, -w * a * ratio / n, 0.0)
    np.testing.assert_allclose(g_new[mask], want[mask], rtol=1e-4, atol=1e-7)


def test_all_equal_rewards_give_zero_loss_and_gradient():
    new, old, roll, _, _, mask = _logps(1)
    adv = R.group_advantages(jnp.ones((2, 3)), 1e-6).reshape(-1)
    g = jax.grad(lambda n: R.grpo_loss(n, jnp.asarray(old, jnp.float32),
                                       jnp.asarray(roll, jnp.float32), adv,
                                       jnp.asarray(mask), 0.2, 2.0)[0])(
        jnp.asarray(new, jnp.float32))
    assert np.all(np.asarray(g) == 0)


# ---------------------------------------------------------------------------- rollouts


@pytest.fixture(scope="module")
def tiny():
    model = M.Decoder(TINY, "fp32")
    variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    return model, variables


def test_completion_mask_hand_written():
    t = jnp.array([[5, 10, 7, 10], [10, 1, 2, 3], [1, 2, 3, 4]])
    want = [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    np.testing.assert_array_equal(np.asarray(R.completion_mask(t, 10)), np.array(want, bool))


def test_sample_groups(tiny):
    model, variables = tiny
    prompts = R.prompt_tokens(jnp.array([3, 8]), jnp.array([4, 1]), 1)
    allowed = jnp.zeros((256,), bool).at[D.encode(R.ALPHABET)].set(True)
    sample = jax.jit(lambda k, t: R.sample_groups(model, variables, prompts, 4, 3, k, t,
                                                  allowed), static_argnums=1)
    roll = sample(jax.random.key(1), 1.0)
    assert roll.tokens.shape == roll.logp.shape == roll.mask.shape == (8, 3)
    np.testing.assert_array_equal(np.asarray(roll.prompts),
                                  np.repeat(np.asarray(prompts), 4, axis=0))
    assert set(np.asarray(roll.tokens).ravel()) <= set(D.encode(R.ALPHABET).tolist())
    assert len({tuple(r) for r in np.asarray(roll.tokens)}) > 1
    np.testing.assert_array_equal(np.asarray(sample(jax.random.key(1), 1.0).tokens),
                                  np.asarray(roll.tokens))
    np.testing.assert_array_equal(np.asarray(roll.mask),
                                  np.asarray(R.completion_mask(roll.tokens)))
    # the cached rollout's log-probabilities are the uncached forward pass's
    lp = jax.jit(lambda p, t: R.sequence_logprobs(model, variables, p, t, 1.0, allowed))(
        roll.prompts, roll.tokens)
    np.testing.assert_allclose(np.asarray(roll.logp), np.asarray(lp), atol=2e-5)
    # and they are log-probabilities over the 11 allowed tokens (near uniform at init)
    assert np.all(np.abs(np.asarray(roll.logp) + math.log(11)) < 0.5)
    greedy = np.asarray(sample(jax.random.key(2), 0.0).tokens)
    assert all((greedy[i] == greedy[i - i % 4]).all() for i in range(8))
    # through an FP8 KV cache: the same draws' log-probabilities, up to its rounding
    fp8 = jax.jit(lambda k: R.sample_groups(model, variables, prompts, 4, 3, k, 1.0, allowed,
                                            kv_fp8=True))(jax.random.key(1))
    assert fp8.tokens.shape == (8, 3) and np.isfinite(np.asarray(fp8.logp)).all()
    lp8 = jax.jit(lambda p, t: R.sequence_logprobs(model, variables, p, t, 1.0, allowed))(
        fp8.prompts, fp8.tokens)
    gap = np.abs(np.asarray(fp8.logp) - np.asarray(lp8))
    assert 0 < gap.max() < 0.05


def test_fp8_rollout_quantizes_only_block_linear_layers(tiny):
    model, variables = tiny
    params = variables["params"]
    q = jax.jit(R.fp8_rollout_params)(params)
    for path in (("embedding",), ("head", "kernel"), ("final_norm", "scale"),
                 ("block0", "attn_norm", "scale")):
        a, b = params, q
        for k in path:
            a, b = a[k], b[k]
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for layer in (("attn", "qkv"), ("attn", "out"), ("mlp", "wi"), ("mlp", "wo")):
        w = np.asarray(params["block0"][layer[0]][layer[1]]["kernel"], np.float64)
        wq = np.asarray(q["block0"][layer[0]][layer[1]]["kernel"], np.float64)
        # one 128x128 tile: one scale, amax / 448; every value on the E4M3 grid times it
        s = np.float32(np.float64(np.abs(w).max()) * np.float64(np.float32(1 / 448)))
        grid = np.asarray((w / np.float64(s)).astype(np.float32).clip(-448, 448).astype(E4M3),
                          np.float64)
        np.testing.assert_array_equal(wq, (grid * np.float64(s)).astype(np.float32))
        assert not np.array_equal(w, wq)
    tokens = R.prompt_tokens(jnp.array([3]), jnp.array([4]), 1)
    plain = np.asarray(jax.jit(model.apply)({"params": q}, tokens))
    with R.fp8_activations():  # active while jit traces
        fp8 = np.asarray(jax.jit(lambda v, t: model.apply(v, t))({"params": q}, tokens))
    assert not np.array_equal(plain, fp8)  # the activations were quantized too
    np.testing.assert_allclose(fp8, plain, atol=0.1 * np.abs(plain).max())


# --------------------------------------------------------------------- block FP8 quantizer


def ref_blockfp8(x, block):
    """Block FP8 in float64 and ml_dtypes: per block amax of the finite values, scale
    ``fl32(amax * fl32(1 / 448))`` (1.0 for a zero amax or a subnormal scale), elements
    ``e4m3(clip(fl32(x * fl32(1 / scale))))``: float64 products of float32 numbers are exact,
    rounded to float32 where the quantizer rounds."""
    x = np.asarray(x, np.float64)
    br, bc = block
    x2 = x if br > 1 else x[..., None, :]
    m, n = x2.shape[-2:]
    nr, nc = -(-m // br), -(-n // bc)
    q = np.zeros(x2.shape, E4M3)
    scale = np.zeros(x2.shape[:-2] + (nr, nc), np.float32)
    for idx in np.ndindex(*x2.shape[:-2]):
        for i in range(nr):
            for j in range(nc):
                blk = x2[idx][i * br:(i + 1) * br, j * bc:(j + 1) * bc]
                fin = np.abs(blk[np.isfinite(blk)])
                amax = fin.max() if fin.size else 0.0
                s = np.float32(np.float64(np.float32(amax)) * np.float64(np.float32(1 / 448)))
                if amax == 0 or s < np.finfo(np.float32).tiny:
                    s = np.float32(1.0)
                inv = np.float32(1.0 / np.float64(s))
                with np.errstate(invalid="ignore", over="ignore"):
                    y = (blk * np.float64(inv)).astype(np.float32).clip(-448, 448)
                q[idx][i * br:(i + 1) * br, j * bc:(j + 1) * bc] = y.astype(E4M3)
                scale[idx][i, j] = s
    if br == 1:
        return q[..., 0, :], scale[..., 0, :]
    return q, scale


def expand(scale, shape, block):
    """Each block's scale repeated over its elements (float64, ``shape``)."""
    s = np.repeat(np.asarray(scale, np.float64), 128, -1)[..., : shape[-1]]
    if block[0] > 1:
        s = np.repeat(s, 128, -2)[..., : shape[-2], :]
    return s


def assert_same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(got.view(np.uint8)[~gn], want.view(np.uint8)[~wn])


@pytest.mark.parametrize("shape,block", [((3, 300), (1, 128)), ((256,), (1, 128)),
                                         ((2, 130, 260), (128, 128)), ((64, 96), (128, 128))])
def test_blockfp8_bitwise_against_ml_dtypes(shape, block):
    rng = np.random.default_rng(sum(shape))
    # blocks of very different magnitudes, including E4M3 subnormals inside a block
    x = rng.normal(size=shape) * np.exp2(rng.integers(-30, 30, shape[:-1] + (1,)))
    x = x * np.where(rng.random(shape) < 0.1, 1e-4, 1.0)
    x = x.astype(np.float32)
    t = jax.jit(B.quantize, static_argnums=1)(jnp.asarray(x), block)
    q, s = ref_blockfp8(x, block)
    assert t.q.shape == x.shape and t.q.dtype == jnp.float8_e4m3fn
    assert t.scale.shape == s.shape and t.scale.dtype == jnp.float32
    assert_same_bits(t.q, q)
    np.testing.assert_array_equal(np.asarray(t.scale), s)
    d = np.asarray(B.dequantize(t))
    np.testing.assert_array_equal(d, (q.astype(np.float64) * expand(s, x.shape, block))
                                  .astype(np.float32))
    assert np.any(np.abs(q.astype(np.float32)) < 2.0 ** -6) and np.any(q.astype(np.float32) != 0)


def test_blockfp8_hand_computed_block():
    """amax 896: scale 2. 3 -> 1.5; 35 -> 17.5 -> 18 (spacing 2 above 16); 17 -> 8.5 -> 8
    (tie to even); 0.00390625 -> 2**-9 (the smallest subnormal); 0.0029296875 -> 0.75 * 2**-9
    -> 2**-9; 0.001953125 -> 2**-10, a tie -> 0."""
    x = np.zeros((1, 128), np.float32)
    vals = [896, -896, 3, 1, 35, 17, 0.00390625, 0.0029296875, 0.001953125, -0.5]
    x[0, : len(vals)] = vals
    t = B.quantize(jnp.asarray(x))
    want = np.zeros(128)
    want[: len(vals)] = [448, -448, 1.5, 0.5, 18, 8, 2.0 ** -9, 2.0 ** -9, 0, -0.25]
    np.testing.assert_array_equal(np.asarray(t.q, np.float64), want[None])
    np.testing.assert_array_equal(np.asarray(t.scale), [[2.0]])
    np.testing.assert_array_equal(np.asarray(B.dequantize(t)), 2 * want[None])


def test_blockfp8_zeros_nonfinite_and_saturation():
    x = np.zeros((4, 256), np.float32)
    x[1, :3] = [np.inf, -np.inf, 2.0]  # amax ignores inf: scale 2 / 448; inf -> +-448
    x[2, :2] = [np.nan, 448.0 * 4]  # NaN stays NaN, neighbours keep their scale
    x[3, :2] = [np.inf, np.nan]  # no finite non-zero value: scale 1
    x[3, 128:130] = [1e-40, 3.0]  # float32 subnormal beside a normal value
    t = B.quantize(jnp.asarray(x))
    q = np.asarray(t.q, np.float32)
    s = np.asarray(t.scale)
    np.testing.assert_array_equal(s[0], [1.0, 1.0])  # all-zero blocks
    np.testing.assert_array_equal(q[0], 0)
    assert s[1, 0] == np.float32(np.float32(2.0) * np.float32(1 / 448))
    np.testing.assert_array_equal(q[1, :3], [448, -448, 448])
    assert np.isnan(q[2, 0]) and q[2, 1] == 448 and s[2, 0] == 4.0
    assert q[3, 0] == 448 and np.isnan(q[3, 1]) and s[3, 0] == 1.0
    assert q[3, 128] == 0 and q[3, 129] == 448
    assert_same_bits(t.q, ref_blockfp8(x, (1, 128))[0])
    d = np.asarray(B.dequantize(t))
    assert d[1, 0] == np.float32(448 * s[1, 0]) and np.isnan(d[2, 0])
    # finite values near FP32's max: no overflow on the way to E4M3
    big = jnp.full((1, 128), 3e38, jnp.float32).at[0, 0].set(-3.4e38)
    tb = B.quantize(big)
    assert float(tb.q[0, 0].astype(jnp.float32)) == -448.0


def test_blockfp8_errors_and_fake_quantize():
    with pytest.raises(ValueError, match=r"blockfp8.quantize: block must be one of"):
        B.quantize(jnp.ones((4, 128)), (1, 32))
    with pytest.raises(ValueError, match="blockfp8.quantize: x needs at least 2 axes"):
        B.quantize(jnp.ones((128,)), (128, 128))
    with pytest.raises(TypeError, match="blockfp8.quantize: input must be floating"):
        B.quantize(jnp.ones((4, 128), jnp.int32))
    t = B.quantize(jnp.ones((4, 200)))
    with pytest.raises(ValueError, match="blockfp8.dequantize: inconsistent shapes"):
        B.dequantize(t._replace(scale=t.scale[:, :1]))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 130)), jnp.float32)
    y, g = jax.value_and_grad(lambda v: jnp.sum(B.fake_quantize(v, block=(128, 128))))(x)
    q, s = ref_blockfp8(np.asarray(x), (128, 128))
    want = np.sum(q.astype(np.float64) * expand(s, x.shape, (128, 128)))
    np.testing.assert_allclose(float(y), want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(g), 1.0)  # straight-through


# ---------------------------------------------------------------------------- training


def test_grpo_reward_rises():
    """One-digit addition, a 1-block LM, FP32 rollouts and trainer: over 40 steps the mean
    reward of the rollouts rises from chance (about 1 in 150: a right digit, then the end
    marker, among 11 tokens) as the policy learns the format, then a few sums."""
    cfg = dict(n_digits=1, d_model=32, n_layers=1, n_heads=2, d_ff=64, steps=40,
               prompts_per_step=16, group_size=16, lr=2e-2, eval_problems=0,
               recipe="fp32", rollout_recipe="fp32")
    out = jax.jit(R.make_train(cfg))(jax.random.key(0))
    r = np.asarray(out["metrics"]["reward"])
    first, last = r[:3].mean(), r[-10:].mean()
    assert first < 0.03 and last > 0.05 and last > 3 * first, (first, last)
    length = np.asarray(out["metrics"]["length"])  # the end marker comes after one digit
    assert length[0] > 2.5 and length[-1] < 2.2, length
    m = out["metrics"]
    # the same engine samples and scores (up to the rounding of cached attention): no mismatch
    assert np.abs(np.asarray(m["mismatch_kl"])).max() < 1e-5
    assert np.asarray(m["is_capped_frac"]).max() == 0
    assert "heldout_reward" not in out


# ------------------------------------------------- block FP8 training GEMMs (recipe fp8-block)


def deq_bf16(a, block):
    """``a`` through the float64 reference quantizer, dequantized to float32, then BF16."""
    q, s = ref_blockfp8(a, block)
    d = (q.astype(np.float64) * expand(s, a.shape, block)).astype(np.float32)
    return d.astype(ml_dtypes.bfloat16).astype(np.float64)


def scaled_rows(rng, shape):
    """Rows whose 128-blocks differ by up to 2**40 in magnitude: per-tensor FP8 flushes the
    small ones to zero, block scales keep them."""
    x = rng.normal(size=shape) * np.exp2(rng.integers(-20, 20, (shape[0], -(-shape[1] // 128))
                                               ).repeat(128, 1)[:, : shape[1]])
    return x.astype(np.float32)


def close(got, want, a, b):
    """BF16 output rounding (2**-8 relative) plus FP32 accumulation (relative 2**-20 of the
    sum of |products|)."""
    bound = 2.0 ** -8 * np.abs(want) + 2.0 ** -20 * (np.abs(a) @ np.abs(b))
    return np.abs(np.asarray(got, np.float64) - want) <= bound


def test_fp8block_dot_forward_and_gradients_against_float64():
    rng = np.random.default_rng(7)
    M, K, N = 130, 200, 260
    x = scaled_rows(rng, (M, K))
    w = (rng.normal(size=(K, N)) * np.exp2(rng.integers(-8, 8, (K, N)) // 128)).astype(np.float32)
    g = rng.normal(size=(M, N)).astype(ml_dtypes.bfloat16)
    r = resolve("fp8-block")
    y, vjp = jax.vjp(lambda a, b: ops.dot(a, b, r), jnp.asarray(x), jnp.asarray(w))
    dx, dw = vjp(jnp.asarray(g))
    assert y.dtype == jnp.bfloat16 and dx.dtype == jnp.float32 and dw.dtype == jnp.float32
    xd, wd = deq_bf16(x, (1, 128)), deq_bf16(w, (128, 128))
    assert np.all(close(y, xd @ wd, xd, wd))
    gd = deq_bf16(np.asarray(g, np.float32), (1, 128))  # dgrad: g in blocks along N
    assert np.all(close(dx, gd @ wd.T, gd, wd.T))
    xtd = deq_bf16(x.T.copy(), (1, 128))  # wgrad: x^T and g^T in blocks along M
    gtd = deq_bf16(np.asarray(g, np.float32).T.copy(), (1, 128))
    assert np.all(close(dw, xtd @ gtd.T, xtd, gtd.T))
    # the bound tells block scales from one scale per tensor: rows of small blocks vanish
    amax = np.abs(x).max()
    s = np.float32(amax / 448)
    xt = (np.clip(x / s, -448, 448).astype(E4M3).astype(np.float64) * s)
    assert not np.all(close(y, xt @ wd, xt, wd))


def test_fp8block_recipe_is_block_fp8_everywhere_and_emulated():
    r = resolve("fp8-block")
    assert (r.number_format, r.quantizer, r.fwd_dtype, r.bwd_dtype) == (
        "fp8", "fp8block", "float8_e4m3fn", "float8_e4m3fn")
    assert ops.is_emulated(r)
    x = jnp.zeros((4, 128), jnp.float32).at[0, 0].set(jnp.nan)
    y = ops.dot(x, jnp.ones((128, 8), jnp.float32), r)
    assert bool(jnp.all(jnp.isnan(y[0]))) and bool(jnp.all(y[1:] == 0))
