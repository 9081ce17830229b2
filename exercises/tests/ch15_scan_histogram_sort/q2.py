from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_histogram():
    from kernels_src.grading import check_gpu
    check_gpu('hist_gpu', kernels=('zero_kernel', 'hist_kernel'), op='histogram', args=('counts', 'x', 'bins'), sizes=[(1, 1, 0), (97, 7, 0), (200, 256, 1)])

