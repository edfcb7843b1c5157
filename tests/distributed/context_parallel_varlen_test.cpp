// Context parallel with packed rows through a variable-length kernel (streambp/attention.h:
// VarlenAttention; flash's varlen entry on CUDA): each rank's chunks, over the whole batch's
// K/V gathered or, where the heads split, over its heads' (the heads exchange attends every
// rank's queries of its heads), go through the float64 reference kernel, and the ranks' summed gradients equal one
// process's without it (1e-10).
#include <gtest/gtest.h>

#include "streambp/context_parallel.h"
#include "streambp/gradients.h"
#include "ranks.h"
#include "test_util/fixtures.h"
#include "test_util/varlen_reference.h"

namespace streambp {
namespace {

TEST(ContextParallelVarlen, PackedRowsThroughAVarlenKernelEqualOneProcess) {
  using Exchange = EngineOptions::ContextExchange;
  for (const char* family : {"qwen3", "gemma3", "qwen3_moe"}) {
    for (auto exchange : {Exchange::kKeysValues, Exchange::kAuto}) {
      const auto config = testing::TinyConfig(family);
      auto make = [&] { return testing::RandomModel(config, 31, torch::kFloat64); };
      const auto batch = MakeBatch(testing::RandomSequences({13, 8, 21, 11}, config.vocab_size, 9), Layout::kPacked, 24);
      EngineOptions options{EngineKind::kStream, 5, 7, false, 3};
      options.context_exchange = exchange;
      // One process, the tiled kernel.
      auto model = make();
      auto objective = MakeSftObjective({});
      const double loss = ForwardBackward(model, batch, *objective, options).loss;
      const auto single = CollectGradients(*model);
      // Two ranks, every tiled call over these rows through the reference varlen kernel.
      testing::ReferenceVarlenBackend backend;
      ScopedAttentionBackend first(&backend);
      const int port = FreeLoopbackPort(), P = 2;
      std::vector<TensorMap> grads(P);
      std::vector<double> losses(P);
      testing::RunRanks(P, [&](int rank) {
        auto m = make();
        auto group = Communicator::Create(testing::LoopbackRank(rank, P, port));
        auto obj = MakeSftObjective({});
        losses[rank] = ContextParallelForwardBackward(m, batch, *obj, options, *group).loss;
        SumGradients(m->parameters(), *group);
        grads[rank] = CollectGradients(*m);
      });
      EXPECT_GT(backend.taken.load(), 0) << family;
      for (int r = 0; r < P; ++r) {
        const auto diff = CompareGradients(single, grads[r]);
        EXPECT_LE(diff.max_relative, 1e-10) << family << " rank " << r << ": worst " << diff.worst;
      }
      for (int r = 0; r < P; ++r) EXPECT_NEAR(losses[r], loss, 1e-12 * std::abs(loss)) << family << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace streambp
