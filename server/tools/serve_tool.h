#pragma once
// `streambp-server serve`: the config from a file and/or flags, the server, signals.
#include <string>
#include <vector>

namespace streambp::tools {

struct ServeArgs {
  std::string config_file;       ///< JSON config (see server/config.h); flags override it
  std::string model_dir, preset, family, dtype, device, listen, engine, optimizer, checkpoint_dir, log_format;
  std::vector<std::string> tokens;
  int64_t seed = -1, chunk = -1, logits_chunk = -2, key_chunk = -1, queue_depth = 0, max_sequence_length = 0;
  int64_t memory_budget = -1, micro_batch_tokens = -1;
  int64_t context_parallel = 0;  ///< parallel.context_parallel (0 = as configured)
  double lr = -1;
  int threads = 0;
  std::string port_file;         ///< write the bound port here once listening
  bool keep_attention = false;   ///< trainer.engine.keep_attention = true
  bool check_config = false;     ///< validate, print the effective config, exit
  bool no_model_check = false;   ///< with check_config: leave the model folder and device unchecked
  bool history_tensorboard = false;  ///< history.tensorboard: TensorBoard event files beside metrics.jsonl
};

int Serve(const ServeArgs& args);

}  // namespace streambp::tools
