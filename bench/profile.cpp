// Where a step's time goes (issue 17): RecordFunction callbacks on the measuring thread
// split its wall time, exclusively, among the parts the decoder and the engines mark with
// RECORD_USER_SCOPE("streambp::..."): attention, mlp, projection, norm and rope, layout
// copies, head (logits + loss, forward and backward), embedding. The backward of an op is
// charged to the part whose forward created it (its autograd node's sequence number), so
// "attention" is the attention's forward and backward. Ops outside any part are "copies"
// (copy_, clone, fill, cat: the engines' buffers) or "other" (everything else, and the
// time between ops). The same callbacks count the FLOPs of every matrix product the step
// runs, from the operands' shapes: an independent count of what AnalyticFlops predicts.
// Work that the step hands to other threads with the caller's thread-local state (the tiled
// attention's heads split among OpenMP threads) counts its products too; its time is the
// measuring thread's wait, charged to the part that waits.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <ATen/record_function.h>

#include "bench.h"

namespace streambp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The categories, in report order.
const std::vector<std::string>& Names() {
  static const std::vector<std::string> names{"attention", "mlp",       "experts", "projections", "head",
                                              "norms_rope", "copies",   "embedding", "other"};
  return names;
}
enum Category : int {
  kAttention, kMlp, kExperts, kProjections, kHead, kNormsRope, kCopies, kEmbedding, kOther, kCount
};

struct State {
  bool active = false;
  double gemm_flops = 0;  // 2 m k n of every matrix product, the outermost one where they nest
  int gemm_depth = 0;     // matrix products open on the stack
  std::vector<bool> gemm_open;  // per open op: whether it is one
  std::vector<int> stack;  // categories of the open scopes and ops, innermost last
  std::vector<const char*> names;  // their names
  std::unordered_map<std::string, double> op_seconds;  // exclusive time per innermost op
  Clock::time_point last;
  double seconds[kCount] = {};
  std::unordered_map<int64_t, int> created_by;  // autograd sequence number -> category
};
thread_local State g_state;

// Other threads running the step's work while a step is profiled: their matrix products only.
std::atomic<bool> g_collecting{false};
std::mutex g_helper_mutex;
double g_helper_flops = 0;  // guarded by g_helper_mutex
struct HelperState {
  std::vector<bool> gemm_open;
  int gemm_depth = 0;
};
thread_local HelperState g_helper;

int RegionOf(const char* name) {
  if (std::strncmp(name, "streambp::", 10) != 0) return -1;
  const char* r = name + 10;
  if (!std::strcmp(r, "attention")) return kAttention;
  if (!std::strcmp(r, "mlp")) return kMlp;
  if (!std::strcmp(r, "moe")) return kExperts;  // a mixture of experts: router, grouping, experts, gather
  if (!std::strcmp(r, "projection")) return kProjections;
  if (!std::strcmp(r, "head")) return kHead;
  if (!std::strcmp(r, "norm") || !std::strcmp(r, "rope")) return kNormsRope;
  if (!std::strcmp(r, "layout")) return kCopies;
  if (!std::strcmp(r, "embedding")) return kEmbedding;
  return kOther;
}

bool IsCopy(const char* name) {
  for (const char* w : {"copy", "clone", "contiguous", "fill", "zero", "cat", "empty"}) {
    if (std::strstr(name, w)) return true;
  }
  return false;
}

void Charge(Clock::time_point now) {
  auto& s = g_state;
  const int c = s.stack.empty() ? kOther : s.stack.back();
  const double dt = std::chrono::duration<double>(now - s.last).count();
  s.seconds[c] += dt;
  s.op_seconds[Names()[c] + "/" + (s.names.empty() ? "(between ops)" : s.names.back())] += dt;
  s.last = now;
}

// A matrix product's FLOPs (a multiply-add is 2) from its inputs, or -1 for any other op:
// mm / addmm (m x k times k x n), bmm / baddbmm (b batches of those), in place or not.
double GemmFlops(const at::RecordFunction& fn) {
  const char* name = fn.name();
  const bool mm = !std::strcmp(name, "aten::mm") || !std::strcmp(name, "aten::addmm") ||
                  !std::strcmp(name, "aten::addmm_");
  const bool bmm = !std::strcmp(name, "aten::bmm") || !std::strcmp(name, "aten::baddbmm") ||
                   !std::strcmp(name, "aten::baddbmm_");
  if (!mm && !bmm) return -1;
  const auto inputs = fn.inputs();
  // mm / bmm: (a, b, ...); addmm / baddbmm: (self, a, b, ...).
  const size_t first = std::strstr(name, "add") ? 1 : 0;
  if (inputs.size() < first + 2 || !inputs[first].isTensor() || !inputs[first + 1].isTensor()) return 0;
  const auto a = inputs[first].toTensor().sizes(), b = inputs[first + 1].toTensor().sizes();
  const double batch = bmm ? static_cast<double>(a[0]) : 1.0;
  const size_t r = a.size();
  return 2.0 * batch * static_cast<double>(a[r - 2]) * static_cast<double>(a[r - 1]) *
         static_cast<double>(b[b.size() - 1]);
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  auto& s = g_state;
  if (!s.active) {
    if (!g_collecting.load(std::memory_order_relaxed)) return nullptr;
    auto& h = g_helper;
    const double flops = fn.scope() == at::RecordScope::FUNCTION ? GemmFlops(fn) : -1;
    if (flops >= 0 && h.gemm_depth == 0) {
      std::lock_guard<std::mutex> lock(g_helper_mutex);
      g_helper_flops += flops;
    }
    h.gemm_depth += flops >= 0 ? 1 : 0;
    h.gemm_open.push_back(flops >= 0);
    return nullptr;
  }
  const double flops = fn.scope() == at::RecordScope::FUNCTION ? GemmFlops(fn) : -1;
  if (flops >= 0 && s.gemm_depth == 0) s.gemm_flops += flops;
  s.gemm_depth += flops >= 0 ? 1 : 0;
  s.gemm_open.push_back(flops >= 0);
  Charge(Clock::now());
  const int parent = s.stack.empty() ? -1 : s.stack.back();
  int c = parent;
  // The head, the MLP and a mixture of experts own what runs inside them (the MLP's
  // projections are MLP GEMMs; the experts' MLPs are the mixture's).
  const bool owned = parent == kHead || parent == kMlp || parent == kExperts;
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    const int r = RegionOf(fn.name());
    if (r >= 0 && !owned) c = r;
  } else if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    if (!owned) {
      // A custom Function's node is numbered before its forward's ops run: by name.
      auto it = s.created_by.find(fn.seqNr());
      c = std::strstr(fn.name(), "TiledAttention")   ? kAttention
          : it != s.created_by.end()                 ? it->second
          : parent >= 0                              ? parent
          : IsCopy(fn.name())                        ? kCopies
                                                     : kOther;
    }
  } else {
    if (parent < 0) c = IsCopy(fn.name()) ? kCopies : kOther;
    if (fn.seqNr() >= 0 && c != kOther) s.created_by[fn.seqNr()] = c;
  }
  s.stack.push_back(c < 0 ? kOther : c);
  s.names.push_back(fn.name());
  return nullptr;
}

void OnEnd(const at::RecordFunction&, at::ObserverContext*) {
  auto& s = g_state;
  if (!s.active) {
    auto& h = g_helper;
    if (!h.gemm_open.empty()) {
      h.gemm_depth -= h.gemm_open.back() ? 1 : 0;
      h.gemm_open.pop_back();
    }
    return;
  }
  if (s.stack.empty()) return;
  if (!s.gemm_open.empty()) {
    s.gemm_depth -= s.gemm_open.back() ? 1 : 0;
    s.gemm_open.pop_back();
  }
  Charge(Clock::now());
  s.stack.pop_back();
  s.names.pop_back();
}

}  // namespace

TimeBreakdown ProfileStep(const std::function<void()>& step) {
  auto& s = g_state;
  s = State{};
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&OnStart, &OnEnd)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE})
          .needsInputs(true));
  s.active = true;
  {
    std::lock_guard<std::mutex> lock(g_helper_mutex);
    g_helper_flops = 0;
  }
  g_collecting = true;
  const auto t0 = Clock::now();
  s.last = t0;
  try {
    step();
  } catch (...) {
    s.active = false;
    g_collecting = false;
    at::removeCallback(handle);
    throw;
  }
  Charge(Clock::now());
  s.active = false;
  g_collecting = false;
  at::removeCallback(handle);
  TimeBreakdown out;
  out.total_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(g_helper_mutex);
    out.gemm_flops = s.gemm_flops + g_helper_flops;
  }
  for (int c = 0; c < kCount; ++c) out.seconds[Names()[c]] = s.seconds[c];
  out.ops.assign(s.op_seconds.begin(), s.op_seconds.end());
  std::sort(out.ops.begin(), out.ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (out.ops.size() > 40) out.ops.resize(40);
  s = State{};
  return out;
}

const std::vector<std::string>& BreakdownCategories() { return Names(); }

}  // namespace streambp::bench
