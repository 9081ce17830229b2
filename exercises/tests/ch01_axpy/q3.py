from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_block_sum_parity():
    from kernels_src.grading import check_gpu
    check_gpu('block_sum_gpu', kernels=('block_sum_kernel',), op='axpy_block_sum', args=('out', 'a', 'x', 'y'))

