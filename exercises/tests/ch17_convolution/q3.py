from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_maxpool():
    from kernels_src.grading import check_gpu
    check_gpu('maxpool_gpu', kernels=('maxpool_kernel',), op='maxpool2d', args=('y', 'x', 'R', 'S', 'stride', 'pad'), sizes=[(1, 1, 1, 1, 1, 1, 1, 0), (1, 1, 7, 5, 3, 3, 2, 1)])

