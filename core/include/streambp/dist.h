#pragma once
/// Data parallelism over PyTorch's own distributed engine, c10d (docs/architecture.md: Layers dist): Gloo on
/// the CPU (NCCL in CUDA builds). Launch like the rest of the PyTorch world: RANK,
/// WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK picks the GPU). Rank 0 hosts the
/// TCPStore rendezvous; a peer that never arrives is an error after the timeout.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>
#include <torch/version.h>

// The object that runs the collectives: c10d::ProcessGroup up to LibTorch 1.13; from 2.0 on
// ProcessGroupGloo / ProcessGroupNCCL derive from c10d::Backend (the ProcessGroup wraps them).
namespace c10d {
class Store;
#if TORCH_VERSION_MAJOR >= 2
class Backend;
#else
class ProcessGroup;
#endif
}  // namespace c10d

namespace streambp {
#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif
}  // namespace streambp

namespace streambp {

struct DistOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_seconds = 60;  ///< rendezvous and every collective; a dead peer fails within it
  int zero_stage = 0;           ///< 0: replicated optimizer; 1: sharded state; 2: + sharded gradients
  /// "gloo" (CPU tensors), "nccl" (CUDA builds: tensors on cuda:local_rank), or "" = gloo;
  /// the server picks nccl for a cuda device when STREAMBP_DIST_BACKEND is unset.
  std::string backend;

  /// From RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, STREAMBP_DIST_TIMEOUT,
  /// STREAMBP_ZERO_STAGE and STREAMBP_DIST_BACKEND (unset = one process). Throws
  /// InvalidArgument for bad values.
  static DistOptions FromEnv();
  bool enabled() const { return world_size > 1; }
};

/// The device of this rank: "cuda" (no index) in a data-parallel run means cuda:LOCAL_RANK,
/// one GPU per rank as torchrun lays them out; anything else is taken as written.
torch::Device RankDevice(const std::string& device, const DistOptions& dist);

/// A TCP port on 127.0.0.1 that was free a moment ago (MASTER_PORT of a job on one machine).
int FreeLoopbackPort();

/// Collectives since creation (for the benchmark). `bytes` is the payload of each
/// collective (what one rank contributes; a ring all-reduce of B bytes sends 2(N-1)/N x B
/// per rank on the wire). `seconds` is time this thread spent waiting: the whole call for
/// the blocking methods, only the wait in finish() for buckets launched asynchronously.
struct CommStats {
  struct Op {
    int64_t bytes = 0;
    double seconds = 0;
    int64_t calls = 0;
  };
  int64_t bytes = 0;
  double seconds = 0;
  int64_t calls = 0;
  std::map<std::string, Op> by_op;  ///< per collective: all_reduce, reduce, broadcast, ...
};

class Communicator;

/// A sum over the ranks started bucket by bucket while the values are still being
/// produced (a backward's gradients, layer by layer) and finished once: communication
/// overlaps with the computation that follows each add().
///
/// add() puts a tensor whose value is final (it must not change until finish()) into the
/// open bucket of its (root, dtype); a bucket holding at least `bucket_bytes` is flattened
/// into one buffer and launched at once as an asynchronous c10d collective (root < 0: all-reduce, every rank gets the sum; root >= 0: reduce to
/// root). flush() launches the partly filled buckets; finish() waits for every launched
/// bucket and writes the sums back into the added tensors (for a reduce, on root only).
/// Every rank must add the same shapes and dtypes with the same roots in the same order:
/// the buckets, hence the order of the collectives, are then the same on every rank.
/// Not thread-safe; the Communicator must outlive it. Destroying it unfinished abandons
/// the buckets in flight (the peers' matching collectives then fail with the timeout).
class BucketedSum {
 public:
  BucketedSum(Communicator& comm, int64_t bucket_bytes);
  ~BucketedSum();
  BucketedSum(const BucketedSum&) = delete;
  BucketedSum& operator=(const BucketedSum&) = delete;

  void add(const torch::Tensor& tensor, int root = -1);
  void flush();
  /// flush(), then waits for every bucket (time counted in the communicator's stats) and
  /// copies the sums back. Throws like the blocking collectives when a peer fails.
  void finish();
  int64_t buckets_launched() const { return launched_; }
  int64_t bytes_launched() const { return bytes_launched_; }

 private:
  struct Bucket;
  void launch(Bucket& bucket);

  Communicator& comm_;
  int64_t bucket_bytes_;
  std::vector<std::unique_ptr<Bucket>> open_;      // one per (root, dtype) being filled
  std::vector<std::unique_ptr<Bucket>> inflight_;  // launched, in launch order
  int64_t launched_ = 0;
  int64_t bytes_launched_ = 0;
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

  /// A group of the ranks `ranks` of this one (this rank among them; none twice), named
  /// `name` (its key prefix in the job's store, and in its errors): only its members call it,
  /// each with the same name and ranks, and it returns once they have all arrived. Its
  /// ranks are the positions in `ranks`; its options are this one's but for rank, size and
  /// `zero_stage`. InvalidArgument for ranks that are not a group of this one.
  std::shared_ptr<Communicator> subgroup(const std::string& name, const std::vector<int>& ranks, int zero_stage) const;
  /// "world" for the job's own group, else the subgroup's name.
  const std::string& name() const { return name_; }

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const DistOptions& options() const { return options_; }
  /// Where the staging tensors of scalar and byte collectives live: the CPU for Gloo,
  /// cuda:local_rank for NCCL (which only moves device memory).
  const torch::Device& device() const { return device_; }

  /// Sums each tensor over the ranks, in place, flattened into buckets per dtype.
  void all_reduce_sum(const std::vector<torch::Tensor>& tensors);
  /// Sums into `root` only (the others' tensors are left undefined in content).
  void reduce_sum(const std::vector<torch::Tensor>& tensors, int root);
  /// Copies root's tensors into everyone's, in place.
  void broadcast(const std::vector<torch::Tensor>& tensors, int root);
  /// All-to-all of unequal parts: `send` (1-D, contiguous) is cut into world_size() parts of
  /// `send_counts` elements in rank order, part j going to rank j; returns what every rank
  /// sent this one, 1-D, in rank order (`recv_counts` elements from each). Every rank's
  /// send_counts[j] must be rank j's recv_counts of it. Parts may be empty.
  torch::Tensor all_to_all(const torch::Tensor& send, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts);
  double all_reduce_scalar(double value, bool max = false);
  /// Sums each value over the ranks, all in one collective (float64).
  std::vector<double> all_reduce_scalars(const std::vector<double>& values);
  /// Root's bytes to every rank (length first, then the payload).
  std::string broadcast_bytes(const std::string& bytes, int root);
  void barrier();

  const CommStats& stats() const { return stats_; }

 private:
  friend class BucketedSum;
  Communicator(const DistOptions& options, std::shared_ptr<CollectiveGroup> group, std::string name);
  void wait(const std::string& what, const std::function<void()>& op, int64_t bytes);
  void count(const std::string& op, int64_t bytes, double seconds, int64_t calls);
  [[noreturn]] void fail(const std::string& what, const std::exception& e) const;

  DistOptions options_;
  std::string name_;
  torch::Device device_{torch::kCPU};
  std::shared_ptr<c10d::Store> store_;  // the job's rendezvous, shared with its subgroups
  std::shared_ptr<CollectiveGroup> group_;
  CommStats stats_;
};

/// The groups of a job of WORLD_SIZE = D x P ranks, D data parallel and P context parallel
/// (docs/architecture.md: Context parallel), laid out as rank = d x P + c: `context` holds
/// the P ranks d x P .. d x P + P - 1, which split the positions of the same sequences;
/// `data` the D ranks c, P + c, .., which compute different sequences. A kind with one rank
/// is null; a kind with every rank is `world` itself. Every rank calls it (it makes the
/// subgroups: the context groups first, then the data groups). The data group keeps the
/// world's ZeRO stage (the state sharded over the data ranks; a context group's ranks hold
/// the same shard), the context group has none. InvalidArgument when P does not divide the
/// world.
struct ParallelGroups {
  std::shared_ptr<Communicator> data;
  std::shared_ptr<Communicator> context;
};
ParallelGroups SplitParallelGroups(const std::shared_ptr<Communicator>& world, int context_parallel);

}  // namespace streambp
