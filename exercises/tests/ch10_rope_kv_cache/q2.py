from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_rope_interleaved():
    from kernels_src.grading import check_gpu
    check_gpu('rope_interleaved_gpu', kernels=('rope_interleaved_kernel',), op='rope_interleaved', args=('y', 'x', 'pos', 'cos', 'sin'))

