"""The capstone's measured sizes, in one place: the benchmark model (chapter 13), the large one (chapter 14)
and the batch and sequence each is trained or decoded at. ``bench`` measures them, ``explain`` and the
autotuner walk their calls, ``dp`` trains them on several GPUs."""
from __future__ import annotations

from . import data

BENCH = dict(vocab=data.VOCAB, ctx=256, width=512, heads=8, layers=4)
BATCH = 16
POS = 128  # the decode benchmark's position in the KV cache
LARGE = dict(vocab=data.VOCAB, ctx=1024, width=768, heads=12, layers=12)
MOE_BENCH = dict(BENCH, experts=8, topk=2)  # chapter 18: the bench model, each MLP 8 SwiGLU experts of F = 4C, top 2
TRAIN_CONFIGS = {"bench": (BENCH, BATCH, 256), "large": (LARGE, 4, 1024)}  # (config, batch, T)
