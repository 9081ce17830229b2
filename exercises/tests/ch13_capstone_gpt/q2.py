from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_ce_bwd():
    from kernels_src.grading import check_gpu
    check_gpu('ce_bwd_gpu', kernels=('ce_bwd_kernel',), op='cross_entropy_bwd', args=('dlogits', 'logits', 'targets', 'lse', 'dloss'), sizes=[(1, 1), (3, 7), (2, 33)])

