from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_block():
    from kernels_src.grading import check_gpu
    check_gpu('gemv_block_gpu', kernels=('gemv_block_kernel',), op='gemv_wx', args=('y', 'W', 'x'), sizes=[(1, 1), (7, 3), (33, 5)])

