#pragma once
// The local commands of streambp-server that need no network: init-model, grad, verify.
#include <cstdint>
#include <string>

#include <memory>

#include "streambp/dist.h"
#include "streambp/model.h"
#include "streambp/objective.h"

namespace streambp::tools {

/// The groups of `--context-parallel P`: WORLD_SIZE processes started with RANK, WORLD_SIZE,
/// MASTER_ADDR and MASTER_PORT; WORLD_SIZE = D x P, and D > 1 adds data parallel (each data
/// rank computes its share of the sequences, split over its P context ranks: SplitParallelGroups).
/// InvalidArgument naming the variables when P does not divide WORLD_SIZE, or, without
/// `data_parallel`, when WORLD_SIZE is not P; before any rendezvous. P = 1: one process (no
/// groups, the environment not read).
struct ToolGroups {
  std::shared_ptr<Communicator> world;  ///< every rank; null for one process
  ParallelGroups groups;
  /// Rank 0 reports and writes; the others print nothing.
  bool writer() const;
};
ToolGroups ContextParallelGroups(int ranks, bool data_parallel);

/// A registered objective from --objective and --objective-options (a JSON object);
/// InvalidArgument for bad JSON, unknown objectives or options.
std::unique_ptr<Objective> MakeObjective(const std::string& name, const std::string& options_json);


struct EngineFlags {
  int64_t chunk = 0;          ///< 0 = default
  int64_t logits_chunk = -1;  ///< -1 = default, 0 = all positions at once
  int64_t key_chunk = 0;      ///< stream: keys per attention tile, 0 = default
  bool keep_attention = false;  ///< stream: keep attention outputs for the backward (EngineOptions::keep_attention)
  std::string context_exchange = "auto";  ///< context parallel: auto | heads | kv
};

struct InitModelArgs {
  std::string preset = "tiny";
  std::string family = "qwen3";  ///< llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3
  uint64_t seed = 0;
  std::string out;
  std::string dtype = "float32";
  /// A folder with a tokenizer.json (and tokenizer_config.json, ...): the model gets its
  /// vocabulary size (rounded up to a multiple of 64) and bos/eos ids, and the files are copied.
  std::string tokenizer;
};
int InitModel(const InitModelArgs& args);

/// tokenize: {"text": ...} lines on stdin -> {"ids": [...]} lines on stdout.
struct TokenizeArgs {
  std::string model;
  bool add_special_tokens = false;
};
int Tokenize(const TokenizeArgs& args);

/// render: {"messages": [...]} lines -> {"text", "ids", "loss_mask", "format"} lines.
struct RenderArgs {
  std::string model;
  std::string format;  ///< "" = the one the tokenizer's chat_template is recognized as
  bool add_generation_prompt = false;
  bool disable_thinking = false;
};
int Render(const RenderArgs& args);

struct GradArgs {
  ModelSource model;
  std::string adapter;  ///< a PEFT adapter folder: the base frozen, gradients of the adapter
  std::string data;
  std::string objective = "sft";
  std::string objective_options = "{}";  ///< JSON object of the objective's options
  std::string engine = "stream";
  std::string layout = "right";
  EngineFlags flags;
  std::string out;
  /// Context parallel over this many processes (RANK, WORLD_SIZE = this, MASTER_ADDR,
  /// MASTER_PORT): each holds its part of every sequence; rank 0 writes the summed gradients.
  int context_parallel = 1;
};
int Grad(const GradArgs& args);

struct VerifyArgs {
  ModelSource model;
  std::string adapter;  ///< a PEFT adapter folder: compare the engines' adapter gradients
  std::string data;  ///< empty = synthetic batch
  std::string objective = "sft";
  std::string objective_options = "{}";
  std::string layout = "right";
  int64_t seq_len = 128;  ///< synthetic batch: longest sequence
  int64_t batch = 2;      ///< synthetic batch: sequences
  uint64_t data_seed = 1;
  EngineFlags flags;      ///< stream chunk sizes (default: several chunks per sequence)
  double tolerance = 0;   ///< 0 = the dtype's default
  /// Also the stream engine with every sequence split over this many processes (RANK,
  /// WORLD_SIZE = this, MASTER_ADDR, MASTER_PORT), the summed gradients against full's;
  /// rank 0 prints.
  int context_parallel = 1;
};
int Verify(const VerifyArgs& args);

}  // namespace streambp::tools
