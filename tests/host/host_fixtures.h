#pragma once
// Helpers of the host tests: a tiny float64 server config, waiting for a host answer, steps,
// contexts and the weights a host exports.
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "host.h"
#include "streambp/error.h"
#include "streambp/safetensors.h"

namespace streambp::server {

inline ServerConfig HostConfig() {
  ServerConfig c;
  c.model.preset = "tiny";
  c.model.dtype = "float64";
  c.trainer.optimizer.name = "adamw";
  c.trainer.optimizer.lr = 1e-3;
  c.trainer.engine = EngineOptions{EngineKind::kStream, 8, 8};
  c.log.level = "warn";
  return c;
}

// Waits for a host answer.
template <class T>
Outcome<T> Wait(std::function<void(Done<T>)> call) {
  std::promise<Outcome<T>> p;
  call([&p](const Outcome<T>& o) { p.set_value(o); });
  return p.get_future().get();
}

inline std::string ErrorOf(std::exception_ptr e, ErrorCode* code = nullptr) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (code) *code = err.code();
    return err.what();
  } catch (const std::exception& err) {
    return err.what();
  }
}

inline StepRequest SftStep(std::vector<std::vector<int64_t>> seqs) {
  StepRequest r;
  for (auto& t : seqs) {
    Sequence s;
    s.tokens = std::move(t);
    r.tokens += static_cast<int64_t>(s.tokens.size());
    r.sequences.push_back(std::move(s));
  }
  r.objective = "sft";
  return r;
}

inline CallContext Ctx(const std::string& method, const std::string& id = "", const std::string& digest = "") {
  CallContext c;
  c.method = method;
  c.request_id = id;
  c.digest = digest;
  return c;
}

inline TensorMap Weights(TrainingHost& host) {
  auto o = Wait<ExportReply>([&](auto done) { host.export_weights(Ctx("ExportWeights"), 0, false, done); });
  EXPECT_TRUE(o.ok()) << ErrorOf(o.error);
  return ParseSafetensors(o.value->snapshot->bytes, "weights").tensors;
}

inline void ExpectSame(const TensorMap& a, const TensorMap& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
}

}  // namespace streambp::server
