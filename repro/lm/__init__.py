"""A MaxText/Llama-style decoder LM trained under each precision recipe (claims B3, B4).

``model`` (the decoder and the NVFP4 layer policy), ``data`` (an offline public-domain English
corpus, byte-level tokens, pre-training checks), ``train`` (AdamW, warmup + cosine, held-out
eval, orbax checkpoints that resume bit-exactly), ``experiments`` (``record``: loss curves and
stored-tensor memory per recipe and seed).
"""
