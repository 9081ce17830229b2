from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_slot_rows():
    from kernels_src.grading import check_cpu
    check_cpu('slot_rows', op='moe_slot_rows', args=('slot_row', 'ids', 'offsets', 'cap'))

