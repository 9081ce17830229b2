from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [1]

@test_case(points=None, hidden=False)
def test_q5_predict():
    from kernels_src.grading import check_cpu
    check_cpu('predict_causal_speedup', op='attention_causal_speedup', args=('out', 's', 't', 'br', 'bc'), sizes=[(2048, 2048, 64, 32), (7, 7, 2, 3)])

