from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_im2col():
    from kernels_src.grading import check_cpu
    check_cpu('im2col', op='im2col', args=('col', 'x', 'R', 'S', 'stride', 'pad'))

