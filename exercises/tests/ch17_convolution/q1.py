from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_conv1d_halo():
    from kernels_src.grading import check_gpu
    check_gpu('conv1d_gpu', kernels=('conv1d_tile_kernel',), op='conv1d_halo', args=('y', 'x', 'w', 'pad'), sizes=[(1, 1, 0), (37, 5, 2), (20, 3, 1)])

