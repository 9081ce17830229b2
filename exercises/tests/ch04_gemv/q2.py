from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_splitk():
    from kernels_src.grading import check_gpu
    check_gpu('gemv_splitk_gpu', kernels=('gemv_splitk_kernel',), op='gemv', args=('y', 'x', 'W'), sizes=[(1, 1), (7, 3), (33, 5)])

