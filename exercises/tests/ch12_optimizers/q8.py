from otter.test_files import test_case

OK_FORMAT = False

name = "q8"
points = [1]

@test_case(points=None, hidden=False)
def test_q8_partials():
    from kernels_src.grading import check_gpu
    check_gpu('partials_gpu', kernels=('block_sumsq_kernel',), op='clip_block_partials', args=('partials', 'g'), sizes=[(1,), (7,), (129,)])

