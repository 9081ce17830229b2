from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_bias_gelu():
    from kernels_src.grading import check_gpu
    check_gpu('bias_gelu_gpu', kernels=('bias_gelu_kernel',), op='bias_gelu', args=('y', 'x', 'b'), sizes=[(1, 1), (3, 7), (2, 33), (2, 150)])

