"""FlashAttention-3 on Hopper: the exponential bottleneck, and the schedules that hide it.

An H100 SXM5 does ~989 TFLOP/s of dense fp16/bf16 matmul but only ~3.9 TFLOP/s of exponentials
(the special-function units, MUFU). Attention does 4d matmul FLOPs (2d for Q K^T, 2d for P V) per
exponential, so at head dimension d the exponentials take ``(989 / 3.9) / (4 d)`` of the matmul
time: ~99% at d = 64, ~50% at d = 128 (FlashAttention-3, Shah et al. 2024, arXiv 2407.08608).
Done one after the other, a third of the time at d = 128 goes to softmax while the tensor cores
idle. FA3 overlaps them: *ping-pong* (two warpgroups, barriers make one's softmax run during the
other's GEMMs) and *intra-warpgroup pipelining* (WGMMA is asynchronous, so in iteration j a
warpgroup issues S_j = Q K_j^T, then P_{j-1} V_{j-1}, and computes the softmax of block j while
that second GEMM runs: FA3's Algorithm 2).

:func:`simulate` is a small schedule model of one SM: a tensor-core unit and a softmax unit, each
doing one thing at a time, the GEMMs and softmaxes of a warpgroup's loop as tasks with the
dependencies of each schedule, and an optional producer (TMA) filling an ``stages``-deep shared
memory ring. It yields the timeline and the tensor-core utilisation each schedule can reach;
:data:`PAPER` holds what the paper measured, for comparison. The model is an idealisation (no
issue limits, barriers or register pressure); the chapter says where it and the GPU differ.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise

from flashtext.hardware import GPU, H100

__all__ = [
    "PAPER",
    "SCHEDULES",
    "Op",
    "Timeline",
    "predicted_utilisation",
    "model_tflops",
    "simulate",
    "softmax_fraction",
    "steady_utilisation",
    "tile_times",
]

TERA = 1e12

#: FlashAttention-3 (arXiv 2407.08608), H100 SXM5, forward, fp16/bf16 unless said.
PAPER = {
    "fa2_h100_utilisation": 0.35,  # FA2 on an H100 reaches ~35% of peak (abstract)
    "fa2_h100_tflops": 335,  # FA2 without Hopper instructions (FA2 paper's H100 number)
    "fa3_fp16_tflops_max": 740,  # 75% of peak
    "fa3_fp8_tflops_max": 1200,  # "close to 1.2 PFLOP/s"
    # Sec. 3.1, d = 128, N = 8k: ping-pong scheduling
    "pingpong_before": 570,
    "pingpong_after": (620, 640),
    # the ablation table (d = 128): each overlap removed in turn
    "ablation": {"FlashAttention-3": 661, "no intra-warpgroup pipelining": 582,
                 "no warp specialisation": 570},
}

SCHEDULES = ("naive", "pingpong", "pipelined", "pingpong+pipelined")
_TWO_LANES = ("pingpong", "pingpong+pipelined")


def softmax_fraction(d: int, gpu: GPU = H100, matmul_flops: float | None = None,
                     exp_flops: float | None = None) -> float:
    """Time of the exponentials / time of the two matmuls, for the same tile of scores.

    Per score: one exp, and 4d matmul FLOPs. So the ratio is (R / E) / (4 d) with R the matmul
    rate and E the exp rate: 0.99 at d = 64 and 0.495 at d = 128 on an H100 (989 vs 3.9 TFLOP/s).
    """
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    rate = gpu.matmul_flops if matmul_flops is None else matmul_flops
    exps = gpu.exp_flops if exp_flops is None else exp_flops
    if exps is None or exps <= 0 or rate <= 0:
        raise ValueError(f"need positive matmul and exp rates for {gpu.name}")
    return (rate / exps) / (4 * d)


@dataclass(frozen=True)
class TileTimes:
    """Seconds one warpgroup spends on one K/V block, on one SM: each GEMM (Q K^T and P V take
    the same FLOPs), its softmax, and the producer's load of the K/V tile."""

    gemm: float
    softmax: float
    load: float = 0.0


def tile_times(d: int, block_m: int = 64, block_n: int = 128, gpu: GPU = H100,
               matmul_flops: float | None = None, exp_flops: float | None = None,
               softmax_cost: float = 1.0, load_bandwidth: float | None = None) -> TileTimes:
    """Per-SM task durations for a warpgroup holding ``block_m`` query rows (WGMMA's M is 64 per
    warpgroup) and a K/V block of ``block_n`` keys.

    ``softmax_cost`` multiplies the exp-only time (1.0 counts the exponentials alone; the max,
    sum, scaling and conversions add to it). ``load_bandwidth`` (bytes/s for the whole GPU) sets
    the producer's time to bring the K and V tiles (fp16) in; ``None`` means no load is modelled.
    """
    for value, name in ((d, "d"), (block_m, "block_m"), (block_n, "block_n")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if softmax_cost <= 0:
        raise ValueError(f"softmax_cost must be positive, got {softmax_cost}")
    rate = (gpu.matmul_flops if matmul_flops is None else matmul_flops) / gpu.sms
    exps = (gpu.exp_flops if exp_flops is None else exp_flops) / gpu.sms
    gemm = 2.0 * block_m * block_n * d / rate
    softmax = softmax_cost * block_m * block_n / exps
    load = 0.0 if load_bandwidth is None else 2 * block_n * d * 2 / (load_bandwidth / gpu.sms)
    return TileTimes(gemm, softmax, load)


@dataclass(frozen=True)
class Op:
    """One task on the timeline."""

    lane: str  # who issues it: "WG 1", "WG 2", "WG 1+2 (in step)", "producer (TMA)"
    kind: str  # "GEMM0" (S = Q K^T), "softmax", "GEMM1" (O += P V), "load K", "load V"
    unit: str  # "tensor", "softmax", "tma"
    iteration: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    schedule: str
    ops: tuple[Op, ...]
    gemm: float
    softmax: float
    n_iters: int

    @property
    def makespan(self) -> float:
        return max(op.end for op in self.ops)

    @property
    def lanes(self) -> list[str]:
        return list(dict.fromkeys(op.lane for op in self.ops))

    def busy(self, unit: str, start: float = 0.0, end: float | None = None) -> float:
        """Time ``unit`` is working within [start, end]."""
        end = self.makespan if end is None else end
        return sum(max(0.0, min(op.end, end) - max(op.start, start))
                   for op in self.ops if op.unit == unit)

    @property
    def utilisation(self) -> float:
        """Tensor-core busy time / makespan, ramp-up and drain included."""
        return self.busy("tensor") / self.makespan

    def find(self, lane: str, kind: str, iteration: int) -> Op:
        for op in self.ops:
            if (op.lane, op.kind, op.iteration) == (lane, kind, iteration):
                return op
        raise KeyError((lane, kind, iteration))


def _lanes(schedule: str) -> list[str]:
    return ["WG 1", "WG 2"] if schedule in _TWO_LANES else ["WG 1+2 (in step)"]


def _build(schedule: str, n: int, g: float, s: float, load: float, stages: int):
    """Tasks (key -> (lane, kind, unit, iteration, duration)), dependencies, and the order in
    which each unit serves its tasks."""
    lanes = _lanes(schedule)
    if len(lanes) == 1:  # two warpgroups in step share each unit: one lane, twice the work
        g, s = 2 * g, 2 * s
    pipelined = schedule in ("pipelined", "pingpong+pipelined")
    tasks, deps = {}, defaultdict(list)
    for lane in lanes:
        for j in range(n):
            tasks[(lane, "GEMM0", j)] = (lane, "GEMM0", "tensor", j, g)
            tasks[(lane, "softmax", j)] = (lane, "softmax", "softmax", j, s)
            tasks[(lane, "GEMM1", j)] = (lane, "GEMM1", "tensor", j, g)
            deps[(lane, "softmax", j)].append((lane, "GEMM0", j))  # needs S
            deps[(lane, "GEMM1", j)].append((lane, "softmax", j))  # needs P
            if j == 0:
                continue
            if pipelined:  # FA3 Algorithm 2: issue Q K_j^T right after softmax j-1 ...
                deps[(lane, "GEMM0", j)].append((lane, "softmax", j - 1))
                if j >= 2:  # ... once P V_{j-2} has been waited for (O rescaled)
                    deps[(lane, "GEMM0", j)].append((lane, "GEMM1", j - 2))
            else:  # one block at a time: S_j only after O += P_{j-1} V_{j-1}
                deps[(lane, "GEMM0", j)].append((lane, "GEMM1", j - 1))
    tensor = []
    for j in range(n + 1):  # the tensor cores' issue order
        for lane in lanes:
            if pipelined:  # [Q K_j^T, P_{j-1} V_{j-1}] per warpgroup
                batch = ([(lane, "GEMM0", j)] if j < n else []) + \
                        ([(lane, "GEMM1", j - 1)] if j >= 1 else [])
            elif len(lanes) == 2:  # ping-pong: [P_{j-1} V_{j-1}, Q K_j^T] per warpgroup
                batch = ([(lane, "GEMM1", j - 1)] if j >= 1 else []) + \
                        ([(lane, "GEMM0", j)] if j < n else [])
            else:
                batch = [(lane, "GEMM0", j), (lane, "GEMM1", j)] if j < n else []
            tensor += batch
    order = {"tensor": tensor,
             "softmax": [(lane, "softmax", j) for j in range(n) for lane in lanes]}
    if load > 0:  # K and V have their own ring slots, freed by GEMM0 and GEMM1 respectively
        producer = "producer (TMA)"
        for j in range(n):
            for kind, user in (("load K", "GEMM0"), ("load V", "GEMM1")):
                tasks[(producer, kind, j)] = (producer, kind, "tma", j, load / 2)
                for lane in lanes:
                    deps[(lane, user, j)].append((producer, kind, j))
                    if j >= stages:  # slot j % stages is free once every consumer is done
                        deps[(producer, kind, j)].append((lane, user, j - stages))
        order["tma"] = [(producer, kind, j) for j in range(n) for kind in ("load K", "load V")]
    return tasks, deps, order


def simulate(schedule: str, gemm: float, softmax: float, n_iters: int = 6, load: float = 0.0,
             stages: int = 2) -> Timeline:
    """Timeline of ``n_iters`` K/V blocks on one SM under ``schedule`` (one of
    :data:`SCHEDULES`), with per-warpgroup task times ``gemm`` and ``softmax`` (seconds or any
    unit) and, if ``load`` > 0, a producer filling a ``stages``-slot shared-memory ring.

    Every task starts as soon as its inputs are ready and its unit has finished the task before
    it in that unit's order. "naive" and "pipelined" run the two consumer warpgroups in step
    (sharing each unit, so drawn as one lane doing both warpgroups' work); the ping-pong
    schedules offset them.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not (gemm > 0 and softmax >= 0 and load >= 0):
        raise ValueError(f"need gemm > 0, softmax >= 0, load >= 0; got {gemm}, {softmax}, {load}")
    if isinstance(n_iters, bool) or not isinstance(n_iters, int) or n_iters < 1:
        raise ValueError(f"n_iters must be a positive integer, got {n_iters!r}")
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive integer, got {stages!r}")
    tasks, deps, order = _build(schedule, n_iters, gemm, softmax, load, stages)
    preds = defaultdict(list)
    for key, before in deps.items():
        preds[key].extend(before)
    for keys in order.values():
        for prev, nxt in pairwise(keys):
            preds[nxt].append(prev)
    # longest path through the task graph, in topological order (Kahn)
    succ, indeg = defaultdict(list), {key: 0 for key in tasks}
    for key, before in preds.items():
        for b in before:
            succ[b].append(key)
            indeg[key] += 1
    ready = [key for key, k in indeg.items() if k == 0]
    start, end = {}, {}
    while ready:
        key = ready.pop()
        start[key] = max((end[b] for b in preds[key]), default=0.0)
        end[key] = start[key] + tasks[key][4]
        for nxt in succ[key]:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                ready.append(nxt)
    if len(end) != len(tasks):  # a wait that can never be satisfied
        raise ValueError(f"schedule {schedule!r} deadlocks with stages={stages}: a warpgroup "
                         "waits for a load that waits for a slot it has not released")
    ops = tuple(sorted((Op(*tasks[k][:4], start[k], end[k]) for k in tasks),
                       key=lambda op: (op.start, op.lane, op.kind)))
    return Timeline(schedule, ops, gemm, softmax, n_iters)


def steady_utilisation(schedule: str, gemm: float, softmax: float, load: float = 0.0,
                       stages: int = 2) -> float:
    """Tensor-core utilisation once the loop is running (a long run, measured between the
    starts of the first warpgroup's 10th and 30th Q K^T, away from ramp-up and drain)."""
    t = simulate(schedule, gemm, softmax, n_iters=40, load=load, stages=stages)
    lane = t.lanes[0] if not t.lanes[0].startswith("producer") else t.lanes[1]
    a, b = t.find(lane, "GEMM0", 10).start, t.find(lane, "GEMM0", 30).start
    return t.busy("tensor", a, b) / (b - a)


def predicted_utilisation(schedule: str, gemm: float, softmax: float) -> float:
    """Closed forms of the steady state (no load), g = gemm, s = softmax per warpgroup:

    * naive:      2g / (2g + s)       (softmax and GEMMs strictly alternate)
    * pipelined:  2g / max(2g, g + s) (the softmax hides behind the other GEMM of the pair)
    * ping-pong (with or without pipelining): min(1, 2g / s) (one warpgroup's softmax runs
      during the other's two GEMMs; only when s > 2g does the softmax unit become the limit)
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    g, s = gemm, softmax
    if schedule == "naive":
        return 2 * g / (2 * g + s)
    if schedule == "pipelined":
        return 2 * g / max(2 * g, g + s)
    return min(1.0, 2 * g / s) if s > 0 else 1.0


def model_tflops(schedule: str, d: int, matmul_flops: float | None = None,
                 softmax_cost: float = 1.0, gpu: GPU = H100) -> float:
    """TFLOP/s the model predicts: steady utilisation x the matmul rate (peak by default)."""
    rate = gpu.matmul_flops if matmul_flops is None else matmul_flops
    t = tile_times(d, gpu=gpu, matmul_flops=rate, softmax_cost=softmax_cost)
    return predicted_utilisation(schedule, t.gemm, t.softmax) * rate / TERA


@dataclass(frozen=True)
class Slot:
    """One turn at the tensor cores in the Gluon kernel's ping-pong (one row of
    :func:`pingpong_slots`): warpgroup ``issuer`` has issued its GEMMs of turn ``turn``, and
    ``softmax`` says which block's softmax each warpgroup runs meanwhile (None: none)."""

    index: int
    issuer: int  # 0 or 1: the warpgroup whose GEMMs run in this slot
    turn: int  # the issuer's turn number t (its mbarrier wait has parity t % 2)
    gemms: tuple[str, ...]  # in issue order: ("GEMM0 j",) / ("GEMM0 j", "GEMM1 j-1") / ...
    softmax: tuple[int | None, int | None]  # block whose softmax WG 0 / WG 1 runs here


def pingpong_slots(n_blocks: int) -> tuple[Slot, ...]:
    """The order in which :mod:`flashtext.kernels.gluon_forward` feeds the tensor cores, one
    K/V block being one slot per warpgroup.

    Each consumer warpgroup w takes ``n_blocks + 1`` turns: turn 0 issues GEMM0 (S_0 = Q K_0^T),
    turn t (1 <= t < n) issues GEMM0 t then GEMM1 t-1 (O += P_{t-1} V_{t-1}: FA3's
    intra-warpgroup pipelining), turn n issues the last GEMM1. A turn starts once the other
    warpgroup has issued its previous one (mbarrier ``turn[w]``; warpgroup 1 hands the first
    turn to warpgroup 0), so the turns alternate WG 0, WG 1, WG 0, ... and, the tensor cores
    working in issue order, each slot is one warpgroup's GEMMs. A warpgroup runs the softmax of
    block t in the slot after its turn t, i.e. during the other warpgroup's GEMMs.
    """
    if isinstance(n_blocks, bool) or not isinstance(n_blocks, int) or n_blocks < 1:
        raise ValueError(f"n_blocks must be a positive integer, got {n_blocks!r}")
    slots = []
    for index in range(2 * (n_blocks + 1)):
        issuer, turn = index % 2, index // 2
        gemms = ((f"GEMM0 {turn}",) if turn < n_blocks else ()) + \
                ((f"GEMM1 {turn - 1}",) if turn >= 1 else ())
        softmax: list[int | None] = [None, None]
        other = 1 - issuer
        last_turn = (index - 1) // 2  # the other warpgroup's turn in the previous slot
        if index >= 1 and last_turn < n_blocks:
            softmax[other] = last_turn
        slots.append(Slot(index, issuer, turn, gemms, (softmax[0], softmax[1])))
    return tuple(slots)


def check_pingpong(slots: tuple[Slot, ...]) -> None:
    """Raise AssertionError unless ``slots`` has the properties the kernel relies on:

    * turns alternate between the warpgroups, and each takes turns 0, 1, 2, ... in order;
    * a warpgroup's softmax of block j comes after the slot that issued its GEMM0 j (S_j is
      needed) and before the slot that issues its GEMM1 j (P_j is needed);
    * overlap: while a warpgroup runs a softmax, the tensor cores run the *other* warpgroup's
      GEMMs, never its own (so the MUFU and the tensor cores work at once);
    * every block gets both GEMMs and one softmax per warpgroup.
    """
    turns = {0: [], 1: []}
    issued: dict[tuple[int, str], int] = {}
    for slot in slots:
        turns[slot.issuer].append(slot.turn)
        for g in slot.gemms:
            issued[(slot.issuer, g)] = slot.index
    assert all(a.issuer != b.issuer for a, b in pairwise(slots)), "turns do not alternate"
    for wg, seq in turns.items():
        assert seq == list(range(len(seq))), f"WG {wg} takes its turns out of order: {seq}"
    n_blocks = len(turns[0]) - 1
    for wg in (0, 1):
        for j in range(n_blocks):
            for g in (f"GEMM0 {j}", f"GEMM1 {j}"):
                assert (wg, g) in issued, f"WG {wg} never issues {g}"
    for wg in (0, 1):
        done = [slot.index for slot in slots if slot.softmax[wg] is not None]
        blocks = [slots[i].softmax[wg] for i in done]
        assert blocks == list(range(n_blocks)), f"WG {wg} softmax blocks {blocks}"
        for i, j in zip(done, blocks, strict=True):
            assert issued[(wg, f"GEMM0 {j}")] < i, f"WG {wg}: softmax {j} before its S"
            assert i < issued[(wg, f"GEMM1 {j}")], f"WG {wg}: GEMM1 {j} before its softmax"
            assert slots[i].issuer != wg, f"WG {wg}: softmax {j} not overlapped"
            assert slots[i].gemms, f"WG {wg}: softmax {j} runs beside idle tensor cores"


__all__ += ["Slot", "check_pingpong", "pingpong_slots"]


# ------------------------------------------------------------- exponentials per clock, A100 -> H100

#: MUFU (special-function unit) results per clock per SM for ex2 and the other fp32 transcendentals,
#: compute capability 8.0 and 9.0 alike (CUDA C++ Programming Guide, throughput of native
#: arithmetic instructions).
MUFU_EX2_PER_CLOCK_PER_SM = 16
#: Dense fp16/bf16 tensor-core FLOPs per clock per SM: 4 tensor cores x 256 FMA on the A100
#: (A100 whitepaper), twice that per SM and clock on the H100 (H100 whitepaper).
TENSOR_FLOPS_PER_CLOCK_PER_SM = {"A100": 2048, "H100": 4096, "H200": 4096}


def _arch(gpu: GPU) -> str:
    for key in TENSOR_FLOPS_PER_CLOCK_PER_SM:
        if gpu.name.startswith(key):
            return key
    raise ValueError(f"no tensor-core rate per clock for {gpu.name!r}; known: "
                     f"{sorted(TENSOR_FLOPS_PER_CLOCK_PER_SM)}")


def clock_hz(gpu: GPU) -> float:
    """The clock at which ``gpu.matmul_flops`` (the vendor's dense peak) is quoted."""
    return gpu.matmul_flops / (gpu.sms * TENSOR_FLOPS_PER_CLOCK_PER_SM[_arch(gpu)])


def mufu_exp_rate(gpu: GPU) -> float:
    """Exponentials per second of the special-function units at that clock."""
    return MUFU_EX2_PER_CLOCK_PER_SM * gpu.sms * clock_hz(gpu)


def matmul_flops_per_exp(gpu: GPU) -> float:
    """Tensor-core FLOPs the GPU could do in the time of one exponential: clock-independent,
    the ratio of the two units' per-clock rates."""
    return TENSOR_FLOPS_PER_CLOCK_PER_SM[_arch(gpu)] / MUFU_EX2_PER_CLOCK_PER_SM


#: FlashAttention-3's FP8 numerical-error table (arXiv 2407.08608, RMSE against an fp64
#: reference): the baseline, FA3, and FA3 with each of its two techniques taken out.
PAPER_FP8_ABLATION = {"fp8 baseline": 2.4e-2, "fp8 FA3": 9.1e-3,
                      "fp8 FA3 without block quantisation": 9.3e-3,
                      "fp8 FA3 without incoherent processing": 2.4e-2}

__all__ += ["MUFU_EX2_PER_CLOCK_PER_SM", "PAPER_FP8_ABLATION", "TENSOR_FLOPS_PER_CLOCK_PER_SM",
            "clock_hz", "matmul_flops_per_exp", "mufu_exp_rate"]
