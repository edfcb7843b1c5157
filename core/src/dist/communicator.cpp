// c10d process group (Gloo) and the collectives data parallelism needs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#if !defined(STREAMBP_NO_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(STREAMBP_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include "streambp/dist.h"
#include "streambp/error.h"

namespace streambp {
namespace {

constexpr int64_t kBucketBytes = 32 << 20;

// The intrusive_ptr c10d hands out, owned by a shared_ptr (its reference given back when the
// last owner goes).
template <typename Group>
std::shared_ptr<CollectiveGroup> ShareGroup(c10::intrusive_ptr<Group> pg) {
  return std::shared_ptr<CollectiveGroup>(pg.release(), [](CollectiveGroup* p) {
    c10::intrusive_ptr<CollectiveGroup>::reclaim(p);
  });
}

// The job's store, shared by its groups (the reference c10d hands out given back with the last owner).
std::shared_ptr<c10d::Store> ShareStore(c10::intrusive_ptr<c10d::Store> store) {
  return std::shared_ptr<c10d::Store>(store.release(), [](c10d::Store* p) {
    c10::intrusive_ptr<c10d::Store>::reclaim(p);
  });
}

// The process group of rank o.rank of o.world_size over `store`: NCCL (one GPU per rank,
// cuda:LOCAL_RANK) or Gloo.
std::shared_ptr<CollectiveGroup> MakeGroup(const DistOptions& o, const c10::intrusive_ptr<c10d::Store>& store,
                                           std::chrono::milliseconds timeout) {
  if (o.backend == "nccl") {
#if defined(STREAMBP_WITH_NCCL)
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = timeout;
    try {
      return ShareGroup(c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world_size, nccl_options));
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kInternal, std::string("creating the NCCL process group failed: ") + e.what());
    }
#endif
  }
#if defined(STREAMBP_NO_GLOO)
  (void)store;
  (void)timeout;
  throw InvalidArgument("this build has no Gloo (built with -DSTREAMBP_WITH_GLOO=OFF, for a LibTorch without gloo "
                        "headers): data parallelism needs STREAMBP_DIST_BACKEND=nccl on CUDA devices");
#else
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // On one machine the ranks talk over loopback; across machines each binds to its own
  // hostname's address (Gloo's default device).
  const bool loopback = o.master_addr == "127.0.0.1" || o.master_addr == "localhost";
  options->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                      : c10d::ProcessGroupGloo::createDefaultDevice());
  options->threads = 2;
  try {
    return ShareGroup(c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, options));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, std::string("creating the Gloo process group failed: ") + e.what());
  }
#endif
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != 0) throw InvalidArgument(std::string("environment variable ") + name + "='" + v + "' is not an integer");
  return static_cast<int>(x);
}

}  // namespace

DistOptions DistOptions::FromEnv() {
  DistOptions o;
  o.world_size = EnvInt("WORLD_SIZE", 1);
  o.rank = EnvInt("RANK", 0);
  o.local_rank = EnvInt("LOCAL_RANK", o.rank);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) o.master_addr = a;
  o.master_port = EnvInt("MASTER_PORT", 29500);
  if (const char* t = std::getenv("STREAMBP_DIST_TIMEOUT"); t && *t) o.timeout_seconds = std::atof(t);
  o.zero_stage = EnvInt("STREAMBP_ZERO_STAGE", 0);
  if (const char* b = std::getenv("STREAMBP_DIST_BACKEND"); b && *b) o.backend = b;
  if (o.world_size < 1) throw InvalidArgument("WORLD_SIZE must be >= 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw InvalidArgument("RANK=" + std::to_string(o.rank) + " is outside [0, WORLD_SIZE=" + std::to_string(o.world_size) + ")");
  }
  if (o.master_port <= 0 || o.master_port > 65535) throw InvalidArgument("MASTER_PORT must be a port number");
  if (!(o.timeout_seconds > 0)) throw InvalidArgument("STREAMBP_DIST_TIMEOUT must be > 0 seconds");
  if (o.zero_stage < 0 || o.zero_stage > 2) throw InvalidArgument("STREAMBP_ZERO_STAGE must be 0, 1 or 2");
  if (!o.backend.empty() && o.backend != "gloo" && o.backend != "nccl") {
    throw InvalidArgument("STREAMBP_DIST_BACKEND='" + o.backend + "' is not a backend (gloo | nccl)");
  }
  return o;
}

torch::Device RankDevice(const std::string& device, const DistOptions& dist) {
  const torch::Device d(device);
  if (d.is_cuda() && !d.has_index() && dist.enabled()) {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dist.local_rank));
  }
  return d;
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(ErrorCode::kInternal, "FreeLoopbackPort: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error(ErrorCode::kInternal, "FreeLoopbackPort: no free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

std::shared_ptr<Communicator> Communicator::Create(const DistOptions& o) {
#if !defined(STREAMBP_WITH_NCCL)
  if (o.backend == "nccl") {  // refused before the rendezvous makes the peers wait
    throw InvalidArgument(
        "STREAMBP_DIST_BACKEND=nccl needs a CUDA build with NCCL (cmake -DSTREAMBP_WITH_CUDA=ON against a "
        "CUDA LibTorch); this build has Gloo only: unset it or use gloo");
  }
#endif
  if (!o.backend.empty() && o.backend != "gloo" && o.backend != "nccl") {
    throw InvalidArgument("unknown c10d backend '" + o.backend + "' (gloo | nccl)");
  }
  // A peer that dies closes its sockets; Gloo's next write to one would raise SIGPIPE, whose
  // default action ends this process before the collective can fail with its error (seen
  // under load in DataParallelFailure.ADeadPeerFailsTheCollectiveWithinTheTimeout). Ignored
  // process-wide, the write fails with EPIPE instead and the collective reports the peer.
  ::signal(SIGPIPE, SIG_IGN);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000));
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(o.master_port);
  store_options.isServer = o.rank == 0;
  store_options.numWorkers = o.world_size;
  store_options.waitWorkers = true;
  store_options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, "rendezvous at " + o.master_addr + ":" + std::to_string(o.master_port) +
                                          " failed (rank " + std::to_string(o.rank) + " of " +
                                          std::to_string(o.world_size) + ", waited " + std::to_string(o.timeout_seconds) +
                                          " s for every peer): " + e.what());
  }
  auto comm = std::shared_ptr<Communicator>(new Communicator(o, MakeGroup(o, store, timeout), "world"));
  comm->store_ = ShareStore(std::move(store));
  if (o.backend == "nccl") comm->device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(o.local_rank));
  return comm;
}

std::shared_ptr<Communicator> Communicator::subgroup(const std::string& name, const std::vector<int>& ranks,
                                                     int zero_stage) const {
  const auto me = std::find(ranks.begin(), ranks.end(), rank());
  if (me == ranks.end()) {
    throw InvalidArgument("subgroup '" + name + "': rank " + std::to_string(rank()) + " is not among its ranks");
  }
  for (int r : ranks) {
    if (r < 0 || r >= world_size() || std::count(ranks.begin(), ranks.end(), r) != 1) {
      throw InvalidArgument("subgroup '" + name + "': rank " + std::to_string(r) + " is outside the " +
                            std::to_string(world_size()) + " ranks or named twice");
    }
  }
  DistOptions o = options_;
  o.rank = static_cast<int>(me - ranks.begin());
  o.world_size = static_cast<int>(ranks.size());
  o.zero_stage = zero_stage;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000));
  // The members meet under the group's own prefix of the job's store, as torch.distributed's
  // new_group does; the other ranks take no part.
  auto base = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(store_.get());
  auto store = c10::make_intrusive<c10d::PrefixStore>(name + "/", base);
  auto comm = std::shared_ptr<Communicator>(new Communicator(o, MakeGroup(o, store, timeout), name));
  comm->store_ = store_;
  comm->device_ = device_;
  return comm;
}

ParallelGroups SplitParallelGroups(const std::shared_ptr<Communicator>& world, int context_parallel) {
  const int n = world ? world->world_size() : 1;
  if (context_parallel < 1 || n % context_parallel != 0) {
    throw InvalidArgument("context parallel " + std::to_string(context_parallel) + " does not divide the " +
                          std::to_string(n) + " ranks (WORLD_SIZE = data parallel x context parallel)");
  }
  ParallelGroups g;
  const int P = context_parallel, D = n / P;
  if (n <= 1) return g;
  if (P == 1) {
    g.data = world;
    return g;
  }
  if (D == 1) {
    g.context = world;
    return g;
  }
  const int d = world->rank() / P, c = world->rank() % P;
  std::vector<int> context, data;
  for (int i = 0; i < P; ++i) context.push_back(d * P + i);
  for (int i = 0; i < D; ++i) data.push_back(i * P + c);
  // Every rank makes its context group first, then its data group: the groups of one kind
  // all complete before any of the other kind waits.
  g.context = world->subgroup("context" + std::to_string(d), context, 0);
  // ZeRO shards the optimizer state (and with stage 2 the gradients) over the data group;
  // the ranks of a context group hold the same shard.
  g.data = world->subgroup("data" + std::to_string(c), data, world->options().zero_stage);
  return g;
}

Communicator::Communicator(const DistOptions& options, std::shared_ptr<CollectiveGroup> group, std::string name)
    : options_(options), name_(std::move(name)), group_(std::move(group)) {}

Communicator::~Communicator() = default;

void Communicator::fail(const std::string& what, const std::exception& e) const {
  const std::string where = name_ == "world" ? "" : " of group " + name_;
  throw Error(ErrorCode::kUnavailable, "collective " + what + " failed on rank " + std::to_string(options_.rank) + where +
                                        " (a peer died or timed out after " + std::to_string(options_.timeout_seconds) +
                                        " s): " + e.what());
}

void Communicator::count(const std::string& op, int64_t bytes, double seconds, int64_t calls) {
  stats_.bytes += bytes;
  stats_.seconds += seconds;
  stats_.calls += calls;
  auto& o = stats_.by_op[op];
  o.bytes += bytes;
  o.seconds += seconds;
  o.calls += calls;
}

void Communicator::wait(const std::string& what, const std::function<void()>& op, int64_t bytes) {
  const auto start = std::chrono::steady_clock::now();
  try {
    op();
  } catch (const std::exception& e) {
    fail(what, e);
  }
  count(what, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1);
}

namespace {

// Groups tensors of one dtype into flat buckets of at most kBucketBytes.
std::vector<std::vector<torch::Tensor>> Buckets(const std::vector<torch::Tensor>& tensors) {
  std::map<c10::ScalarType, std::vector<std::vector<torch::Tensor>>> by_dtype;
  std::map<c10::ScalarType, int64_t> fill;
  for (const auto& t : tensors) {
    auto& list = by_dtype[t.scalar_type()];
    const int64_t b = t.numel() * static_cast<int64_t>(t.element_size());
    if (list.empty() || fill[t.scalar_type()] + b > kBucketBytes) {
      list.emplace_back();
      fill[t.scalar_type()] = 0;
    }
    list.back().push_back(t);
    fill[t.scalar_type()] += b;
  }
  std::vector<std::vector<torch::Tensor>> out;
  for (auto& [dtype, lists] : by_dtype) {
    for (auto& l : lists) out.push_back(std::move(l));
  }
  return out;
}

torch::Tensor Flatten(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.contiguous().view(-1));
  return torch::cat(flat);
}

void Unflatten(const torch::Tensor& flat, const std::vector<torch::Tensor>& ts) {
  int64_t offset = 0;
  for (const auto& t : ts) {
    t.copy_(flat.slice(0, offset, offset + t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace

void Communicator::all_reduce_sum(const std::vector<torch::Tensor>& tensors) {
  if (world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (const auto& bucket : Buckets(tensors)) {
    auto flat = Flatten(bucket);
    std::vector<at::Tensor> io{flat};
    wait("all_reduce", [&] { group_->allreduce(io)->wait(); }, flat.numel() * flat.element_size());
    Unflatten(flat, bucket);
  }
}

void Communicator::reduce_sum(const std::vector<torch::Tensor>& tensors, int root) {
  if (world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (const auto& bucket : Buckets(tensors)) {
    auto flat = Flatten(bucket);
    std::vector<at::Tensor> io{flat};
    c10d::ReduceOptions ro;
    ro.rootRank = root;
    wait("reduce", [&] { group_->reduce(io, ro)->wait(); }, flat.numel() * flat.element_size());
    if (rank() == root) Unflatten(flat, bucket);
  }
}

void Communicator::broadcast(const std::vector<torch::Tensor>& tensors, int root) {
  if (world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (const auto& bucket : Buckets(tensors)) {
    auto flat = Flatten(bucket);
    std::vector<at::Tensor> io{flat};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    wait("broadcast", [&] { group_->broadcast(io, bo)->wait(); }, flat.numel() * flat.element_size());
    if (rank() != root) Unflatten(flat, bucket);
  }
}

torch::Tensor Communicator::all_to_all(const torch::Tensor& send, const std::vector<int64_t>& send_counts,
                                       const std::vector<int64_t>& recv_counts) {
  torch::NoGradGuard no_grad;
  const auto P = static_cast<size_t>(world_size());
  TORCH_CHECK(send.dim() == 1 && send_counts.size() == P && recv_counts.size() == P,
              "all_to_all: a 1-D tensor and one count per rank expected");
  int64_t sent = 0, received = 0;
  for (size_t j = 0; j < P; ++j) sent += send_counts[j], received += recv_counts[j];
  TORCH_CHECK(sent == send.numel(), "all_to_all: the send counts add up to ", sent, ", the tensor has ", send.numel());
  auto in = send.contiguous();
  auto out = torch::empty({received}, in.options());
  if (P == 1) return out.copy_(in);
  auto in_counts = send_counts;
  auto out_counts = recv_counts;
  wait("all_to_all", [&] { group_->alltoall_base(out, in, out_counts, in_counts)->wait(); },
       in.numel() * static_cast<int64_t>(in.element_size()));
  return out;
}

double Communicator::all_reduce_scalar(double value, bool max) {
  if (world_size() == 1) return value;
  auto t = torch::tensor({value}, torch::kFloat64).to(device_);
  std::vector<at::Tensor> io{t};
  c10d::AllreduceOptions ao;
  ao.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  wait("all_reduce_scalar", [&] { group_->allreduce(io, ao)->wait(); }, 8);
  return t.item<double>();
}

std::vector<double> Communicator::all_reduce_scalars(const std::vector<double>& values) {
  if (world_size() == 1 || values.empty()) return values;
  auto t = torch::tensor(values, torch::kFloat64).to(device_);
  std::vector<at::Tensor> io{t};
  wait("all_reduce_scalar", [&] { group_->allreduce(io)->wait(); }, t.numel() * 8);
  const auto host = t.cpu().contiguous();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

std::string Communicator::broadcast_bytes(const std::string& bytes, int root) {
  if (world_size() == 1) return bytes;
  auto len = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64).to(device_);
  std::vector<at::Tensor> io{len};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  wait("broadcast_bytes(length)", [&] { group_->broadcast(io, bo)->wait(); }, 8);
  const int64_t n = len.item<int64_t>();
  auto buf = torch::empty({std::max<int64_t>(n, 1)}, torch::kUInt8);
  if (rank() == root && n > 0) std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), n);
  std::vector<at::Tensor> data{buf.to(device_)};
  wait("broadcast_bytes", [&] { group_->broadcast(data, bo)->wait(); }, n);
  const auto host = data[0].cpu().contiguous();
  return std::string(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), n);
}

void Communicator::barrier() {
  if (world_size() == 1) return;
  wait("barrier", [&] { group_->barrier()->wait(); }, 0);
}

struct BucketedSum::Bucket {
  int root = -1;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<torch::Tensor> tensors;  // where the sums go back
  int64_t bytes = 0;
  torch::Tensor flat;
  c10::intrusive_ptr<c10d::Work> work;
};

BucketedSum::BucketedSum(Communicator& comm, int64_t bucket_bytes)
    : comm_(comm), bucket_bytes_(std::max<int64_t>(bucket_bytes, 1)) {}

BucketedSum::~BucketedSum() = default;

void BucketedSum::add(const torch::Tensor& tensor, int root) {
  if (comm_.world_size() == 1) return;
  TORCH_CHECK(root < comm_.world_size(), "BucketedSum: root ", root, " outside the ", comm_.world_size(), " ranks");
  const int r = root < 0 ? -1 : root;
  Bucket* bucket = nullptr;
  for (auto& b : open_) {
    if (b->root == r && b->dtype == tensor.scalar_type()) bucket = b.get();
  }
  if (bucket == nullptr) {
    open_.push_back(std::make_unique<Bucket>());
    bucket = open_.back().get();
    bucket->root = r;
    bucket->dtype = tensor.scalar_type();
  }
  bucket->tensors.push_back(tensor);
  bucket->bytes += tensor.numel() * static_cast<int64_t>(tensor.element_size());
  if (bucket->bytes >= bucket_bytes_) {
    for (auto it = open_.begin(); it != open_.end(); ++it) {
      if (it->get() == bucket) {
        auto owned = std::move(*it);
        open_.erase(it);
        launch(*owned);
        inflight_.push_back(std::move(owned));
        break;
      }
    }
  }
}

void BucketedSum::launch(Bucket& b) {
  torch::NoGradGuard no_grad;
  b.flat = Flatten(b.tensors);
  std::vector<at::Tensor> io{b.flat};
  const int64_t bytes = b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
  const std::string what = b.root < 0 ? "all_reduce" : "reduce";
  try {
    if (b.root < 0) {
      b.work = comm_.group_->allreduce(io);
    } else {
      c10d::ReduceOptions ro;
      ro.rootRank = b.root;
      b.work = comm_.group_->reduce(io, ro);
    }
  } catch (const std::exception& e) {
    comm_.fail(what, e);
  }
  comm_.count(what, bytes, 0.0, 1);
  launched_ += 1;
  bytes_launched_ += bytes;
}

void BucketedSum::flush() {
  // Launched in the order the buckets were opened: the same on every rank.
  for (auto& b : open_) {
    launch(*b);
    inflight_.push_back(std::move(b));
  }
  open_.clear();
}

void BucketedSum::finish() {
  flush();
  torch::NoGradGuard no_grad;
  for (auto& b : inflight_) {
    const std::string what = b->root < 0 ? "all_reduce" : "reduce";
    const auto start = std::chrono::steady_clock::now();
    try {
      b->work->wait();
    } catch (const std::exception& e) {
      comm_.fail(what, e);
    }
    comm_.count(what, 0, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0);
    if (b->root < 0 || b->root == comm_.rank()) Unflatten(b->flat, b->tensors);
    b.reset();  // frees the flat copy at once
  }
  inflight_.clear();
}

}  // namespace streambp
