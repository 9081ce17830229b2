from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_q8_0():
    from kernels_src.grading import check_cpu
    check_cpu('q8_0_quantize', op='q8_0_quantize_parts', args=('h', 'q', 'X'))

