// Data-parallel StreamBP over c10d Gloo on loopback: 2 ranks (threads of this process, each
// with its own process group and model) give the update of one process on the whole batch,
// for every objective and ZeRO stage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/data.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/trainer.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// Runs f(rank) on `n` threads; rethrows the first failure.
void RunRanks(int n, const std::function<void(int)>& f) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

std::vector<Sequence> Step(const std::string& kind, int64_t vocab) {
  auto raw = testing::RandomSequences({5, 7, 3, 9, 4, 6, 8, 2, 5, 7, 3, 6}, vocab, 17);
  std::vector<Sequence> out;
  for (int g = 0; g < 4; ++g) {
    const auto& prompt = raw[3 * g].tokens;
    for (int k = 0; k < (kind == "sft" ? 1 : 2); ++k) {
      Sequence s;
      s.tokens = prompt;
      const auto& c = raw[3 * g + 1 + k].tokens;
      s.tokens.insert(s.tokens.end(), c.begin(), c.end());
      s.loss_mask.assign(prompt.size(), 0);
      s.loss_mask.resize(s.tokens.size(), 1);
      if (kind != "sft") s.group = g;
      s.role = k;
      s.reward = 0.3 * g + k;
      out.push_back(s);
    }
  }
  return out;
}

TrainerOptions Options(const std::string& kind) {
  TrainerOptions o;
  o.optimizer.name = "adamw";
  o.optimizer.lr = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.max_grad_norm = 0.5;  // the clip uses the global norm
  o.engine = EngineOptions{EngineKind::kStream, 3, 4};
  o.reference.use_reference_model = kind == "dpo";
  return o;
}

nlohmann::json ObjectiveOptions(const std::string& kind) {
  if (kind == "grpo") return {{"loss_type", "grpo"}};
  return nlohmann::json::object();
}

struct Case {
  std::string kind;
  int zero;
};

class DataParallel : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallel, TwoRanksEqualOneProcessOnTheWholeBatch) {
  RegisterBuiltinObjectives();
  const auto [kind, zero] = GetParam();
  const auto config = testing::TinyConfig("qwen3");
  const auto step = Step(kind, config.vocab_size);
  constexpr int kSteps = 3;

  auto single = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), Options(kind));
  std::vector<double> single_losses;
  for (int i = 0; i < kSteps; ++i) {
    auto obj = CreateObjective(kind, ObjectiveOptions(kind));
    single_losses.push_back(single->train_step(step, *obj).forward.loss);
  }
  const auto expected = single->model()->hf_tensors();

  const int port = FreePort();
  std::vector<TensorMap> weights(2);
  std::vector<std::vector<double>> losses(2);
  std::vector<int64_t> state_bytes(2);
  const std::string ckpt = testing::TempDir("dp-ckpt-" + kind + std::to_string(zero)) + "/ckpt";
  RunRanks(2, [&](int rank) {
    DistOptions d;
    d.rank = rank;
    d.world_size = 2;
    d.master_port = port;
    d.timeout_seconds = 60;
    d.zero_stage = zero;
    auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), Options(kind));
    trainer->set_communicator(Communicator::Create(d));
    for (int i = 0; i < kSteps; ++i) {
      auto obj = CreateObjective(kind, ObjectiveOptions(kind));
      losses[rank].push_back(trainer->train_step(step, *obj).forward.loss);
    }
    weights[rank] = trainer->model()->hf_tensors();
    state_bytes[rank] = trainer->optimizer_state_bytes();
    trainer->save_checkpoint(ckpt);  // a collective with ZeRO (the state is gathered)
  });
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR(losses[0][i], single_losses[i], 1e-12 * std::max(1.0, std::abs(single_losses[i]))) << i;
    EXPECT_EQ(losses[0][i], losses[1][i]);
  }
  for (const auto& [name, t] : expected) {
    EXPECT_TRUE(torch::equal(weights[0].at(name), weights[1].at(name))) << "ranks differ on " << name;
  }
  EXPECT_LE(CompareGradients(expected, weights[0]).max_relative, 1e-10);
  const int64_t full = single->optimizer_state_bytes();
  if (zero >= 1) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_LT(state_bytes[r], full * 6 / 10) << "rank " << r;
      EXPECT_GT(state_bytes[r], full * 4 / 10) << "rank " << r;
    }
  } else {
    EXPECT_EQ(state_bytes[0], full);
  }
  // The checkpoint of the sharded run loads into one process and holds the whole state.
  auto loaded = Trainer::LoadCheckpoint(ckpt);
  EXPECT_EQ(loaded->step(), kSteps);
  EXPECT_LE(CompareGradients(single->optimizer().state(), loaded->optimizer().state()).max_relative, 1e-10);
  EXPECT_LE(CompareGradients(expected, loaded->model()->hf_tensors()).max_relative, 1e-10);
}

INSTANTIATE_TEST_SUITE_P(ObjectivesAndZeroStages, DataParallel,
                         ::testing::Values(Case{"sft", 0}, Case{"dpo", 0}, Case{"grpo", 0}, Case{"sft", 1},
                                           Case{"dpo", 1}, Case{"grpo", 2}, Case{"sft", 2}),
                         [](const auto& info) { return info.param.kind + "_zero" + std::to_string(info.param.zero); });

TEST(DataParallelFailure, ADeadPeerFailsTheCollectiveWithinTheTimeout) {
  const int port = FreePort();
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  RunRanks(2, [&](int rank) {
    DistOptions d;
    d.rank = rank;
    d.world_size = 2;
    d.master_port = port;
    d.timeout_seconds = 3;
    auto comm = Communicator::Create(d);
    if (rank == 1) return;  // rank 1 "dies": it never joins the all-reduce
    try {
      comm->all_reduce_sum({torch::ones({4})});
    } catch (const Error& e) {
      error = e.what();
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("a peer died or timed out"), std::string::npos) << error;
  EXPECT_LT(seconds, 30.0);
}

TEST(DataParallelFailure, APeerThatNeverArrivesIsAClearError) {
  DistOptions d;
  d.rank = 0;
  d.world_size = 2;
  d.master_port = FreePort();
  d.timeout_seconds = 2;
  try {
    Communicator::Create(d);
    FAIL() << "rendezvous without the second rank succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rendezvous"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace streambp
