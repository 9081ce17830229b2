from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_online():
    from kernels_src.grading import check_cpu
    check_cpu('attention_online_cpu', op='attention', args=('o', 'lse', 'q', 'k', 'v', 'kv_len', 'causal'))

