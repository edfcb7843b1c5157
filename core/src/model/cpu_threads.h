#pragma once
// Work split among the CPU's intra-op threads by hand (internal to streambp_core), for the
// small products of attention's tiles and of the projections: each thread runs its share
// with one-thread BLAS (OpenMP OpenBLAS runs one thread inside a parallel region), so the
// threads meet once per split instead of at every block inside every product.
// Included only by sources compiled with OpenMP (STREAMBP_OPENMP_SOURCES in core/CMakeLists.txt):
// at::parallel_for, which OnRanges instantiates here, runs serially where _OPENMP is not set.
#include <cstdint>

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/types.h>

namespace streambp {

/// The threads a hand split on `device` may use: at::get_num_threads() on the CPU outside a
/// parallel region in a build with OpenMP; 1 on a GPU, inside a parallel region, or without
/// OpenMP (-DSTREAMBP_OPENMP_ATTENTION=OFF, or none found). Callers then decide whether their
/// work shares well enough among that many.
int64_t CpuSplitThreads(const torch::Device& device);

/// f(i0, i1) over consecutive ranges of [0, n), one range per intra-op thread, each thread with
/// the caller's thread-local state (grad mode, profiling callbacks, so a profiler still counts
/// every product).
template <typename F>
void OnRanges(int64_t n, const F& f) {
  const at::ThreadLocalState state;
  at::parallel_for(0, n, 1, [&](int64_t i0, int64_t i1) {
    at::ThreadLocalStateGuard guard(state);
    f(i0, i1);
  });
}

}  // namespace streambp
