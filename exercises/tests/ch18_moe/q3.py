from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_combine():
    from kernels_src.grading import check_gpu
    check_gpu('combine_gpu', kernels=('combine_kernel',), op='moe_combine', args=('out', 'Y', 'w', 'slot_row'), sizes=[(1, 4, 1, 1, 4, 0, 0), (7, 5, 3, 3, 4, 0, 1)])

