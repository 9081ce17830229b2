from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_kv_decode():
    from kernels_src.grading import check_gpu
    check_gpu('kv_append_decode_gpu', kernels=('cache_append_kernel', 'decode_kernel'), op='kv_append_decode', args=('o', 'K', 'V', 'q', 'k_new', 'v_new'))

