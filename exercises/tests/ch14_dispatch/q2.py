from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_splitk():
    from kernels_src.grading import check_gpu
    check_gpu('gemm_splitk', kernels=('splitk_partial_kernel', 'splitk_sum_kernel'), op='gemm', args=('C', 'A', 'B'), sizes=[(2, 3, 40), (3, 5, 70)])

