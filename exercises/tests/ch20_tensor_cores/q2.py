from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_tc_gemm():
    from kernels_src.grading import check_gpu
    check_gpu('tc_gemm', kernels=('tc_gemm_kernel',), op='gemm_tf32', args=('C', 'A', 'B'), sizes=[(1, 1, 1), (17, 9, 19)])

