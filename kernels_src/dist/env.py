"""The environment of a rank, and how its process is stopped. Every launcher in the course builds its ranks'
environment here, and stops what is left of them with ``stop_processes``.

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


def stop_processes(procs, grace: float = 2.0) -> None:
    """Stop every ``multiprocessing.Process`` in ``procs`` that is still running: SIGTERM, then SIGKILL for one that
    has not ended after ``grace`` seconds. A launcher calls this in its ``finally``, so that no rank is left
    spinning on a flag or a GPU after an error or a timeout."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(grace)
        if p.is_alive():
            p.kill()
            p.join(grace)
