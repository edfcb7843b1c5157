#pragma once
// `streambp-server train`: a local training loop over a JSONL file with the Trainer.
#include <cstdint>
#include <string>
#include <vector>

#include "tools.h"

namespace streambp::tools {

struct TrainArgs {
  ModelSource model;              ///< --model DIR or the embedded preset; --seed also seeds the trainer
  std::string data;               ///< JSONL file in the objective's format
  std::string objective = "sft";  ///< sft | dpo | grpo
  std::string objective_options = "{}";  ///< JSON object of the objective's options
  int64_t steps = 0;                     ///< optimizer steps to run
  int64_t batch_size = 0;                ///< examples per step (a DPO pair, a GRPO group = one); 0 = all
  std::string optimizer = "adamw";       ///< adamw | sgd
  double lr = 1e-5;                      ///< peak learning rate
  double weight_decay = 0.0;             ///< adamw: decoupled; sgd: L2
  std::string schedule = "constant";     ///< constant | linear | cosine, over `steps`
  int64_t warmup = 0;                    ///< linear warmup steps
  double max_grad_norm = 1.0;            ///< 0 = no clipping
  std::string engine = "stream";         ///< full | checkpoint | stream
  std::string layout = "packed";         ///< right | left | packed
  EngineFlags flags;                     ///< stream chunk sizes
  int64_t micro_batch_tokens = 0;        ///< padded tokens per micro-batch; 0 = whole step at once
  std::string save;                      ///< checkpoint folder written at the end; empty = none
  int context_parallel = 1;              ///< --context-parallel P: P processes, rank 0 reports and saves
  // LoRA: train an adapter on a frozen base instead of the whole model.
  int64_t lora_rank = 0;                 ///< --lora-rank R; 0 = full fine-tuning (unless --adapter)
  double lora_alpha = 0;                 ///< --lora-alpha; 0 = 2 x rank
  std::vector<std::string> lora_targets; ///< --lora-targets q_proj,...; empty = the seven projections
  std::vector<std::string> lora_modules_to_save;  ///< --lora-modules-to-save gate: train the MoE router too
  bool use_rslora = false;               ///< --use-rslora
  std::string adapter;                   ///< --adapter DIR: start from this PEFT adapter
  std::string save_adapter;              ///< --save-adapter DIR: the PEFT adapter at the end
  std::string save_merged;               ///< --save-merged DIR: an HF model folder with the adapter folded in
};

/// Cycles through the data in order, `batch_size` examples per step, printing one line per
/// step and a summary (first loss, last loss, relative fall). Returns the exit status.
int Train(const TrainArgs& args);

}  // namespace streambp::tools
