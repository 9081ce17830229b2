from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [1]

@test_case(points=None, hidden=False)
def test_q5_segmented():
    from kernels_src.grading import check_gpu
    check_gpu('seg_scan_gpu', kernels=('seg_kernel',), op='segmented_scan', dtype='int32', args=('out', 'x', 'heads'), sizes=[(1,), (7,), (32,), (70,)])

