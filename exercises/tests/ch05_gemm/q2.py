from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_tiled():
    from kernels_src.grading import check_gpu
    check_gpu('gemm_tiled_gpu', kernels=('gemm_tiled_kernel',), op='gemm', args=('C', 'A', 'B'), sizes=[(1, 1, 1), (8, 8, 8), (16, 8, 24)])

