// Data parallel (issue 7): the Trainer's steps on N processes over loopback Gloo —
// communication volume and time per step, with and without overlap, and whether the ranks
// end with the same weights.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <torch/torch.h>

#include "bench.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "streambp/runtime.h"
#include "streambp/trainer.h"

namespace streambp::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Bytes this process has handed to write()/writev() (Gloo's TCP pairs send with writev):
// the bytes a rank sends, measured (/proc/self/io counts every thread). -1 when unreadable.
int64_t WrittenBytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (f >> key >> value) {
    if (key == "wchar:") return value;
  }
  return -1;
}

uint64_t WeightsHash(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the raw bytes, in parameter order
  for (const auto& [name, p] : params) {
    const auto t = p.detach().cpu().contiguous();
    const auto* b = static_cast<const uint8_t*>(t.data_ptr());
    for (int64_t i = 0, n = t.numel() * static_cast<int64_t>(t.element_size()); i < n; ++i) {
      h = (h ^ b[i]) * 1099511628211ull;
    }
  }
  return h;
}

json OpsJson(const CommStats& now, const CommStats& before) {
  json out = json::object();
  for (const auto& [op, s] : now.by_op) {
    CommStats::Op was;
    if (auto it = before.by_op.find(op); it != before.by_op.end()) was = it->second;
    if (s.calls == was.calls && s.bytes == was.bytes && s.seconds == was.seconds) continue;
    out[op] = {{"bytes", s.bytes - was.bytes}, {"seconds", s.seconds - was.seconds}, {"calls", s.calls - was.calls}};
  }
  return out;
}

// Per timed step, the largest value over the ranks (the job waits for its slowest rank);
// then the median over the steps.
double MedianOfMax(const json& ranks, const std::function<double(const json&)>& get) {
  std::vector<double> per_step;
  const size_t steps = ranks.at(0).at("steps").size();
  for (size_t i = 0; i < steps; ++i) {
    double m = 0;
    for (const auto& r : ranks) m = std::max(m, get(r.at("steps").at(i)));
    per_step.push_back(m);
  }
  return Median(per_step);
}

double MedianOfMean(const json& ranks, const std::function<double(const json&)>& get) {
  std::vector<double> per_step;
  const size_t steps = ranks.at(0).at("steps").size();
  for (size_t i = 0; i < steps; ++i) {
    double sum = 0;
    for (const auto& r : ranks) sum += get(r.at("steps").at(i));
    per_step.push_back(sum / static_cast<double>(ranks.size()));
  }
  return Median(per_step);
}

double OpBytes(const json& step, const std::string& op) {
  const auto& ops = step.at("by_op");
  return ops.contains(op) ? ops[op].at("bytes").get<double>() : 0.0;
}

// Bytes one rank sends per step under ring / chain algorithms: a ring all-reduce of B bytes
// is a reduce-scatter and an all-gather, (N-1)/N x B each; a chain reduce or broadcast moves
// B across N-1 links, (N-1)/N x B per rank on average.
double RingSentBytes(const json& step, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return 2 * f * (OpBytes(step, "all_reduce") + OpBytes(step, "all_reduce_scalar")) +
         f * (OpBytes(step, "reduce") + OpBytes(step, "broadcast"));
}

double MaxRelativeDiff(const fs::path& a, const fs::path& b) {
  std::vector<torch::Tensor> x, y;
  torch::load(x, a.string());
  torch::load(y, b.string());
  TORCH_CHECK(x.size() == y.size(), "weights files differ in their number of tensors");
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const auto xd = x[i].to(torch::kFloat64), yd = y[i].to(torch::kFloat64);
    const double scale = std::max(xd.abs().max().item<double>(), 1e-30);
    worst = std::max(worst, (xd - yd).abs().max().item<double>() / scale);
  }
  return worst;
}

std::string Tail(const fs::path& log, size_t bytes) {
  std::ifstream f(log);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

}  // namespace

void SpawnRanks(const std::vector<std::string>& args, int n, int zero_stage, const std::string& dir_name) {
  const fs::path dir(dir_name);
  const int port = FreeLoopbackPort();
  std::fflush(stdout);  // or the children inherit (and print) what is buffered
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const auto log = dir / ("rank" + std::to_string(r) + ".log");
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(ErrorCode::kInternal, "fork failed");
    if (pid == 0) {
      std::FILE* out = std::freopen(log.c_str(), "w", stdout);
      if (out == nullptr || ::dup2(::fileno(stdout), 2) < 0) ::_exit(126);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("STREAMBP_ZERO_STAGE", std::to_string(zero_stage).c_str(), 1);
      if (std::getenv("STREAMBP_DIST_TIMEOUT") == nullptr) ::setenv("STREAMBP_DIST_TIMEOUT", "600", 1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::string failure;
  for (size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) {
      ++left;
      continue;
    }
    const int r = static_cast<int>(it - pids.begin());
    *it = -1;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = "rank " + std::to_string(r) + " of " + std::to_string(n) + " failed (status " +
                std::to_string(status) + "); its log ends:\n" + Tail(dir / ("rank" + std::to_string(r) + ".log"), 2000);
      for (pid_t other : pids) {
        if (other > 0) ::kill(other, SIGTERM);  // only the ranks this call started
      }
    }
  }
  if (!failure.empty()) throw Error(ErrorCode::kInternal, failure);
}


int RunDistWorker(const DistPlan& plan, const std::string& dir, bool overlap) {
  const auto dist = DistOptions::FromEnv();
  const int threads = std::max(1, plan.threads / dist.world_size);
  ConfigureThreads(threads);
  RegisterBuiltinObjectives();
  const auto dtype = ParseDtype(plan.dtype);
  auto model = plan.model_dir.empty() ? InitModel(PresetConfig(plan.preset, plan.family), plan.seed, dtype)
                                      : LoadModel(plan.model_dir, dtype);
  const int64_t vocab = model->config().vocab_size;
  TrainerOptions o;
  o.optimizer.name = plan.optimizer == "none" ? "sgd" : plan.optimizer;
  o.optimizer.lr = 1e-4;
  o.engine = plan.engine;
  o.layout = Layout::kRightPad;
  o.micro_batch_tokens = plan.micro_batch_tokens;
  o.reference.use_reference_model = false;  // DPO's synthetic pairs carry their reference log-probs
  o.overlap_grad_reduce = overlap;
  o.grad_bucket_bytes = plan.grad_bucket_bytes;
  auto trainer = Trainer::Create(std::move(model), o);
  if (dist.enabled()) trainer->set_communicator(Communicator::Create(dist));
  const auto sequences = SyntheticSequences(plan.workload, plan.seq_len, vocab);

  json steps = json::array();
  const CommStats none;
  memory::ResetPeak();
  for (int64_t i = 0; i < plan.warmup + plan.steps; ++i) {
    auto objective = CreateObjective(plan.workload.objective, json::object());
    const CommStats before = trainer->communicator() ? trainer->communicator()->stats() : none;
    const int64_t written = WrittenBytes();
    const auto t0 = Clock::now();
    const auto result = trainer->train_step(sequences, *objective);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const int64_t sent = WrittenBytes() - written;
    if (i < plan.warmup) continue;
    const CommStats& now = trainer->communicator() ? trainer->communicator()->stats() : none;
    const auto& g = trainer->last_grad_reduce();
    steps.push_back({{"step_seconds", seconds},
                     {"comm_seconds", now.seconds - before.seconds},
                     {"comm_bytes", now.bytes - before.bytes},
                     {"comm_calls", now.calls - before.calls},
                     {"by_op", OpsJson(now, before)},
                     {"grad_reduce",
                      {{"overlapped", g.overlapped},
                       {"buckets", g.buckets},
                       {"buckets_in_backward", g.buckets_in_backward},
                       {"bytes", g.bytes},
                       {"wait_seconds", g.wait_seconds}}},
                     {"sent_bytes_measured", written < 0 ? json(nullptr) : json(sent)},
                     {"loss", result.forward.loss},
                     {"skipped", result.optim.skipped}});
  }
  const auto params = trainer->model()->named_hf_parameters();
  int64_t gradient_bytes = 0;
  for (const auto& [name, p] : params) gradient_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(WeightsHash(params)));
  if (dist.rank == 0) {
    std::vector<torch::Tensor> weights;
    for (const auto& [name, p] : params) weights.push_back(p.detach().cpu());
    torch::save(weights, (fs::path(dir) / "weights.pt").string());
  }
  const json report{{"rank", dist.rank},
                    {"world_size", dist.world_size},
                    {"zero_stage", dist.enabled() ? dist.zero_stage : 0},
                    {"overlap", overlap},
                    {"threads", threads},
                    {"gradient_bytes", gradient_bytes},
                    {"optimizer_state_bytes", trainer->optimizer_state_bytes()},
                    {"peak_bytes", memory::PeakBytes()},
                    {"weights_hash", hash},
                    {"steps", steps}};
  std::ofstream out(fs::path(dir) / ("rank" + std::to_string(dist.rank) + ".json"));
  out << report.dump(1) << "\n";
  return out ? 0 : 1;
}

json RunDistributed(const DistPlan& plan, const std::vector<std::string>& args) {
  const fs::path root = fs::temp_directory_path() / ("streambp-bench-dist-" + std::to_string(::getpid()));
  fs::create_directories(root);
  json runs = json::array();
  fs::path single_weights;
  std::printf("%3s %4s %7s %8s %8s %8s %9s %11s %9s %10s %10s %9s %9s %9s %6s %10s\n", "N", "zero", "overlap",
              "step s", "comm s", "grad s", "grad MiB", "bkts(bwd)", "bcast MiB", "ring MiB", "sent MiB", "opt MiB",
              "peak MiB", "loss", "same", "vs N=1");
  for (int n : plan.world_sizes) {
    for (int zero : n == 1 ? std::vector<int>{0} : plan.zero_stages) {
      for (bool overlap : n == 1 ? std::vector<bool>{false} : std::vector<bool>{true, false}) {
        const fs::path dir = root / ("n" + std::to_string(n) + "-zero" + std::to_string(zero) + (overlap ? "-overlap" : ""));
        fs::create_directories(dir);
        auto child = args;
        child.insert(child.end(), {"--dist-worker", dir.string(), "--dist-overlap", overlap ? "1" : "0"});
        SpawnRanks(child, n, zero, dir);
        json ranks = json::array();
        for (int r = 0; r < n; ++r) {
          std::ifstream in(dir / ("rank" + std::to_string(r) + ".json"));
          ranks.push_back(json::parse(in));
        }
        bool same = true;
        for (const auto& r : ranks) same = same && r.at("weights_hash") == ranks[0].at("weights_hash");
        if (n == 1) single_weights = dir / "weights.pt";
        json vs_single = nullptr;
        if (!single_weights.empty() && n > 1) vs_single = MaxRelativeDiff(single_weights, dir / "weights.pt");
        const auto& s0 = ranks[0].at("steps");
        auto g = [](const char* k) { return [k](const json& s) { return s.at("grad_reduce").at(k).get<double>(); }; };
        const double measured = s0.at(0).at("sent_bytes_measured").is_null()
                                    ? -1.0
                                    : MedianOfMean(ranks, [](const json& s) { return s.at("sent_bytes_measured").get<double>(); });
        int64_t peak = 0, opt = 0;
        for (const auto& r : ranks) {
          peak = std::max(peak, r.at("peak_bytes").get<int64_t>());
          opt = std::max(opt, r.at("optimizer_state_bytes").get<int64_t>());
        }
        json run{{"world_size", n},
                 {"zero_stage", zero},
                 {"overlap", overlap},
                 {"threads_per_rank", ranks[0].at("threads")},
                 {"seq_len", plan.seq_len},
                 {"global_batch", plan.workload.batch},
                 {"micro_batch_tokens", plan.micro_batch_tokens},
                 {"timed_steps", plan.steps},
                 {"step_seconds", MedianOfMax(ranks, [](const json& s) { return s.at("step_seconds").get<double>(); })},
                 {"comm_seconds", MedianOfMax(ranks, [](const json& s) { return s.at("comm_seconds").get<double>(); })},
                 {"grad_wait_seconds", MedianOfMax(ranks, g("wait_seconds"))},
                 {"comm_bytes_per_step", Median([&] {
                    std::vector<double> v;
                    for (const auto& s : s0) v.push_back(s.at("comm_bytes").get<double>());
                    return v;
                  }())},
                 {"grad_bytes_per_step", MedianOfMax(ranks, g("bytes"))},
                 {"broadcast_bytes_per_step", MedianOfMax(ranks, [](const json& s) { return OpBytes(s, "broadcast"); })},
                 {"grad_buckets", MedianOfMax(ranks, g("buckets"))},
                 {"grad_buckets_in_backward", MedianOfMax(ranks, g("buckets_in_backward"))},
                 {"ring_sent_bytes_per_rank", RingSentBytes(s0.at(0), n)},
                 {"measured_sent_bytes_per_rank", measured < 0 ? json(nullptr) : json(measured)},
                 {"gradient_bytes", ranks[0].at("gradient_bytes")},
                 {"optimizer_state_bytes_per_rank", opt},
                 {"peak_bytes_per_rank", peak},
                 {"loss_last_step", s0.back().at("loss")},
                 {"identical_weights", same},
                 {"max_relative_diff_vs_1_process", vs_single},
                 {"ranks", ranks}};
        const double mib = 1024.0 * 1024.0;
        char vs[32] = "-";
        if (!vs_single.is_null()) std::snprintf(vs, sizeof vs, "%.1e", vs_single.get<double>());
        std::printf("%3d %4d %7s %8.3f %8.3f %8.3f %9.1f %5.0f(%3.0f) %9.1f %10.1f %10.1f %9.1f %9.1f %9.5f %6s %10s\n", n, zero,
                    n == 1 ? "-" : (overlap ? "on" : "off"), run["step_seconds"].get<double>(),
                    run["comm_seconds"].get<double>(), run["grad_wait_seconds"].get<double>(),
                    run["grad_bytes_per_step"].get<double>() / mib, run["grad_buckets"].get<double>(),
                    run["grad_buckets_in_backward"].get<double>(), run["broadcast_bytes_per_step"].get<double>() / mib,
                    run["ring_sent_bytes_per_rank"].get<double>() / mib, measured < 0 ? 0.0 : measured / mib,
                    static_cast<double>(opt) / mib, static_cast<double>(peak) / mib,
                    run["loss_last_step"].get<double>(), same ? "yes" : "NO", vs);
        std::fflush(stdout);
        runs.push_back(run);
      }
    }
  }
  fs::remove_all(root);
  return runs;
}

std::vector<std::string> CheckDistributed(const json& distributed) {
  std::vector<std::string> problems;
  if (!distributed.contains("runs") || distributed["runs"].empty()) return {"distributed: no runs"};
  for (const auto& r : distributed["runs"]) {
    const std::string name = "distributed N=" + std::to_string(r.value("world_size", 0)) + " zero " +
                             std::to_string(r.value("zero_stage", 0)) + (r.value("overlap", false) ? " overlap" : "");
    for (const char* k : {"world_size", "zero_stage", "overlap", "step_seconds", "comm_seconds", "grad_bytes_per_step",
                          "comm_bytes_per_step", "ring_sent_bytes_per_rank", "identical_weights", "ranks"}) {
      if (!r.contains(k)) problems.push_back(name + ": missing '" + k + "'");
    }
    if (!problems.empty()) continue;
    if (!r["identical_weights"].get<bool>()) problems.push_back(name + ": the ranks ended with different weights");
    const int n = r["world_size"];
    const double grad = r["grad_bytes_per_step"], whole = r.value("gradient_bytes", 0.0);
    // One sum of the whole gradient per step (N > 1), nothing with one process.
    if (n > 1 && grad != whole) {
      problems.push_back(name + ": " + std::to_string(grad) + " gradient bytes summed per step, expected the whole gradient " +
                         std::to_string(whole));
    }
    if (n == 1 && r["comm_bytes_per_step"].get<double>() != 0) problems.push_back(name + ": one process communicated");
    if (!(r["step_seconds"].get<double>() > 0)) problems.push_back(name + ": step_seconds is not positive");
  }
  return problems;
}

}  // namespace streambp::bench
