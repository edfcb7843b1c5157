#pragma once
/// The k most likely next tokens at every position (ComputeLogprobs' top_k: Tinker's
/// topk_prompt_logprobs, distillation targets). Kept out of engine.h: only its callers see it.
#include <cstdint>

#include <torch/types.h>

#include "streambp/batch.h"
#include "streambp/model.h"

namespace streambp {

struct TopLogprobs {
  torch::Tensor ids;       ///< [B, T, k] int64, most likely first; -1 where t has no next token
  torch::Tensor logprobs;  ///< [B, T, k] float64 log p of those ids; 0 where t has no next token
};

/// Without gradients, chunk by chunk as TokenLogprobs (logits / temperature; logits_chunk <=
/// 0: DefaultChunks'). InvalidArgument unless 1 <= k <= vocab_size.
TopLogprobs TopKLogprobs(CausalLM& model, const Batch& batch, int64_t k, int64_t logits_chunk = 0,
                         double temperature = 1.0);

/// log p of each 2-D target's candidates (Batch::top_k_targets, cross_entropy's top-k): [B, T, K]
/// float64 at the positions that predict them, 0 elsewhere; without gradients, chunk by chunk
/// as TokenLogprobs. InvalidArgument when the batch has no 2-D targets.
torch::Tensor TopKTargetLogprobs(CausalLM& model, const Batch& batch, int64_t logits_chunk = 0,
                                 double temperature = 1.0);

}  // namespace streambp
