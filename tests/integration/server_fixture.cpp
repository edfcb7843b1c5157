#include "integration/server_fixture.h"

#include <filesystem>
#include <fstream>

#include "streambp/model.h"
#include "test_util/fixtures.h"

namespace streambp::testing {

server::ServerConfig TestConfig() {
  server::ServerConfig c;
  c.model.preset = "tiny";
  c.model.seed = 0;
  c.model.dtype = "float64";
  c.listen = "127.0.0.1:0";
  c.trainer.optimizer.name = "adamw";
  c.trainer.optimizer.lr = 1e-3;
  c.trainer.engine = EngineOptions{EngineKind::kStream, 8, 8};
  c.log.level = "warn";
  return c;
}

RunningServer StartServer(server::ServerConfig config, client::ClientOptions options) {
  config.listen = "127.0.0.1:0";
  RunningServer r;
  r.server = server::Server::Create(config);
  r.target = "127.0.0.1:" + std::to_string(r.server->port());
  options.target = r.target;
  r.client = client::Client::Create(options);
  return r;
}

TensorMap ExportedTensors(const client::Client& c) {
  auto w = c.ExportWeights();
  EXPECT_TRUE(w.ok()) << w.status().error_message();
  return ParseSafetensors(w->data, "exported weights").tensors;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  static const std::string dir = TempDir("integration");  // made once per process
  auto path = std::filesystem::path(dir) / name;
  std::ofstream(path) << text;
  return path.string();
}

std::string SftJsonl() {
  return R"({"tokens":[1,5,9,13,17,21,25,29,33,37],"loss_mask":[0,0,1,1,1,1,1,1,1,1]}
{"prompt":[2,4,6],"completion":[8,10,12,14]}
{"tokens":[100,101,102,103,104,105]}
)";
}

std::string DpoJsonl() {
  return R"({"prompt":[1,2,3],"chosen":[4,5,6],"rejected":[7,8]}
{"prompt":[9,10],"chosen":[11],"rejected":[12,13,14],"ref_chosen_logp":-5.5,"ref_rejected_logp":-16.25}
)";
}

std::string GrpoJsonl() {
  return R"({"prompt":[1,2,3],"completions":[{"tokens":[4,5],"reward":1.0,"logprobs":[-5.4,-5.6]},{"tokens":[6,7,8],"reward":0.0,"logprobs":[-5.5,-5.5,-5.7]},{"tokens":[9],"reward":0.5,"logprobs":[-5.6]}]}
{"prompt":[20,21],"completions":[{"tokens":[22,23,24,25],"reward":0.2,"logprobs":[-5.5,-5.4,-5.6,-5.5]},{"tokens":[26],"reward":0.9,"logprobs":[-5.5]}]}
)";
}

void ExpectSameTensors(const TensorMap& a, const TensorMap& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    ASSERT_NE(it, b.end()) << name;
    EXPECT_TRUE(torch::equal(t, it->second)) << name;
  }
}

}  // namespace streambp::testing
