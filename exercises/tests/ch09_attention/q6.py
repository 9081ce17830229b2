from otter.test_files import test_case

OK_FORMAT = False

name = "q6"
points = [1]

@test_case(points=None, hidden=False)
def test_q6_tile_plan():
    from kernels_src.grading import check_cpu
    check_cpu('tile_plan', op='attention_tile_skip', args=('visible', 'tiles', 'cases'))

