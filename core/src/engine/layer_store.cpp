// The stored layer inputs on the device or in a second tier (issue 17).
//  - OnDevice: a vector of tensors.
//  - ScratchFile (CPU): one file per step, unlinked as soon as it is created (nothing is
//    left behind by a crash), its space reserved up front (a full disk fails the step
//    before it computes anything), written and read with pwrite/pread by one background
//    thread in submission order: layer l is written while layer l+1 computes, and the next
//    chunk is read while the current one is in use. Its pages live in the page cache (the
//    kernel may write them out), not in the process's resident memory.
//  - PinnedHost (CUDA builds, CUDA tensors): page-locked host buffers of exactly one layer
//    input each, pinned as the forward reaches them and kept for the next step of the same
//    length (memory::HostBufferCache), copies on a side stream ordered with the compute
//    stream by events.
#include "layer_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <torch/torch.h>

#if defined(STREAMBP_WITH_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <fstream>
#endif

#include "streambp/error.h"
#include "streambp/memory.h"

namespace streambp::engine {
namespace {

class DeviceStore final : public LayerStore {
 public:
  explicit DeviceStore(int64_t slots) : slots_(static_cast<size_t>(slots)) {}
  void put(int64_t i, torch::Tensor x) override { slots_.at(static_cast<size_t>(i)) = std::move(x); }
  torch::Tensor read(int64_t i, int64_t s, int64_t e) override {
    return slots_.at(static_cast<size_t>(i)).slice(1, s, e);
  }
  void prefetch(int64_t, int64_t, int64_t) override {}
  void drop(int64_t i) override { slots_.at(static_cast<size_t>(i)) = torch::Tensor(); }
  int64_t offloaded_bytes() const override { return 0; }
  bool on_device() const override { return true; }

 private:
  std::vector<torch::Tensor> slots_;
};

std::string ScratchFolder(const std::string& dir) {
  if (!dir.empty()) return dir;
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

// The error of a failed scratch-file operation, with the folder and the reason; a full disk
// (or quota) is "too large" (ResourceExhausted), a folder that cannot hold a file a
// configuration problem (FailedPrecondition), anything else internal.
[[noreturn]] void ThrowScratchError(const std::string& what, const std::string& dir, int err, int64_t bytes) {
  const std::string message = "offloaded layer inputs: " + what + " of the scratch file in '" + dir + "' (" +
                              std::to_string(bytes) + " bytes) failed: " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    throw ResourceExhausted(message + " (the scratch folder is full; free space there, point "
                                      "scratch_dir elsewhere, or use shorter sequences)");
  }
  if (err == EACCES || err == EPERM || err == ENOENT || err == ENOTDIR || err == EROFS) {
    throw FailedPrecondition(message + " (scratch_dir must be a writable folder)");
  }
  throw Error(ErrorCode::kInternal, message);
}

class ScratchFileStore final : public LayerStore {
 public:
  ScratchFileStore(const std::string& dir, int64_t slots, const torch::Tensor& like)
      : dir_(ScratchFolder(dir)),
        B_(like.size(0)),
        T_(like.size(1)),
        d_(like.size(2)),
        elem_(static_cast<int64_t>(like.element_size())),
        options_(like.options()) {
    slot_bytes_ = B_ * T_ * d_ * elem_;
    const int64_t total = slots * slot_bytes_;
    std::string path = dir_ + "/streambp-layers-XXXXXX";
    fd_ = ::mkstemp(path.data());
    if (fd_ < 0) ThrowScratchError("creating", dir_, errno, total);
    ::unlink(path.c_str());
    // Reserve the space now: a full disk fails here, not halfway through the forward (a
    // file system without fallocate reports a full disk at the first write instead).
    if (total > 0 && ::fallocate(fd_, 0, 0, total) != 0 && errno != EOPNOTSUPP) {
      const int err = errno;
      ::close(fd_);
      ThrowScratchError("reserving", dir_, err, total);
    }
    reserved_ = total;
    thread_ = std::thread([this] { Work(); });
  }

  ~ScratchFileStore() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    ::close(fd_);
  }

  void put(int64_t i, torch::Tensor x) override {
    Wait(last_write_);
    x = x.contiguous();
    // The job lives on in the future's shared state: it lets go of x once written.
    last_write_ = Submit([this, i, x]() mutable {
      const char* p = static_cast<const char*>(x.data_ptr());
      for (int64_t b = 0; b < B_; ++b) Write(Offset(i, b, 0), p + b * T_ * d_ * elem_, T_ * d_ * elem_);
      x = torch::Tensor();
    });
  }

  torch::Tensor read(int64_t i, int64_t s, int64_t e) override {
    if (pending_ && !(pending_->i == i && pending_->s == s && pending_->e == e)) {
      Wait(pending_->done);  // an announced read that did not come: finish it, drop it
      pending_.reset();
    }
    if (!pending_) prefetch(i, s, e);
    auto p = std::move(*pending_);
    pending_.reset();
    Wait(p.done);
    return p.out;
  }

  void prefetch(int64_t i, int64_t s, int64_t e) override {
    if (pending_) return;  // one read ahead at a time
    auto out = torch::empty({B_, e - s, d_}, options_);
    auto done = Submit([this, i, s, e, out] {
      char* p = static_cast<char*>(out.data_ptr());
      const int64_t row = (e - s) * d_ * elem_;
      for (int64_t b = 0; b < B_; ++b) Read(Offset(i, b, s), p + b * row, row);
    });
    pending_ = Pending{i, s, e, out, std::move(done)};
  }

  void drop(int64_t) override {}
  int64_t offloaded_bytes() const override { return reserved_; }
  bool on_device() const override { return false; }

 private:
  struct Pending {
    int64_t i, s, e;
    torch::Tensor out;
    std::future<void> done;
  };

  int64_t Offset(int64_t slot, int64_t b, int64_t t) const {
    return slot * slot_bytes_ + (b * T_ + t) * d_ * elem_;
  }

  void Write(int64_t offset, const char* p, int64_t n) {
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, static_cast<size_t>(n), offset);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) ThrowScratchError("writing", dir_, w < 0 ? errno : ENOSPC, n);
      p += w;
      offset += w;
      n -= w;
    }
  }

  void Read(int64_t offset, char* p, int64_t n) {
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, static_cast<size_t>(n), offset);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) ThrowScratchError("reading", dir_, r < 0 ? errno : EIO, n);
      p += r;
      offset += r;
      n -= r;
    }
  }

  std::future<void> Submit(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    auto future = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_one();
    return future;
  }

  static void Wait(std::future<void>& f) {
    if (f.valid()) f.get();  // rethrows the job's error
  }

  void Work() {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping with nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();  // exceptions land in the job's future
    }
  }

  std::string dir_;
  int64_t B_, T_, d_, elem_, slot_bytes_ = 0, reserved_ = 0;
  torch::TensorOptions options_;
  int fd_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stop_ = false;
  std::future<void> last_write_;
  std::optional<Pending> pending_;
};

#if defined(STREAMBP_WITH_CUDA)
// The room left under this process's cgroup (v2) memory limit, memory.max - memory.current
// (a container's limit, which MemAvailable does not show); -1 without a limit or cgroup v2.
int64_t CgroupHeadroomBytes() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return -1;
  const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
  auto read = [&](const char* name) -> int64_t {
    std::ifstream f(dir + "/" + name);
    std::string value;
    if (!(f >> value) || value == "max") return -1;
    char* end = nullptr;
    const long long n = std::strtoll(value.c_str(), &end, 10);
    return end != nullptr && *end == '\0' && n >= 0 ? static_cast<int64_t>(n) : -1;
  };
  const int64_t limit = read("memory.max"), used = read("memory.current");
  if (limit < 0 || used < 0) return -1;
  return std::max<int64_t>(0, limit - used);
}

// What the kernel could give this process now: MemAvailable in /proc/meminfo, less where the
// cgroup's limit leaves less; -1 if neither is known.
int64_t HostAvailableBytes() {
  int64_t available = -1;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  const int64_t headroom = CgroupHeadroomBytes();
  if (headroom >= 0 && (available < 0 || headroom < available)) available = headroom;
  return available;
}

std::string GiB(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

// The pinned buffers of the offload tier, kept from one step to the next when the next has
// the same length (page-locking costs the kernel about a second per GiB); a step of another
// length frees them before it checks the host's memory. STREAMBP_PINNED_CACHE=0 frees them
// with every step. Never destroyed: at exit the CUDA runtime may be gone before it.
memory::HostBufferCache& PinnedBuffers() {
  static auto* cache = new memory::HostBufferCache(
      [](int64_t bytes) -> void* {
        void* p = nullptr;
        if (cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault) != cudaSuccess) {
          (void)cudaGetLastError();  // not a sticky error: clear it for the next CUDA call
          return nullptr;
        }
        return p;
      },
      [](void* p) { (void)cudaFreeHost(p); },
      [] {
        const char* v = std::getenv("STREAMBP_PINNED_CACHE");
        return v == nullptr || std::string(v) != "0";
      }());
  return *cache;
}

// Pinned host buffers; device -> host copies on a side stream after the compute stream
// has produced the tensor, host -> device copies there too, and the compute stream waits
// for a read's event only when it uses the rows. Each slot is pinned with cudaHostAlloc at
// its size when the forward first puts it (the pinning overlaps the GPU's work on the layers
// already queued), or taken from the buffers the last step of this length left; given back
// with the store. LibTorch's pinned allocator would round each buffer up to a power of two
// (a 2.1 GiB layer input takes 4 GiB) and keep it for the process whatever the next step's
// length, so a longer step later could not pin its own.
class PinnedHostStore final : public LayerStore {
 public:
  PinnedHostStore(int64_t slots, const torch::Tensor& like)
      : side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, like.device().index())),
        host_(static_cast<size_t>(slots)),
        pinned_(static_cast<size_t>(slots), nullptr),
        written_(static_cast<size_t>(slots)),
        shape_(like.sizes().vec()),
        options_(like.options()),
        slot_bytes_(like.numel() * static_cast<int64_t>(like.element_size())) {
    bytes_ = slots * slot_bytes_;
    // The whole step's pinned memory must be there before the forward starts: fail now, with
    // the numbers, rather than halfway or in the kernel's OOM killer. Buffers kept from a
    // step of another length are freed first; those of this length count as there.
    const int64_t kept = std::min(PinnedBuffers().Prepare(slot_bytes_), bytes_);
    const int64_t available = HostAvailableBytes();
    if (available >= 0 && bytes_ - kept > available - kHostReserve) {
      throw ResourceExhausted("offloaded layer inputs: " + std::to_string(slots) + " layer inputs of " + GiB(slot_bytes_) +
                              " need " + GiB(bytes_) + " of pinned host memory and the host (under its cgroup limit) has " +
                              GiB(available) + " available (" + GiB(kHostReserve) +
                              " kept for the process); use shorter sequences, fewer rows per "
                              "step, or a host with more memory");
    }
  }

  ~PinnedHostStore() override {
    // No copy may still read or write a buffer when it is freed.
    try {
      side_.synchronize();
    } catch (...) {
    }
    host_.clear();
    for (void* p : pinned_) PinnedBuffers().Give(p, slot_bytes_);
  }

  void put(int64_t i, torch::Tensor x) override {
    auto& slot = host_.at(static_cast<size_t>(i));
    if (!slot.defined()) slot = Pin(i);
    const auto compute = c10::cuda::getCurrentCUDAStream(x.device().index());
    at::cuda::CUDAEvent produced;
    produced.record(compute);
    c10::cuda::CUDAStreamGuard guard(side_);
    produced.block(side_);
    slot.copy_(x, /*non_blocking=*/true);
    x.record_stream(side_);  // the caching allocator keeps x's memory until the copy is done
    written_.at(static_cast<size_t>(i)).record(side_);
  }

  torch::Tensor read(int64_t i, int64_t s, int64_t e) override {
    if (!pending_ || !(pending_->i == i && pending_->s == s && pending_->e == e)) {
      pending_.reset();
      prefetch(i, s, e);
    }
    auto p = std::move(*pending_);
    pending_.reset();
    p.done->block(c10::cuda::getCurrentCUDAStream(p.out.device().index()));
    return p.out;
  }

  void prefetch(int64_t i, int64_t s, int64_t e) override {
    if (pending_) return;
    auto out = torch::empty({shape_[0], e - s, shape_[2]}, options_);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    // `out` comes from the compute stream's pool: its memory may still be read by kernels
    // queued there, so the side stream waits for them before it writes.
    at::cuda::CUDAEvent allocated;
    allocated.record(c10::cuda::getCurrentCUDAStream(out.device().index()));
    {
      c10::cuda::CUDAStreamGuard guard(side_);
      allocated.block(side_);
      written_.at(static_cast<size_t>(i)).block(side_);
      out.copy_(host_.at(static_cast<size_t>(i)).slice(1, s, e), /*non_blocking=*/true);
      out.record_stream(side_);
      done->record(side_);
    }
    pending_ = Pending{i, s, e, out, std::move(done)};
  }

  void drop(int64_t) override {}
  int64_t offloaded_bytes() const override { return bytes_; }
  bool on_device() const override { return false; }

 private:
  struct Pending {
    int64_t i, s, e;
    torch::Tensor out;
    std::shared_ptr<at::cuda::CUDAEvent> done;
  };
  // Host memory the pinned buffers leave to the rest of the process.
  static constexpr int64_t kHostReserve = int64_t{2} << 30;

  torch::Tensor Pin(int64_t i) {
    void* p = PinnedBuffers().Take(slot_bytes_);
    if (p == nullptr) {
      throw ResourceExhausted("offloaded layer inputs: pinning " + GiB(slot_bytes_) + " of host memory for layer input " +
                              std::to_string(i) + " failed (cudaHostAlloc); use shorter sequences or a host with more "
                              "memory");
    }
    pinned_.at(static_cast<size_t>(i)) = p;
    return torch::from_blob(p, shape_, options_.device(torch::kCPU));
  }

  c10::cuda::CUDAStream side_;
  std::vector<torch::Tensor> host_;
  std::vector<void*> pinned_;
  std::vector<at::cuda::CUDAEvent> written_;
  std::vector<int64_t> shape_;
  torch::TensorOptions options_;
  int64_t slot_bytes_ = 0;
  int64_t bytes_ = 0;
  std::optional<Pending> pending_;
};
#endif

}  // namespace

std::unique_ptr<LayerStore> LayerStore::OnDevice(int64_t slots) { return std::make_unique<DeviceStore>(slots); }

std::unique_ptr<LayerStore> LayerStore::Offloaded(const std::string& dir, int64_t slots, const torch::Tensor& like) {
  TORCH_CHECK(like.dim() == 3, "LayerStore: [B, T, d] tensors expected");
#if defined(STREAMBP_WITH_CUDA)
  if (like.is_cuda()) return std::make_unique<PinnedHostStore>(slots, like);
#endif
  if (!like.device().is_cpu()) {
    throw InvalidArgument("offload_layer_inputs: no second tier for device " + like.device().str() +
                          " in this build (CPU: a scratch file; CUDA builds: pinned host memory)");
  }
  return std::make_unique<ScratchFileStore>(dir, slots, like);
}

ChunkReader::ChunkReader(LayerStore& store, int64_t slot, int64_t T, int64_t chunk, int passes, Next then,
                         bool last_reversed)
    : store_(store),
      slot_(slot),
      T_(T),
      chunk_(chunk),
      per_pass_((T + chunk - 1) / chunk),
      then_(then),
      last_reversed_(last_reversed) {
  total_ = per_pass_ * passes;
  const auto first = at(0);
  store_.prefetch(first.slot, first.s, first.e);
}

ChunkReader::Next ChunkReader::at(int64_t index) const {
  if (index >= total_) return then_;
  int64_t i = index % per_pass_;
  if (last_reversed_ && index >= total_ - per_pass_) i = per_pass_ - 1 - i;
  const int64_t s = i * chunk_;
  return {slot_, s, std::min(T_, s + chunk_)};
}

torch::Tensor ChunkReader::next(int64_t* s, int64_t* e) {
  TORCH_CHECK(index_ < total_, "ChunkReader: read past the last chunk");
  const auto now = at(index_);
  auto rows = store_.read(now.slot, now.s, now.e);
  const auto after = at(++index_);
  if (after.slot >= 0) store_.prefetch(after.slot, after.s, after.e);
  *s = now.s;
  *e = now.e;
  return rows;
}

}  // namespace streambp::engine
