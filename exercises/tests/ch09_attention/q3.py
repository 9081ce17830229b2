from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_flash():
    from kernels_src.grading import check_gpu
    check_gpu('attention_flash_gpu', kernels=('attention_flash_kernel',), op='attention', args=('o', 'lse', 'q', 'k', 'v', 'kv_len', 'causal'))

