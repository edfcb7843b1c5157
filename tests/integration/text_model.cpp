#include "integration/text_model.h"

#include "streambp/model.h"
#include "streambp/tokenizer.h"
#include "test_util/fixtures.h"

namespace streambp::testing {

std::string ReferenceModels() { return std::string(STREAMBP_TEXT_REFERENCE_DIR) + "/models"; }

const std::string& QwenModelDir() {
  static const std::string dir = [] {
    const auto out = TempDir("text-model");
    const auto tokenizer_dir = ReferenceModels() + "/qwen3";
    auto tokenizer = Tokenizer::FromDir(tokenizer_dir);
    auto config = PresetConfig("tiny");
    config.vocab_size = (tokenizer->vocab_size() + 63) / 64 * 64;
    config.tie_word_embeddings = true;
    config.eos_token_ids = tokenizer->eos_token_ids();
    config.eos_token_id = config.eos_token_ids.front();
    SaveModel(InitModel(config, 7, torch::kFloat32), out);
    WriteModelSideFiles(ReadModelSideFiles(tokenizer_dir), out);
    return out;
  }();
  return dir;
}

const std::string& GemmaModelDir() {
  static const std::string dir = [] {
    const auto out = TempDir("text-model-gemma");
    const auto tokenizer_dir = ReferenceModels() + "/gemma3";
    auto tokenizer = Tokenizer::FromDir(tokenizer_dir);
    auto config = PresetConfig("tiny", "gemma3");
    config.vocab_size = (tokenizer->vocab_size() + 63) / 64 * 64;
    config.eos_token_ids = tokenizer->eos_token_ids();
    config.eos_token_id = config.eos_token_ids.front();
    config.pad_token_id = tokenizer->pad_token_id();
    config.bos_token_id = tokenizer->bos_token_id();
    SaveModel(InitModel(config, 7, torch::kFloat32), out);
    WriteModelSideFiles(ReadModelSideFiles(tokenizer_dir), out);
    return out;
  }();
  return dir;
}

}  // namespace streambp::testing
