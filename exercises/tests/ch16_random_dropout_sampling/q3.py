from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_top_p():
    from kernels_src.grading import check_cpu
    check_cpu('top_p_count', op='top_p_count', args=('n', 'w', 'p'), allow=('sort',))

