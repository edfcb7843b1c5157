// The variants a run measures (engine options from the flags) and the data-parallel plan.
#include <algorithm>
#include <thread>

#include "args.h"
#include "bench.h"
#include "streambp/context_parallel.h"

namespace streambp::bench {

EngineOptions Engine(const Args& a, EngineKind kind, int64_t chunk, int64_t logits_chunk) {
  EngineOptions o{kind, chunk, logits_chunk};
  o.key_chunk = a.key_chunk;
  // The defaults the engine resolves there (--device is checked where the model is made).
  o.device = a.device.rfind("cuda", 0) == 0 ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  return o;
}

namespace {

// checkpoint:tiled: attention in query blocks x key tiles of stream's sizes (--chunk,
// --key-chunk) with an online softmax, logits in chunks of --logits-chunk: checkpointing as
// users run it with FlashAttention and a chunked loss, the strongest baseline.
Variant TiledCheckpoint(const Args& a) {
  Variant v{"checkpoint", true, Engine(a, EngineKind::kCheckpoint, a.chunk, a.logits_chunk)};
  v.options.tiled_attention = true;
  return v;
}

}  // namespace

std::vector<Variant> MakeVariants(const Args& a) {
  std::vector<Variant> out;
  for (const auto& e : a.engines) {
    // checkpoint runs the three baselines; checkpoint:materialized / :chunked / :tiled one of them.
    if (e == "checkpoint:materialized" || e == "checkpoint:chunked") {
      const bool chunked = e == "checkpoint:chunked";
      out.push_back({"checkpoint", chunked, Engine(a, EngineKind::kCheckpoint, 0, chunked ? a.logits_chunk : 0)});
      continue;
    }
    if (e == "checkpoint:tiled") {
      out.push_back(TiledCheckpoint(a));
      continue;
    }
    const auto kind = ParseEngine(e == "stream:offload" || e == "stream:keep" ? "stream" : e);
    if (kind == EngineKind::kFull) {
      out.push_back({"full", false, Engine(a, kind, 0, 0)});
    } else if (kind == EngineKind::kCheckpoint) {
      out.push_back({"checkpoint", false, Engine(a, kind, 0, 0)});
      out.push_back({"checkpoint", true, Engine(a, kind, 0, a.logits_chunk)});
      out.push_back(TiledCheckpoint(a));
    } else if (e == "stream:offload") {
      Variant v{"stream", true, Engine(a, kind, a.chunk, a.logits_chunk)};
      v.options.offload_layer_inputs = true;
      v.options.scratch_dir = a.scratch_dir;
      out.push_back(v);
    } else if (e == "stream:keep") {
      Variant v{"stream", true, Engine(a, kind, a.chunk, a.logits_chunk)};
      v.options.keep_attention = true;
      out.push_back(v);
    } else {
      out.push_back({"stream", true, Engine(a, kind, a.chunk, a.logits_chunk)});
    }
  }
  return out;
}

DistPlan MakeDistPlan(const Args& a, int64_t seq_len) {
  DistPlan p;
  p.model_dir = a.model_dir;
  p.preset = a.preset;
  p.family = a.family;
  p.dtype = a.dtype;
  p.optimizer = a.optimizer;
  p.seed = a.seed;
  p.workload = {a.objective, a.batch, 1};
  p.engine = Engine(a, EngineKind::kStream, a.chunk, a.logits_chunk);
  p.seq_len = seq_len;
  p.warmup = a.warmup;
  p.steps = a.repeat;
  p.micro_batch_tokens = a.micro_batch_tokens;
  p.grad_bucket_bytes = ParseBytes(a.grad_bucket);
  p.threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.world_sizes = a.world_sizes;
  p.zero_stages = a.zero_stages;
  return p;
}

CpPlan MakeCpPlan(const Args& a) {
  CpPlan p;
  p.model_dir = a.model_dir;
  p.preset = a.preset;
  p.family = a.family;
  p.dtype = a.dtype;
  p.seed = a.seed;
  p.workload = {a.objective, a.batch, 1};
  p.engine = Engine(a, EngineKind::kStream, a.chunk, a.logits_chunk);
  p.engine.context_exchange = ParseContextExchange(a.context_exchange);
  p.ranks = a.context_parallel;
  p.seq_len = a.seq_lens.front();
  p.repeat = a.repeat;
  p.budget = a.no_search ? 0 : ParseBytes(a.budget);
  p.search_start = a.search_start;
  p.search_max = a.search_max;
  p.align = a.search_align;
  p.tol = std::max(a.search_tol, 0.01);
  p.threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return p;
}

}  // namespace streambp::bench
