from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_regblock():
    from kernels_src.grading import check_gpu
    check_gpu('gemm_reg_gpu', kernels=('gemm_reg_kernel',), op='gemm', args=('C', 'A', 'B'), sizes=[(1, 1, 1), (32, 32, 8), (7, 5, 3)])

