"""Every rank the course starts has NVLink multicast switched off, whatever the caller's environment says."""
from kernels_src.dist import env


def test_rank_env_turns_multicast_off_even_if_the_caller_turned_it_on():
    base = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "PATH": "/bin"}
    e = env.rank_env(1, 2, 29500, base)
    assert e["NCCL_NVLS_ENABLE"] == "0"
    assert e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert e["NVSHMEM_DISABLE_NVLS"] == "1"
    assert (e["RANK"], e["WORLD_SIZE"], e["MASTER_PORT"], e["PATH"]) == ("1", "2", "29500", "/bin")
    assert base["NCCL_NVLS_ENABLE"] == "1"  # the caller's dict is not changed


def test_rank_env_refuses_a_rank_outside_the_group():
    import pytest

    with pytest.raises(ValueError, match="outside"):
        env.rank_env(2, 2, 29500, {})
