from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_coalesced():
    from kernels_src.grading import check_gpu
    check_gpu('gemm_coalesced_gpu', kernels=('gemm_coalesced_kernel',), op='gemm', args=('C', 'A', 'B'), sizes=[(1, 1, 1), (7, 5, 3), (9, 40, 4)])

