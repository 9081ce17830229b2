from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_adamw():
    from kernels_src.grading import check_gpu
    check_gpu('adamw_gpu', kernels=('adamw_kernel',), op='adamw', args=('p_new', 'm_new', 'v_new', 'p', 'g', 'm', 'v'), sizes=[(1,), (7,), (37,)])

