"""An offline English corpus, byte-level tokens, and the checks that run before training.

The corpus, ``repro/data/lm_corpus.txt.gz`` (6.8 MB of UTF-8 text, 2.2 MB gzipped), ships with
the package, so nothing is downloaded at run time. It joins three public-domain English works,
taken from Debian's packages (licence and provenance: ``repro/data/lm_corpus_LICENSE.txt``):

* the World English Bible (2020 stable text; package ``sword-text-web``), markup and
  footnotes removed: modern narrative and poetic English, 5.0 MB;
* Ambrose Bierce, *The Devil's Dictionary* (1911; package ``dict-devil``): 0.4 MB;
* The Jargon File 4.4.7 (2003; package ``dict-jargon``): 1.4 MB of technical English.

:func:`build_corpus` regenerates the file from the extracted packages
(``apt-get download sword-text-web dict-devil dict-jargon`` then ``dpkg-deb -x``).

Tokens are bytes (vocabulary 256): no tokenizer to train or download, and a loss in nats per
byte is comparable across every recipe. The held-out split is every 20th 16 KiB chunk (5%),
interleaved so both splits cover all three works. Batches are a pure function of
``(seed, step)``, so a run restarted from a checkpoint sees exactly the batches it would have.

``preflight`` raises :class:`DataError` (one line) before any training for a missing or empty
corpus, a sequence length larger than a split, or a model that cannot fit in device memory.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os
import re
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from repro.precision.recipes import Recipe

CORPUS_NAME = "lm_corpus.txt.gz"
LICENSE_NAME = "lm_corpus_LICENSE.txt"
VOCAB_SIZE = 256
CHUNK_BYTES = 16384
HELDOUT_EVERY = 20


class DataError(ValueError):
    """A bad input found before training (corpus, sequence length, memory): one clear line."""


# ------------------------------------------------------------------------------ corpus


def corpus_path() -> Path:
    """The shipped corpus file (inside the installed ``repro`` package)."""
    return Path(__file__).resolve().parent.parent / "data" / CORPUS_NAME


def load_corpus(path: str | Path | None = None) -> np.ndarray:
    """The corpus as a uint8 array of bytes (= tokens). ``.gz`` files are decompressed."""
    path = Path(path) if path is not None else corpus_path()
    if not path.is_file():
        raise DataError(f"corpus file {path} is missing (it ships in repro/data/; "
                        "reinstall the package or pass an existing text file)")
    raw = path.read_bytes()
    if path.suffix == ".gz" and raw:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"corpus file {path} is not valid gzip: {e}") from None
    if not raw.strip():
        raise DataError(f"corpus file {path} is empty")
    return np.frombuffer(raw, dtype=np.uint8)


def encode(text: str) -> np.ndarray:
    """Byte-level tokens of ``text`` (UTF-8)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def decode(tokens) -> str:
    """Text of byte tokens; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
    return bytes(np.asarray(tokens, dtype=np.uint8)).decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class Splits:
    train: np.ndarray  # uint8 tokens
    heldout: np.ndarray
    source: str

    def __repr__(self) -> str:
        return (f"Splits(train={self.train.size:,} tokens, heldout={self.heldout.size:,} "
                f"tokens, source={self.source!r})")


def split(tokens: np.ndarray, heldout_every: int = HELDOUT_EVERY,
          chunk: int = CHUNK_BYTES, source: str = "") -> Splits:
    """Every ``heldout_every``-th chunk of ``chunk`` bytes is held out; the rest is training.

    A corpus shorter than ``heldout_every`` chunks is cut into ``heldout_every`` equal chunks
    instead, so a small file still gets a held-out part.
    """
    n = tokens.size
    chunk = max(1, min(chunk, n // heldout_every))
    ids = np.arange(n) // chunk
    held = (ids % heldout_every) == heldout_every - 1
    return Splits(tokens[~held], tokens[held], source)


@functools.lru_cache(maxsize=4)
def _load_splits_cached(path: str) -> Splits:
    return split(load_corpus(path), source=path)


def load_splits(path: str | Path | None = None) -> Splits:
    """Train / held-out splits of the corpus (cached per path)."""
    return _load_splits_cached(str(Path(path) if path is not None else corpus_path()))


# ----------------------------------------------------------------------------- batches


def train_batch(tokens: np.ndarray, step: int, batch_size: int, seq_len: int,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows of ``seq_len + 1`` bytes; a pure function of (seed, step).

    Returns int32 (inputs, targets), each [batch_size, seq_len], targets shifted by one.
    """
    rng = np.random.default_rng([int(seed), int(step), 0x4C4D])
    starts = rng.integers(0, tokens.size - seq_len - 1, size=batch_size, endpoint=True)
    w = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int32)
    return w[:, :-1], w[:, 1:]


def heldout_batches(tokens: np.ndarray, seq_len: int, batch_size: int,
                    n_batches: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed evaluation windows spread evenly over the held-out split (same for every run)."""
    n = batch_size * n_batches
    starts = np.linspace(0, tokens.size - seq_len - 1, n).astype(np.int64)
    w = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int32)
    w = w.reshape(n_batches, batch_size, seq_len + 1)
    return [(b[:, :-1], b[:, 1:]) for b in w]


# --------------------------------------------------------------------------- preflight


def device_memory_limit(device=None) -> tuple[int | None, str]:
    """Bytes the device can hold and where the number came from.

    ``memory_stats()['bytes_limit']`` on GPUs/TPUs; on CPU (no memory_stats) the machine's
    physical memory. ``REPRO_MEMORY_LIMIT_BYTES`` overrides both (tests, shared machines).
    """
    if env := os.environ.get("REPRO_MEMORY_LIMIT_BYTES"):
        return int(float(env)), "REPRO_MEMORY_LIMIT_BYTES"
    import jax

    dev = device or jax.devices()[0]
    try:
        stats = dev.memory_stats()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{dev.device_kind} memory_stats()['bytes_limit']"
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory"
    except (ValueError, OSError, AttributeError):
        return None, "unknown"


def _activation_factor(recipe: Recipe | None) -> float:
    """Saved-activation memory relative to BF16 (XLA's memory analysis on an H200: 20m and
    120m models; NVFP4 with stochastic rounding keeps 3.0-3.6x, other recipes about 1x)."""
    if recipe is None:
        return 1.0
    r = recipe
    if r.gemm == "nvfp4" and r.stochastic_rounding:
        return 3.8
    return 1.1 if r.quantized else 1.0


def estimate_train_bytes(cfg, batch_size: int, recipe: Recipe | None = None,
                         flash_attention: bool | None = None) -> dict[str, int]:
    """A rough estimate of one training step's device memory, for the pre-training check.

    params + optimizer: FP32 master weights, FP32 gradients, Adam's two FP32 moments and a
    BF16 compute copy: 18 bytes per parameter. Activations saved for the backward pass, per
    token and block: about 18 d + 8 d_ff bytes (BF16 norm in/out, q, k, v, attention output,
    SwiGLU gate/up/product), times a per-recipe factor (:func:`_activation_factor`); without
    flash attention (XLA's attention, i.e. off GPU) also the T x T scores (FP32 logits + BF16
    probabilities, 6 h T^2 bytes per sequence); plus the FP32 logits, their softmax and
    gradient (12 V bytes per token). Against XLA's memory analysis of the compiled step on an
    H200 (cuDNN attention): 20m BF16 batch 64: 4.2 GiB estimated, 4.1 measured; 120m BF16
    batch 32: 17.8 vs 15.9; 20m NVFP4: 14.7 vs 12.5; 120m NVFP4: 62 vs 59.
    """
    from repro.models.lm import param_count

    if flash_attention is None:
        from repro import hardware

        flash_attention = hardware.platform() == "gpu"
    n = param_count(cfg)
    t, d, f, h = cfg.seq_len, cfg.d_model, cfg.d_ff, cfg.n_heads
    per_seq_block = (_activation_factor(recipe) * t * (18 * d + 8 * f)
                     + (0 if flash_attention else 6 * h * t * t))
    acts = int(batch_size * cfg.n_layers * per_seq_block)
    logits = 12 * batch_size * t * cfg.vocab_size
    params = 18 * n
    return {"params_optimizer": params, "activations": acts + logits,
            "total": params + acts + logits}


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def preflight(cfg, batch_size: int, corpus: str | Path | None = None,
              bytes_limit: int | None = None, recipe: Recipe | None = None) -> Splits:
    """Every check that must pass before training; returns the corpus splits.

    Raises DataError for: missing or empty corpus; ``seq_len`` larger than a split; a
    sequence length or width the NVFP4 blocks cannot tile; an estimated footprint above 90% of
    the device's memory.
    """
    splits = load_splits(corpus)
    for name, part in (("training", splits.train), ("held-out", splits.heldout)):
        if cfg.seq_len + 1 > part.size:
            raise DataError(
                f"sequence length {cfg.seq_len} is larger than the {name} split of the corpus "
                f"({part.size:,} tokens in {splits.source}); use a shorter seq_len or a "
                "larger corpus")
    if batch_size < 1:
        raise DataError(f"batch size must be >= 1, got {batch_size}")
    if (batch_size * cfg.seq_len) % 16:
        raise DataError(f"batch_size * seq_len = {batch_size * cfg.seq_len} must be a multiple "
                        "of 16 (NVFP4/MXFP8 weight-gradient GEMMs block the token axis)")
    est = estimate_train_bytes(cfg, batch_size, recipe)
    limit, where = (bytes_limit, "given limit") if bytes_limit else device_memory_limit()
    if limit and est["total"] > 0.9 * limit:
        raise DataError(
            f"model {cfg.name!r} with batch {batch_size} x {cfg.seq_len} needs about "
            f"{_gib(est['total'])} (params+optimizer {_gib(est['params_optimizer'])}, "
            f"activations {_gib(est['activations'])}) but the device has {_gib(limit)} "
            f"({where}); use a smaller model or batch")
    return splits


# ------------------------------------------------------- building the shipped corpus file


def _sword_ztext_verses(module_dir: Path) -> list[str]:
    """Verses of a SWORD zText module in canonical order (verse index .bzv -> block .bzs/.bzz)."""
    verses: list[str] = []
    for testament in ("ot", "nt"):
        bzs = (module_dir / f"{testament}.bzs").read_bytes()
        bzz = (module_dir / f"{testament}.bzz").read_bytes()
        bzv = (module_dir / f"{testament}.bzv").read_bytes()
        blocks: dict[int, bytes] = {}
        for k in range(len(bzv) // 10):
            block, start, size = struct.unpack("<IIH", bzv[10 * k:10 * k + 10])
            if size == 0:
                continue
            if block not in blocks:
                off, csize, _ = struct.unpack("<3I", bzs[12 * block:12 * block + 12])
                blocks[block] = zlib.decompress(bzz[off:off + csize])
            verses.append(blocks[block][start:start + size].decode("utf-8"))
    return verses


def _osis_to_text(osis: str) -> str:
    """Plain text of OSIS markup: notes dropped, paragraphs/lines/chapters become newlines."""
    # A footnote often stands for the space between two words ("God<note>..</note>created").
    s = re.sub(r"<note\b.*?</note>", "\x00", osis, flags=re.S)
    s = re.sub(r"<title\b[^>]*>(.*?)</title>", r"\n\1\n", s, flags=re.S)
    s = re.sub(r"<(?:chapter|div)\b[^>]*\bsID=[^>]*/>", "\n", s)
    s = re.sub(r"<(?:l|lb|item)\b[^>]*>", "\n", s)
    s = re.sub(r"<[^>]+>", "", s)
    s = re.sub(r"(?<=\w)\x00(?=\w)", " ", s).replace("\x00", "")
    s = re.sub(r"[ \t]+", " ", s)
    s = re.sub(r" *\n *", "\n", s)
    return re.sub(r"\n{2,}", "\n\n", s).strip() + "\n"


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def _dictd_text(dict_dz: Path) -> str:
    """The entries of a dictd database (dictzip is gzip) in file order, via its .index file.

    The ``00database*`` / ``00-database-*`` entries (dictfmt's headers) are left out.
    """
    data = gzip.decompress(dict_dz.read_bytes())
    index = dict_dz.with_name(dict_dz.name.replace(".dict.dz", ".index")).read_text("utf-8")
    spans = set()
    for line in index.splitlines():
        word, off, size = line.split("\t")[:3]
        if not re.match(r"00-?database", word):
            spans.add((_b64(off), _b64(size)))
    entries = [data[o:o + n].decode("utf-8").strip("\n") for o, n in sorted(spans)]
    return re.sub(r"\n{3,}", "\n\n", "\n\n".join(entries)).strip() + "\n"


def build_corpus(extracted_root: str | Path, out: str | Path | None = None) -> Path:
    """Regenerate ``lm_corpus.txt.gz`` from the three extracted Debian packages.

    ``extracted_root`` holds ``sword-text-web/``, ``dict-devil/`` and ``dict-jargon/``, each a
    ``dpkg-deb -x`` of that package. Deterministic (gzip mtime 0).
    """
    root = Path(extracted_root)
    web = root / "sword-text-web/usr/share/sword/modules/texts/ztext/engWEB2015eb"
    bible = _osis_to_text(" ".join(_sword_ztext_verses(web)))
    devil = _dictd_text(root / "dict-devil/usr/share/dictd/devil.dict.dz")
    jargon = _dictd_text(root / "dict-jargon/usr/share/dictd/jargon.dict.dz")
    text = "\n\n".join([bible, devil, jargon])
    out = Path(out) if out is not None else corpus_path()
    out.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    return out
