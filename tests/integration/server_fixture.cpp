#include "integration/server_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

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

HttpResponse HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  HttpResponse r;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port;
    close(fd);
    return r;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string raw;
  char buf[8192];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const auto split = raw.find("\r\n\r\n");
  if (split == std::string::npos) {
    ADD_FAILURE() << "not an HTTP response: " << raw.substr(0, 200);
    return r;
  }
  r.headers = raw.substr(0, split);
  r.body = raw.substr(split + 4);
  std::sscanf(r.headers.c_str(), "HTTP/%*s %d", &r.status);
  return r;
}


}  // namespace streambp::testing
