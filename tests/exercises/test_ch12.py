from solutions import ch12
from tests.exercises.harness import assert_exercise


def test_tflops():
    def forgot_causal(b, h, n, d, causal, mode, ms):
        return ch12.tflops(b, h, n, d, False, mode, ms)

    def milliseconds_as_seconds(b, h, n, d, causal, mode, ms):
        return ch12.tflops(b, h, n, d, causal, mode, ms) / 1e3

    def fwd_bwd_as_3x(b, h, n, d, causal, mode, ms):
        t = ch12.tflops(b, h, n, d, causal, "fwd", ms)
        return t * {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.0}[mode]

    def one_matmul(b, h, n, d, causal, mode, ms):
        return ch12.tflops(b, h, n, d, causal, mode, ms) / 2

    assert_exercise("ch12.tflops", ch12.tflops, wrong={
        "forgot the causal half": forgot_causal,
        "milliseconds taken as seconds": milliseconds_as_seconds,
        "fwd+bwd counted as 3x": fwd_bwd_as_3x,
        "counted one matmul": one_matmul,
        "forgot to return": lambda *args: None,
    }, message_must_mention={"forgot to return": "return"})


def test_predict_bound():
    def scores_in_hbm(b, h, nq, nk, d, s, peak, bw):  # standard attention's traffic
        flops = 4 * b * h * nq * nk * d
        moved = b * h * (2 * nq * d + 2 * nk * d + 4 * nq * nk) * s
        return "compute" if flops / moved >= peak / bw else "memory"

    def labels_swapped(*args):
        return {"compute": "memory", "memory": "compute"}[ch12.predict_bound(*args)]

    def elements_not_bytes(b, h, nq, nk, d, s, peak, bw):
        return ch12.predict_bound(b, h, nq, nk, d, 1, peak, bw)

    def square_only(b, h, nq, nk, d, s, peak, bw):  # N_q used for K and V too
        return ch12.predict_bound(b, h, nq, nq, d, s, peak, bw)

    assert_exercise("ch12.predict_bound", ch12.predict_bound, wrong={
        "the N x N scores counted as traffic": scores_in_hbm,
        "labels swapped": labels_swapped,
        "elements, not bytes": elements_not_bytes,
        "N_q used for K and V": square_only,
        "always compute": lambda *args: "compute",
    })


def test_predict_bound_at_the_ridge_is_compute():
    def strictly_above(b, h, nq, nk, d, s, peak, bw):
        flops = 4 * b * h * nq * nk * d
        moved = b * h * (2 * nq * d + 2 * nk * d) * s
        return "compute" if flops / moved > peak / bw else "memory"

    assert_exercise("ch12.predict_bound", ch12.predict_bound, wrong={
        "> instead of >=": strictly_above,
        "returns a bool": lambda *args: ch12.predict_bound(*args) == "compute",
    }, message_must_mention={"> instead of >=": "exactly at the ridge",
                             "returns a bool": "'compute' or 'memory'"})


def test_the_tie_cases_sit_exactly_on_the_ridge():
    from flashtext.cost import attention_flops, compulsory_hbm_elements
    from flashtext.exercises.ch12 import TIE_CASES, TIE_GPU

    _, peak, bandwidth = TIE_GPU
    on_ridge = 0
    for b, h, nq, nk, d, s in TIE_CASES:
        intensity = attention_flops(b, h, nq, d, n_k=nk) / (
            b * h * compulsory_hbm_elements(nq, d, nk) * s)
        on_ridge += intensity == peak / bandwidth == 256.0
    assert on_ridge >= 2
