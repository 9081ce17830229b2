from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_rmsnorm():
    from kernels_src.grading import check_gpu
    check_gpu('rmsnorm_fp16_gpu', kernels=('rmsnorm_fp16_kernel',), op='rmsnorm_fp16_y', dtype='float16', args=('y', 'x', 'gamma'))

