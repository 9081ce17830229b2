from otter.test_files import test_case

OK_FORMAT = False

name = "q7"
points = [1]

@test_case(points=None, hidden=False)
def test_q7_merge_order():
    from kernels_src.grading import check_cpu
    check_cpu('merge_in_order', op='attn_merge_order', args=('state', 'parts', 'order', 'mode'))

