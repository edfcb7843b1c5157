#pragma once
// A real streambp-server on a loopback port (port 0, read back), in this process, driven
// through the real client library.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "server.h"
#include "streambp/client/client.h"
#include "streambp/client/data.h"
#include "streambp/safetensors.h"
#include "streambp/trainer.h"

namespace streambp::testing {

/// A config for tests: embedded tiny preset, float64, SGD or AdamW, loopback port 0.
server::ServerConfig TestConfig();

struct RunningServer {
  std::unique_ptr<server::Server> server;
  std::unique_ptr<client::Client> client;
  std::string target;
};

/// Starts a server with `config` (listen forced to 127.0.0.1:0) and a client to it.
RunningServer StartServer(server::ServerConfig config, client::ClientOptions options = {});

/// The server's weights, via ExportWeights (verified by the client), as tensors.
TensorMap ExportedTensors(const client::Client& c);

struct HttpResponse {
  int status = 0;
  std::string headers, body;
};
/// GET http://127.0.0.1:port/path with HTTP/1.0 (the server closes after the answer).
HttpResponse HttpGet(int port, const std::string& path);

/// Writes `text` to a fresh file and returns its path.
std::string WriteFile(const std::string& name, const std::string& text);

/// JSONL data of each objective for tests.
std::string SftJsonl();
std::string DpoJsonl();
std::string GrpoJsonl();

/// Checks that every tensor of `a` equals `b` exactly.
void ExpectSameTensors(const TensorMap& a, const TensorMap& b);

}  // namespace streambp::testing
