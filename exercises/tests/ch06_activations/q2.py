from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_gelu_bwd():
    from kernels_src.grading import check_cpu
    check_cpu('gelu_tanh_bwd_cpu', op='gelu_tanh_bwd', args=('dx', 'dy', 'x'))

