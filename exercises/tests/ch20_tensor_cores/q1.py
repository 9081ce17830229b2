from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_mma_tile():
    from kernels_src.grading import check_gpu
    check_gpu('mma_tile', kernels=('mma_tile_kernel',), op='mma_tile_tf32', args=('D', 'A', 'B', 'C'), sizes=[(16, 8, 8)])

