"""Collectives across ranks (chapter 21): all-reduce, reduce-scatter, all-gather and broadcast.

- ``env``: the environment every launcher gives the ranks it starts (NVLink multicast stays off).
- ``schedule``: chunk bounds and the ring's send/receive schedule, pure Python (the chapter and exercises use them).
- ``comm``: CPU ranks, one process each, on shared memory (works on a laptop and in CI).
- ``gpu``: one process per GPU, peers' buffers opened through CUDA IPC; the course's ring and one-shot all-reduce.
- ``nccl``: the same collectives through NCCL, the engine users trust.
- ``sweep``: ``kernels collectives sweep``, the all-reduce bus-bandwidth sweep across GPUs (ring, one-shot, NCCL).
"""
