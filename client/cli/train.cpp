// streambp train: one TrainStep per step over a JSONL file, with progress and a summary.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "common.h"
#include "streambp/client/data.h"

namespace streambp::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int Train(const ConnectionFlags& conn, const TrainArgs& args) {
  // Everything local is checked before connecting: options, data, batching.
  const auto options = client::ParseObjectiveOptions(args.objective, args.objective_options);
  if (args.batch_tokens <= 0) throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT, "--batch-tokens must be > 0");
  if (args.batch_size < 0) throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT, "--batch-size must be >= 0");
  if (args.steps < 0) throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT, "--steps must be >= 0");
  auto data = client::ReadBatchJsonl(args.data, args.objective);
  if (args.objective == "weighted" && args.weights_version >= 0) {
    data.mutable_weighted()->set_policy_version(args.weights_version);
  }
  const v1::EngineOptions engine = ToProto(args.engine);

  auto client = Connect(conn);
  if (client::BatchHasText(data)) {
    // The server's tokenizer and chat format turn text into the ids it will train on; the
    // steps are then cut by those tokens.
    v1::TokenizeRequest tokenize;
    *tokenize.mutable_batch() = data;
    data = Check(client->Tokenize(tokenize)).batch();
  }
  const auto batches = args.batch_size > 0 ? client::SplitByExamples(data, args.batch_size)
                                           : client::SplitByTokens(data, args.batch_tokens);
  const int64_t steps = args.steps > 0 ? args.steps : static_cast<int64_t>(batches.size());
  const auto info = Check(client->GetInfo());
  std::printf("server:  %s: %s, %s on %s, policy version %lld, step %lld\n", conn.server.c_str(),
              info.architecture().c_str(), info.dtype().c_str(), info.device().c_str(),
              (long long)info.policy_version(), (long long)info.step());
  auto count = [](int64_t n, const std::string& one, const std::string& many = "") {  // "1 batch", "3 batches"
    return std::to_string(n) + " " + (n == 1 ? one : many.empty() ? one + "s" : many);
  };
  std::printf("data:    %s: %s, %s; %s per pass (%s); %s, objective %s\n", args.data.c_str(),
              count(client::BatchExamples(data), "example").c_str(), count(client::BatchTokens(data), "token").c_str(),
              count(static_cast<int64_t>(batches.size()), "batch", "batches").c_str(),
              args.batch_size > 0 ? (count(args.batch_size, "example") + " per step").c_str()
                                  : ("<= " + std::to_string(args.batch_tokens) + " tokens per step").c_str(),
              count(steps, "step").c_str(), args.objective.c_str());
  std::fflush(stdout);

  const bool tty = isatty(fileno(stdout));
  double first_loss = 0, last_loss = 0;
  int64_t tokens = 0, skipped = 0;
  const auto start = Clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    v1::TrainStepRequest request;
    *request.mutable_batch() = batches[step % batches.size()];
    options.ApplyTo(&request);
    *request.mutable_engine() = engine;
    const auto t0 = Clock::now();
    // A live line while a long step runs: where it is (queued, layer i of L, ...).
    auto progress = [&](const v1::StepProgress& p) {
      if (!tty || Since(t0) < 1.0) return;
      std::string where = p.state();
      if (p.state() == "queued") where += " (" + std::to_string(p.queue_position()) + " ahead)";
      if (p.state() == "forward" || p.state() == "backward") {
        where += " layer " + std::to_string(p.layer() + 1) + "/" + std::to_string(p.num_layers());
      }
      if (p.micro_batches() > 1) {
        where += ", micro-batch " + std::to_string(p.micro_batch() + 1) + "/" + std::to_string(p.micro_batches());
      }
      std::printf("\rstep %lld/%lld  %s  %s\033[K", (long long)(step + 1), (long long)steps, where.c_str(),
                  Duration(Since(t0)).c_str());
      std::fflush(stdout);
    };
    auto result = client->TrainStepWithProgress(std::move(request), progress);
    if (!result.ok() && tty) std::printf("\n");
    const auto r = Check(std::move(result));
    const auto& stats = r.stats();
    const auto& optim = r.optim();
    if (step == 0) first_loss = stats.loss();
    last_loss = stats.loss();
    tokens += stats.tokens();
    skipped += optim.skipped() ? 1 : 0;
    const double elapsed = Since(start);
    const double eta = elapsed / double(step + 1) * double(steps - step - 1);
    char line[512];
    std::snprintf(line, sizeof line, "step %lld/%lld  loss %.6f  tok/s %.0f  grad_norm %.4g  lr %.3e  eta %s  policy v%lld%s%s",
                  // tok/s over the run so far: one step's rate swings with its size and the
                  // machine's noise (tiny steps: 120 to 2500); the running rate settles.
                  (long long)(step + 1), (long long)steps, stats.loss(), double(tokens) / std::max(elapsed, 1e-9),
                  optim.grad_norm(), optim.learning_rate(), Duration(eta).c_str(), (long long)optim.policy_version(),
                  optim.skipped() ? "  skipped: " : "", optim.skipped() ? optim.skip_reason().c_str() : "");
    if (tty) {
      std::printf("\r%s\033[K", line);
      if (optim.skipped()) std::printf("\n");  // keep skipped steps visible
    } else {
      std::printf("%s\n", line);
    }
    std::fflush(stdout);
  }
  if (tty) std::printf("\n");
  const double total = Since(start);
  std::printf("summary: %lld steps (%lld skipped), %lld tokens in %s (%.0f tok/s); first loss %.6f, last loss %.6f\n",
              (long long)steps, (long long)skipped, (long long)tokens, Duration(total).c_str(),
              tokens / std::max(total, 1e-9), first_loss, last_loss);
  return 0;
}

}  // namespace streambp::cli
