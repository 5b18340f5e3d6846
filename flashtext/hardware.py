"""The GPUs the book talks about, with the numbers from the papers and vendor sheets.

Sources: FA1 Fig. 1 (A100 hierarchy), FA2 (A100 matmul vs non-matmul throughput), FA3 (H100 SXM5),
and our own H200 measurements (2026-11-29). Bandwidths in bytes/s, throughputs in FLOP/s,
sizes in bytes. ``measured_*`` fields are what we measured, vendor numbers are peaks.

On-chip memory, one convention. Each SM has one unified block of SRAM that serves as L1 cache and
as shared memory; a kernel chooses how much of it is shared memory, up to a maximum. The CUDA C++
Programming Guide (compute capabilities 8.0 and 9.0) gives both numbers:

* ``smem_per_sm`` is the **shared-memory maximum per SM**, what a kernel's tiles can use and the
  M of FlashAttention's Algorithm 1: 164 KB on the A100 (flash-attention #67: "163 KB per SM on
  A100", the 163 KB a single block may take), 228 KB on the H100 and H200 (the H200 driver
  reports ``shared_memory_per_multiprocessor`` = 233,472 bytes = 228 KB, chapter 1 checks it).
* ``l1_smem_per_sm`` is the **unified L1 + shared memory per SM**: 192 KB on the A100, 256 KB on
  the H100 and H200. The memory hierarchy counts this, the whole on-chip SRAM: FA1's Figure 1
  "20 MB" of A100 SRAM is 192 KB x 108 SMs.
"""

from __future__ import annotations

from dataclasses import dataclass

KB, MB, GB = 1024, 1024**2, 1e9
TB = 1e12


@dataclass(frozen=True)
class GPU:
    name: str
    sms: int
    hbm_bytes: float
    hbm_bandwidth: float  # vendor peak, B/s
    smem_per_sm: int  # shared-memory maximum per SM (what a kernel can allocate), bytes
    l1_smem_per_sm: int  # unified L1 + shared memory per SM (the whole on-chip SRAM), bytes
    smem_bandwidth: float  # aggregate on-chip SRAM bandwidth, B/s
    l2_bytes: float
    l2_bandwidth: float | None
    registers_per_sm: int  # bytes
    matmul_flops: float  # dense fp16/bf16 tensor-core peak, FLOP/s
    fp32_flops: float  # non-tensor-core fp32 peak, FLOP/s
    exp_flops: float | None  # special-function unit (MUFU) exponentials per second
    host_bandwidth: float  # CPU <-> GPU link, B/s
    measured_copy_bandwidth: float | None = None  # device-to-device copy, read+write, B/s
    measured_matmul_flops: tuple[float, float] | None = None  # (low, high) bf16 8192^3
    host_memory_bytes: float | None = None  # CPU DRAM of the machine, where a source gives it

    @property
    def sram_total(self) -> float:
        """The chip's on-chip SRAM (L1 + shared memory of every SM), bytes."""
        return self.l1_smem_per_sm * self.sms

    def ridge_point(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound (peak FLOP/s / bandwidth)."""
        return self.matmul_flops / self.hbm_bandwidth


A100 = GPU(
    name="A100 40GB SXM4", sms=108, hbm_bytes=40 * GB, hbm_bandwidth=1.5 * TB,
    smem_per_sm=164 * KB, l1_smem_per_sm=192 * KB, smem_bandwidth=19 * TB, l2_bytes=40 * MB,
    l2_bandwidth=None,
    registers_per_sm=256 * KB, matmul_flops=312 * TB, fp32_flops=19.5 * TB, exp_flops=None,
    host_bandwidth=12.8 * GB, host_memory_bytes=1e12,  # FA1 Fig. 1: CPU DRAM "> 1 TB"
)
H100 = GPU(
    name="H100 SXM5", sms=132, hbm_bytes=80 * GB, hbm_bandwidth=3.35 * TB,
    smem_per_sm=228 * KB, l1_smem_per_sm=256 * KB, smem_bandwidth=31 * TB, l2_bytes=50 * MB,
    l2_bandwidth=12 * TB,
    registers_per_sm=256 * KB, matmul_flops=989 * TB, fp32_flops=67 * TB, exp_flops=3.9 * TB,
    host_bandwidth=64 * GB,
)
H200 = GPU(
    name="H200 SXM", sms=132, hbm_bytes=141 * GB, hbm_bandwidth=4.8 * TB,
    # L2: the driver of our H200 reports 60 MiB (L2_cache_size = 62914560 in the recording of
    # scripts/record_memory_wall.py; chapter 1 checks it), where the H100 SXM5 has 50 MB.
    smem_per_sm=228 * KB, l1_smem_per_sm=256 * KB, smem_bandwidth=31 * TB, l2_bytes=60 * MB,
    l2_bandwidth=12 * TB,
    registers_per_sm=256 * KB, matmul_flops=989 * TB, fp32_flops=67 * TB, exp_flops=3.9 * TB,
    host_bandwidth=64 * GB, measured_copy_bandwidth=4.25 * TB,
    measured_matmul_flops=(690 * TB, 790 * TB),
)

GPUS: dict[str, GPU] = {"A100": A100, "H100": H100, "H200": H200}


@dataclass(frozen=True)
class Level:
    """One level of the memory hierarchy of a GPU (sizes for the whole chip, bytes and B/s).

    ``None`` means no source we cite gives the number; the book never makes one up.
    """

    name: str
    size: float | None
    bandwidth: float | None
    note: str = ""


LEVELS = ("registers", "shared memory / L1", "L2 cache", "HBM", "host memory")


def hierarchy(gpu: GPU) -> list[Level]:
    """Registers -> shared memory/L1 -> L2 -> HBM -> host memory, fastest and smallest first."""
    return [
        Level("registers", gpu.registers_per_sm * gpu.sms, None,
              f"{gpu.registers_per_sm // KB} KB per SM x {gpu.sms} SMs; read every cycle by the "
              "cores, bandwidth not quoted"),
        Level("shared memory / L1", gpu.sram_total, gpu.smem_bandwidth,
              f"{gpu.l1_smem_per_sm // KB} KB of L1 + shared memory per SM (at most "
              f"{gpu.smem_per_sm // KB} KB of it shared) x {gpu.sms} SMs (on-chip SRAM)"),
        Level("L2 cache", gpu.l2_bytes, gpu.l2_bandwidth, "shared by all SMs"),
        Level("HBM", gpu.hbm_bytes, gpu.hbm_bandwidth, "the GPU's main memory (vendor peak)"),
        Level("host memory", gpu.host_memory_bytes, gpu.host_bandwidth,
              "CPU DRAM, reached over the host link"),
    ]


def ridge_points(gpu: GPU) -> dict[str, float]:
    """FLOPs per HBM byte where each roof meets the bandwidth slope: tensor-core matmul, and
    non-matmul fp32 (the ALUs that run softmax)."""
    return {"matmul": gpu.matmul_flops / gpu.hbm_bandwidth,
            "fp32 (non-matmul)": gpu.fp32_flops / gpu.hbm_bandwidth}
