"""Which mechanism a CUDA GEMM lacks: the tuner's best dense 4096^3 kernel against hand-written
variants that each add one mechanism, and cuBLAS (PyTorch, TF32 off), timed interleaved with events.

All variants read tuner's operands (data [M][K] row-major, weight packed OI16o: [N/16][K][16]) and
write [M][N]; each is checked against cuBLAS's product. Block tile 128x128, K tile 8, 256 threads,
each thread 8x8 outputs as 2x2 tiles of 4x4 that lie 64 apart (the sketch's vthread x s3 shape):
  scalar     the A tile stored as read ([row][k]); registers loaded one float at a time (what
             tuner's space already holds)
  transposed the A tile stored transposed ([k][row]) and the thread's rows and columns loaded as
             float4 from shared
  prefetch   transposed, plus the next K tile read from global into registers while this one is
             computed, into a second shared buffer (one barrier per K tile)
and tuner's kernel itself with `__launch_bounds__(threads, B)`: at most 64K/(threads*B) registers a
thread, so that B blocks fit on an SM (tuner-lbB).

    python -m bench.gpu_gemm_probe [--size 4096] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from bench.common import write_results

KERNELS = r"""
#define BM 128
#define BN 128
#define BK 8
template <bool TRANSPOSED>
__device__ __forceinline__ void fill(const float* __restrict__ A, const float* __restrict__ W, float* As, float* Bs,
                                     int K, int bm, int bn, int k0, int tid) {
  int row = tid / 2, c4 = (tid % 2) * 4;
  float4 a = *(const float4*)&A[(size_t)(bm * BM + row) * K + k0 + c4];
  if (TRANSPOSED) { As[(c4 + 0) * BM + row] = a.x; As[(c4 + 1) * BM + row] = a.y;
                    As[(c4 + 2) * BM + row] = a.z; As[(c4 + 3) * BM + row] = a.w; }
  else *(float4*)&As[row * BK + c4] = a;
  int g = tid / 32, kk = (tid / 4) % 8, q = tid % 4;
  *(float4*)&Bs[kk * BN + g * 16 + q * 4] = *(const float4*)&W[(size_t)(bn * 8 + g) * K * 16 + (k0 + kk) * 16 + q * 4];
}

template <bool TRANSPOSED>
__device__ __forceinline__ void step(const float* As, const float* Bs, float acc[8][8], int ty, int tx) {
  #pragma unroll
  for (int kk = 0; kk < BK; ++kk) {
    float a[8], b[8];
    if (TRANSPOSED) {
      *(float4*)&a[0] = *(const float4*)&As[kk * BM + ty * 4];
      *(float4*)&a[4] = *(const float4*)&As[kk * BM + 64 + ty * 4];
    } else {
      #pragma unroll
      for (int i = 0; i < 4; ++i) { a[i] = As[(ty * 4 + i) * BK + kk]; a[4 + i] = As[(64 + ty * 4 + i) * BK + kk]; }
    }
    *(float4*)&b[0] = *(const float4*)&Bs[kk * BN + tx * 4];
    *(float4*)&b[4] = *(const float4*)&Bs[kk * BN + 64 + tx * 4];
    #pragma unroll
    for (int i = 0; i < 8; ++i)
      #pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] += a[i] * b[j];
  }
}

__device__ __forceinline__ void store(float* __restrict__ C, float acc[8][8], int N, int bm, int bn, int ty, int tx) {
  #pragma unroll
  for (int i = 0; i < 8; ++i) {
    int r = bm * BM + (i / 4) * 64 + ty * 4 + i % 4;
    *(float4*)&C[(size_t)r * N + bn * BN + tx * 4] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    *(float4*)&C[(size_t)r * N + bn * BN + 64 + tx * 4] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
  }
}

template <bool TRANSPOSED>
__device__ void plain(const float* __restrict__ A, const float* __restrict__ W, float* __restrict__ C, int K, int N) {
  __shared__ __align__(16) float As[BM * BK];
  __shared__ __align__(16) float Bs[BN * BK];
  int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, bn = blockIdx.x, bm = blockIdx.y;
  float acc[8][8] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    __syncthreads();
    fill<TRANSPOSED>(A, W, As, Bs, K, bm, bn, k0, tid);
    __syncthreads();
    step<TRANSPOSED>(As, Bs, acc, ty, tx);
  }
  store(C, acc, N, bm, bn, ty, tx);
}

extern "C" __global__ void __launch_bounds__(256) scalar(const float* __restrict__ A, const float* __restrict__ W,
                                                         float* __restrict__ C, int K, int N) {
  plain<false>(A, W, C, K, N);
}
extern "C" __global__ void __launch_bounds__(256) transposed(const float* __restrict__ A, const float* __restrict__ W,
                                                             float* __restrict__ C, int K, int N) {
  plain<true>(A, W, C, K, N);
}
extern "C" __global__ void __launch_bounds__(256) prefetch(const float* __restrict__ A, const float* __restrict__ W,
                                                           float* __restrict__ C, int K, int N) {
  __shared__ __align__(16) float As[2][BM * BK];
  __shared__ __align__(16) float Bs[2][BN * BK];
  int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, bn = blockIdx.x, bm = blockIdx.y;
  float acc[8][8] = {};
  fill<true>(A, W, As[0], Bs[0], K, bm, bn, 0, tid);
  __syncthreads();
  int row = tid / 2, c4 = (tid % 2) * 4, g = tid / 32, kk = (tid / 4) % 8, q = tid % 4;
  for (int k0 = 0, s = 0; k0 < K; k0 += BK, s ^= 1) {
    float4 a, b;
    bool more = k0 + BK < K;
    if (more) {
      a = *(const float4*)&A[(size_t)(bm * BM + row) * K + k0 + BK + c4];
      b = *(const float4*)&W[(size_t)(bn * 8 + g) * K * 16 + (k0 + BK + kk) * 16 + q * 4];
    }
    step<true>(As[s], Bs[s], acc, ty, tx);
    if (more) {
      As[s ^ 1][(c4 + 0) * BM + row] = a.x; As[s ^ 1][(c4 + 1) * BM + row] = a.y;
      As[s ^ 1][(c4 + 2) * BM + row] = a.z; As[s ^ 1][(c4 + 3) * BM + row] = a.w;
      *(float4*)&Bs[s ^ 1][kk * BN + g * 16 + q * 4] = b;
    }
    __syncthreads();
  }
  store(C, acc, N, bm, bn, ty, tx);
}
"""
VARIANTS = ("scalar", "transposed", "prefetch")
MIN_BLOCKS = (2, 3, 4)


def shipped_kernel(spec: str, target):
    """The shipped schedule of `spec` from any CUDA target's record (the probe's GPU need not be
    the one it was tuned on), built for `target`; else the default."""
    from tuner.build import CudaKernel
    from tuner.database import records
    from tuner.ops import resolve
    from tuner.task import Task

    task = Task(resolve(spec, "OI16o"), target)
    rec = next((r for r in records.load(records.shipped_database(target), warn=False).records
                if r.workload.key == task.workload.key), None)
    steps = rec.steps if rec else task.space.steps(task.space.default())
    return CudaKernel(task, steps, rec, "shipped" if rec else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv
    import pycuda.gpuarray as ga
    import torch

    from bench.gpu import gpu_name, peak_gflops, time_torch
    from tuner.codegen.cuda import PRELUDE
    from tuner.measure.cuda_worker import time_launches
    from tuner.target import parse_target
    from tuner.toolchain.nvcc import compile_cubin

    torch.backends.cuda.matmul.allow_tf32 = False
    n = args.size
    target = parse_target("cuda", 1)
    ours = shipped_kernel(f"dense:N={n},C={n},K={n}", target)
    print(f"tuner's kernel: {'the shipped record of ' + ours.record.target if ours.record else 'the default'}")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal((n, n), dtype=np.float32)                            # [out][in]
    packed = np.ascontiguousarray(w.reshape(n // 16, 16, n).transpose(0, 2, 1))  # OI16o
    ta, tw = torch.from_numpy(a).cuda(), torch.from_numpy(w).cuda()
    expect = (ta @ tw.T).cpu().numpy()
    ga_a, ga_w, ga_c = ga.to_gpu(a), ga.to_gpu(packed), ga.empty((n, n), np.float32)
    bound = f"__launch_bounds__({ours.launch.block})"
    assert bound in ours.source, "tuner's kernel declares no launch bounds"
    variants = [ours.source.replace(bound, f"__launch_bounds__({ours.launch.block}, {b})")
                .replace("tuner_kernel(", f"tuner_lb{b}(") for b in MIN_BLOCKS]
    path, err = compile_cubin(PRELUDE + KERNELS + "\n".join(variants), target)
    if err:
        raise SystemExit(f"nvcc: {err}")
    mod = drv.module_from_file(path)
    fns = {"tuner": lambda: ours._launch([ga_a, ga_w], ga_c)}
    for b in MIN_BLOCKS:
        f = mod.get_function(f"tuner_lb{b}")
        fns[f"tuner-lb{b}"] = (lambda f=f: f(ga_a.gpudata, ga_w.gpudata, ga_c.gpudata,
                                             block=(ours.launch.block, 1, 1), grid=(ours.launch.grid, 1)))
    for v in VARIANTS:
        f = mod.get_function(v)
        fns[v] = (lambda f=f: f(ga_a.gpudata, ga_w.gpudata, ga_c.gpudata, np.int32(n), np.int32(n),
                                block=(256, 1, 1), grid=(n // 128, n // 128)))
    rows = []
    for name, fn in fns.items():
        ga_c.fill(np.float32(np.nan))
        fn()
        drv.Context.synchronize()
        err = float(np.max(np.abs(ga_c.get() - expect)) / np.max(np.abs(expect)))
        rows.append({"kernel": name, "max_rel_error": err, "ms": []})
    cublas = lambda: ta @ tw.T          # noqa: E731
    torch_ms = []
    for _ in range(args.rounds):
        for r in rows:
            r["ms"].append(1e3 * statistics.median(time_launches(drv, fns[r["kernel"]], 3, 30.0)))
        torch_ms.append(1e3 * time_torch(cublas))
    peak, t = peak_gflops(), statistics.median(torch_ms)
    flops = 2 * n ** 3
    print(f"{gpu_name()}: dense {n}^3, cuBLAS {t:.3f} ms ({flops / t / 1e6:.0f} GFLOPS, {flops / t / 1e6 / peak:.0%} of peak)")
    print(f"{'kernel':<12}{'ms':>9}{'GFLOPS':>9}{'/ cuBLAS':>10}{'of peak':>9}{'rel err':>10}")
    for r in rows:
        m = statistics.median(r["ms"])
        r.update(median_ms=m, ratio_vs_cublas=t / m, fraction_of_peak=flops / m / 1e6 / peak)
        print(f"{r['kernel']:<12}{m:9.3f}{flops / m / 1e6:9.0f}{t / m:10.2f}{r['fraction_of_peak']:9.0%}{r['max_rel_error']:10.1e}")
    write_results("gpu-gemm-probe", args.out, {"machine": {"target": str(target), "gpu": gpu_name()}, "size": n,
                                               "cublas_ms": torch_ms, "peak_gflops": peak, "rows": rows})


if __name__ == "__main__":
    main()
