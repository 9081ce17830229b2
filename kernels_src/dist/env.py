"""The environment of a rank. Every launcher in the course builds its ranks' environment here.

NVLink multicast (NVLS) stays off everywhere: on shared multi-GPU hosts a program that creates multicast objects
can put the GPUs out of service. NCCL, PyTorch's symmetric memory and NVSHMEM each have a switch; all three are set
for every rank, whatever the caller's environment says.
"""
from __future__ import annotations

import os

SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def apply_safe_env(environ=None) -> dict:
    """Set the multicast switches in ``environ`` (default: this process's ``os.environ``) and return it."""
    environ = os.environ if environ is None else environ
    environ.update(SAFE_ENV)
    return environ


def rank_env(rank: int, nranks: int, port: int, base=None, *, master="127.0.0.1") -> dict:
    """The environment for rank ``rank`` of ``nranks``: ``base`` (default: a copy of os.environ), the
    torch.distributed rendezvous variables, and SAFE_ENV last, so nothing can turn multicast back on."""
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} is outside 0..{nranks - 1}")
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nranks), LOCAL_WORLD_SIZE=str(nranks),
               MASTER_ADDR=master, MASTER_PORT=str(port))
    return apply_safe_env(env)
