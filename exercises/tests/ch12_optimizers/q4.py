from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [1]

@test_case(points=None, hidden=False)
def test_q4_vanish():
    from kernels_src.grading import check_cpu
    check_cpu('vanishes_fp16', op='fp16_update_vanishes', args=('lost', 'p', 'u'))

