from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_first():
    from kernels_src.grading import check_cpu
    check_cpu('first_update_cpu', op='adam_first_update', args=('du_bc', 'du_nobc', 'g'))

