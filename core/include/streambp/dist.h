#pragma once
/// Data parallelism over PyTorch's own distributed engine, c10d (DESIGN §1 dist): Gloo on
/// the CPU (NCCL in CUDA builds). Launch like the rest of the PyTorch world: RANK,
/// WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK picks the GPU). Rank 0 hosts the
/// TCPStore rendezvous; a peer that never arrives is an error after the timeout.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace c10d {
class ProcessGroup;
}

namespace streambp {

struct DistOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_seconds = 60;  ///< rendezvous and every collective; a dead peer fails within it
  int zero_stage = 0;           ///< 0: replicated optimizer; 1: sharded state; 2: + sharded gradients

  /// From RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, STREAMBP_DIST_TIMEOUT and
  /// STREAMBP_ZERO_STAGE (unset = one process). Throws InvalidArgument for bad values.
  static DistOptions FromEnv();
  bool enabled() const { return world_size > 1; }
};

/// Bytes and seconds spent in collectives since creation (for the benchmark).
struct CommStats {
  int64_t bytes = 0;
  double seconds = 0;
  int64_t calls = 0;
};

/// Collectives of one process group. Not thread-safe: the device-owner thread uses it.
/// Every method is a collective: all ranks call it in the same order. A collective that
/// does not complete within the timeout (a dead peer) throws Error(kInternal) naming it.
class Communicator {
 public:
  /// Rendezvous and the process group (Gloo). Throws Error(kInternal) with a clear
  /// message when the peers do not all arrive within the timeout.
  static std::shared_ptr<Communicator> Create(const DistOptions& options);
  ~Communicator();

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const DistOptions& options() const { return options_; }

  /// Sums each tensor over the ranks, in place, flattened into buckets per dtype.
  void all_reduce_sum(const std::vector<torch::Tensor>& tensors);
  /// Sums into `root` only (the others' tensors are left undefined in content).
  void reduce_sum(const std::vector<torch::Tensor>& tensors, int root);
  /// Copies root's tensors into everyone's, in place.
  void broadcast(const std::vector<torch::Tensor>& tensors, int root);
  double all_reduce_scalar(double value, bool max = false);
  /// Root's bytes to every rank (length first, then the payload).
  std::string broadcast_bytes(const std::string& bytes, int root);
  void barrier();

  const CommStats& stats() const { return stats_; }

 private:
  Communicator(const DistOptions& options, std::shared_ptr<c10d::ProcessGroup> group);
  void wait(const std::string& what, const std::function<void()>& op, int64_t bytes);

  DistOptions options_;
  std::shared_ptr<c10d::ProcessGroup> group_;
  CommStats stats_;
};

}  // namespace streambp
