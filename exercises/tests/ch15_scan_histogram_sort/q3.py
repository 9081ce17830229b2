from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_radix_pass():
    from kernels_src.grading import check_cpu
    check_cpu('radix_pass', op='radix_pass', args=('keys_out', 'vals_out', 'keys', 'vals', 'shift'))

