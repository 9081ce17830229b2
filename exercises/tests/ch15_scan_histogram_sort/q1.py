from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_blelloch():
    from kernels_src.grading import check_gpu
    check_gpu('scan_block_gpu', kernels=('blelloch_kernel',), op='scan_exclusive', dtype='int32', args=('out', 'x'), sizes=[(1,), (7,), (32,), (70,)])

