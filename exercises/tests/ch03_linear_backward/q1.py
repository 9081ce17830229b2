from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_cpu_parity():
    from kernels_src.grading import check_cpu
    check_cpu('dw_cpu', op='linear_bwd_dw', args=('dW', 'X', 'G'))

