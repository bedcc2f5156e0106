"""The decoder LM exported for inference: a training checkpoint in, a quantized model out.

    from repro.models import lm as M, lm_quantize as Q, lm_train as T
    variables = Q.load_trained(ckpt_dir, cfg, tc)        # lm_train's orbax checkpoint
    ex = Q.export_lm(cfg, variables["params"], "int8")    # repro.precision.export.Exported
    logits = ex.model.apply(ex.variables, tokens)

Post-training quantization covers the linear layers of the transformer blocks
(:data:`repro.models.lm.BLOCK_LINEAR_PATH`: QKV, attention output, MLP gate/up and down), the
layers MaxText's quantization rules cover too (``decoder/.*layers.*``); the embedding, the
output head, attention's own products (QK^T, AV) and the norms stay BF16.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from repro.models import lm as M
from repro.models import lm_train as T
from repro.precision import export as X
from repro.precision.recipes import resolve


def load_trained(ckpt_dir: str | Path, cfg: M.LMConfig | str, tc: T.TrainConfig,
                 recipe: str = "bf16") -> dict:
    """The variables of the latest checkpoint ``repro.models.lm_train.train`` wrote into
    ``ckpt_dir`` for this model, training config and recipe (FP32 master weights)."""
    cfg = M.get_config(cfg)
    init, _, _ = T._functions(cfg, resolve(recipe), T._static_key(tc), False)
    abstract = jax.eval_shape(init, jnp.int32(0), jnp.zeros((1, cfg.seq_len), jnp.int32))
    got = T._restore(T._manager(Path(ckpt_dir)), *abstract)
    if got is None:
        raise ValueError(f"{ckpt_dir}: no training checkpoint to load")
    return got[1]


def export_lm(cfg: M.LMConfig | str, params, fmt: str | X.ExportFormat,
              calib_batches=None) -> X.Exported:
    """``params`` of a trained ``Decoder`` exported as ``fmt`` (``repro.precision.export``),
    the block linear layers quantized; ``calib_batches`` (token arrays ``[B, T]``) calibrate
    delayed-scaling formats."""
    cfg = M.get_config(cfg)
    return X.export(M.Decoder(cfg, "bf16"), params, fmt, (1, min(cfg.seq_len, 16)),
                    module_path=M.BLOCK_LINEAR_PATH, calib_batches=calib_batches)
