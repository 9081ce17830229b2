from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [1]

@test_case(points=None, hidden=False)
def test_q4_dv():
    from kernels_src.grading import check_cpu
    check_cpu('attention_dv_cpu', op='attention_bwd_dv', args=('dv', 'do', 'q', 'k', 'v', 'o', 'lse', 'kv_len', 'causal'))

