from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_scores():
    from kernels_src.grading import check_cpu
    check_cpu('attention_scores_cpu', op='attention_scores', args=('sc', 'q', 'k', 'v', 'kv_len', 'causal'))

