// Trainer checkpoints: bit-exact resume, an HF model folder inside, corruption detected
// before anything is read, atomic replacement.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/model.h"
#include "streambp/trainer.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

namespace fs = std::filesystem;

TrainerOptions ResumeOptions() {
  TrainerOptions o;
  o.optimizer.lr = 2e-2;
  o.optimizer.weight_decay = 0.01;
  o.schedule = {"cosine", 2, 8, 0.1};
  o.max_grad_norm = 0.5;
  o.engine = {EngineKind::kStream, 5, 4};
  o.micro_batch_tokens = 30;
  o.seed = 9;
  return o;
}

std::vector<Sequence> StepData(int step, int64_t vocab) {
  return testing::RandomSequences({9, 12, 6}, vocab, 40 + step);
}

void Steps(Trainer& trainer, int from, int to) {
  for (int step = from; step < to; ++step) {
    auto sft = MakeSftObjective({});
    const auto r = trainer.train_step(StepData(step, trainer.model()->config().vocab_size), *sft);
    ASSERT_FALSE(r.optim.skipped) << r.optim.reason;
  }
}

void ExpectEqualMaps(const TensorMap& a, const TensorMap& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    EXPECT_TRUE(torch::equal(t, b.at(name))) << what << ": " << name;
  }
}

void ExpectInvalidNaming(const std::string& dir, const std::string& file) {
  try {
    Trainer::LoadCheckpoint(dir);
    ADD_FAILURE() << "loaded a checkpoint with a bad " << file;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

class CheckpointResume : public ::testing::TestWithParam<torch::Dtype> {};

TEST_P(CheckpointResume, SaveThenLoadContinuesBitExactly) {
  const auto dtype = GetParam();
  auto config = testing::TinyConfig("qwen3");
  const auto dir = testing::TempDir("ckpt-resume") + "/ckpt";
  auto a = Trainer::Create(testing::RandomModel(config, 21, dtype), ResumeOptions());
  Steps(*a, 0, 3);
  a->save_checkpoint(dir);
  Steps(*a, 3, 5);

  auto b = Trainer::LoadCheckpoint(dir);
  EXPECT_EQ(b->step(), 3);
  EXPECT_EQ(b->policy_version(), 3);
  EXPECT_EQ(b->options().ToJson(), ResumeOptions().ToJson());
  Steps(*b, 3, 5);

  EXPECT_EQ(a->step(), b->step());
  EXPECT_EQ(a->policy_version(), b->policy_version());
  EXPECT_EQ(a->current_lr(), b->current_lr());
  ExpectEqualMaps(a->model()->hf_tensors(), b->model()->hf_tensors(), "weights");
  ExpectEqualMaps(a->optimizer().state(), b->optimizer().state(), "optimizer state");
  ExpectEqualMaps(a->reference_model()->hf_tensors(), b->reference_model()->hf_tensors(), "reference");
  EXPECT_TRUE(torch::equal(a->generator().get_state(), b->generator().get_state()));
  if (dtype == torch::kBFloat16) {
    EXPECT_TRUE(a->optimizer().state().count("master/model.norm.weight"));
  }
  fs::remove_all(fs::path(dir).parent_path());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CheckpointResume, ::testing::Values(torch::kFloat64, torch::kBFloat16),
                         [](const auto& info) { return DtypeName(info.param); });

TEST(Checkpoint, TheFolderIsAHuggingFaceModelFolder) {
  auto config = testing::TinyConfig("llama_bias");
  const auto dir = testing::TempDir("ckpt-hf");
  auto trainer = Trainer::Create(testing::RandomModel(config, 3, torch::kFloat32), ResumeOptions());
  Steps(*trainer, 0, 1);
  trainer->save_checkpoint(dir + "/ckpt/");  // a trailing separator names the same folder
  auto model = LoadModel(dir + "/ckpt", torch::kFloat32);
  ExpectEqualMaps(model->hf_tensors(), trainer->model()->hf_tensors(), "LoadModel");
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, std::set<std::string>{"ckpt"}) << "temporary folders left behind";
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptionIsDetectedBeforeLoadingAndNamesTheFile) {
  auto config = testing::TinyConfig("qwen2");
  const auto root = testing::TempDir("ckpt-corrupt");
  auto trainer = Trainer::Create(testing::RandomModel(config, 4, torch::kFloat32), ResumeOptions());
  Steps(*trainer, 0, 1);
  const auto fresh = [&](const std::string& name) {
    const auto dir = root + "/" + name;
    trainer->save_checkpoint(dir);
    return dir;
  };

  auto dir = fresh("manifest");
  std::ofstream(dir + "/manifest.json") << "{ not json";
  ExpectInvalidNaming(dir, "manifest.json");

  dir = fresh("modified");
  {
    std::fstream f(dir + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  ExpectInvalidNaming(dir, "optimizer.safetensors");

  dir = fresh("truncated");
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") - 10);
  ExpectInvalidNaming(dir, "model.safetensors");

  dir = fresh("missing");
  fs::remove(dir + "/reference.safetensors");
  ExpectInvalidNaming(dir, "reference.safetensors");

  dir = fresh("state");
  std::ofstream(dir + "/trainer_state.json", std::ios::app) << " ";
  ExpectInvalidNaming(dir, "trainer_state.json");

  EXPECT_THROW(Trainer::LoadCheckpoint(root + "/nothing-here"), NotFound);
  fs::remove_all(root);
}

TEST(Checkpoint, SavingOverAnExistingCheckpointReplacesIt) {
  auto config = testing::TinyConfig("llama");
  const auto root = testing::TempDir("ckpt-replace");
  const auto dir = root + "/ckpt";
  auto trainer = Trainer::Create(testing::RandomModel(config, 6, torch::kFloat64), ResumeOptions());
  Steps(*trainer, 0, 1);
  trainer->save_checkpoint(dir);
  std::ofstream(dir + "/stray.txt") << "from before";
  Steps(*trainer, 1, 3);
  trainer->save_checkpoint(dir);
  auto loaded = Trainer::LoadCheckpoint(dir);
  EXPECT_EQ(loaded->step(), 3);
  ExpectEqualMaps(loaded->model()->hf_tensors(), trainer->model()->hf_tensors(), "weights");
  EXPECT_FALSE(fs::exists(dir + "/stray.txt"));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, std::set<std::string>{"ckpt"}) << "old or temporary folders left behind";
  fs::remove_all(root);
}

TEST(Checkpoint, OptionsCanBeOverriddenOnLoad) {
  auto config = testing::TinyConfig("llama");
  const auto dir = testing::TempDir("ckpt-override") + "/ckpt";
  auto trainer = Trainer::Create(testing::RandomModel(config, 6, torch::kFloat64), ResumeOptions());
  Steps(*trainer, 0, 2);
  trainer->save_checkpoint(dir);
  auto options = ResumeOptions();
  options.optimizer.lr = 1e-3;
  options.schedule = {"constant", 0, 0, 0};
  options.reference.use_reference_model = false;
  auto loaded = Trainer::LoadCheckpoint(dir, &options);
  EXPECT_EQ(loaded->current_lr(), 1e-3);
  EXPECT_EQ(loaded->step(), 2);
  EXPECT_FALSE(loaded->reference_model());
  options.optimizer.name = "sgd";
  try {
    Trainer::LoadCheckpoint(dir, &options);
    ADD_FAILURE() << "loaded adamw state into sgd";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("adamw"), std::string::npos) << e.what();
  }
  fs::remove_all(fs::path(dir).parent_path());
}

}  // namespace
}  // namespace streambp
