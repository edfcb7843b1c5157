#include "common.h"

#include <chrono>
#include <cmath>
#include <cstdio>

namespace streambp::cli {

namespace {

// The host part of a --server value without a usable port, for the example in the error
// ("localhost", "localhost:" and "localhost:x" all suggest localhost:50051).
std::string ExampleHost(const std::string& t) {
  if (t.empty()) return "127.0.0.1";
  if (t.back() == ']') return t;  // [::1]
  const auto colon = t.rfind(':');
  if (colon == std::string::npos) return t;
  return colon == 0 ? "127.0.0.1" : t.substr(0, colon);
}

}  // namespace

void AddConnectionFlags(CLI::App* cmd, ConnectionFlags& f) {
  cmd->add_option("--server", f.server, "server address HOST:PORT")->envname("STREAMBP_SERVER")->capture_default_str();
  cmd->add_option("--token", f.token, "bearer token (sent as 'authorization: Bearer TOKEN')")->envname("STREAMBP_TOKEN");
  cmd->add_flag("--tls", f.tls, "connect with TLS");
  cmd->add_option("--ca", f.ca, "PEM file of the root certificates that sign the server's (implies --tls)");
  cmd->add_option("--cert", f.cert, "PEM client certificate for mTLS (implies --tls; needs --key)");
  cmd->add_option("--key", f.key, "PEM private key of --cert");
  cmd->add_option("--server-name", f.server_name, "name to check in the server's certificate (implies --tls)");
  cmd->add_option("--timeout", f.timeout, "deadline of each call in seconds (default 600 for steps, 30 for info)")
      ->default_str("")  // 0 stands for those defaults: no "=0" beside them
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--session", f.session, "the session the calls are for (servers with sessions)")
      ->envname("STREAMBP_SESSION");
  cmd->add_option("--wait", f.wait,
                  "wait up to this many seconds for the server to accept connections (one started a moment ago "
                  "and still loading its model); 0 = fail at once when none answers")
      ->envname("STREAMBP_WAIT")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
}

void AddEngineFlags(CLI::App* cmd, EngineFlags& f) {
  cmd->add_option("--engine", f.engine, "full | checkpoint | stream (default: the server's)")
      ->check(CLI::IsMember({"full", "checkpoint", "stream"}));
  cmd->add_option("--chunk", f.chunk, "stream: query positions per chunk (0 = the server's default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--logits-chunk", f.logits_chunk, "positions per lm_head+loss chunk (0 = the server's default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--key-chunk", f.key_chunk,
                  "stream: keys per attention tile inside a chunk (0 = the server's default)")
      ->check(CLI::NonNegativeNumber);
}

v1::EngineOptions ToProto(const EngineFlags& f) {
  v1::EngineOptions e;
  e.set_engine(f.engine);
  e.set_chunk(f.chunk);
  e.set_logits_chunk(f.logits_chunk);
  e.set_key_chunk(f.key_chunk);
  return e;
}

bool IsConnectionFailure(const std::string& message) {
  for (const char* m : {"failed to connect", "Connection refused", "connections to all backends failing",
                        "DNS resolution failed", "Socket closed", "No address added"}) {
    if (message.find(m) != std::string::npos) return true;
  }
  return false;
}

namespace {
std::shared_ptr<grpc::Channel>& LastChannel() {
  static std::shared_ptr<grpc::Channel> channel;
  return channel;
}
}  // namespace

bool LastChannelDown() {
  const auto& channel = LastChannel();
  if (!channel) return false;
  const auto state = channel->GetState(false);
  return state == GRPC_CHANNEL_CONNECTING || state == GRPC_CHANNEL_TRANSIENT_FAILURE;
}

std::unique_ptr<client::Client> Connect(const ConnectionFlags& f) {
  // HOST:PORT, or a gRPC target URI with its own scheme (unix:, dns:, ipv4:, ipv6:).
  const auto& t = f.server;
  const bool uri = t.rfind("unix:", 0) == 0 || t.rfind("dns:", 0) == 0 || t.rfind("ipv4:", 0) == 0 ||
                   t.rfind("ipv6:", 0) == 0;
  if (!uri && t.find("://") != std::string::npos) {
    throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT,
                              "--server " + t + ": give HOST:PORT without a scheme (e.g. " +
                                  t.substr(t.find("://") + 3) + "); TLS is --tls");
  }
  const auto colon = t.rfind(':');
  if (!uri && (colon == std::string::npos || colon + 1 == t.size() || t.back() == ']' ||
               t.find_first_not_of("0123456789", colon + 1) != std::string::npos)) {
    throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT,
                              "--server " + t + ": give HOST:PORT (e.g. " + ExampleHost(t) + ":50051)");
  }
  client::ClientOptions o;
  o.target = f.server;
  o.token = f.token;
  o.tls.enabled = f.tls || !f.ca.empty() || !f.cert.empty() || !f.key.empty() || !f.server_name.empty();
  o.tls.root_ca_file = f.ca;
  o.tls.cert_file = f.cert;
  o.tls.key_file = f.key;
  o.tls.server_name_override = f.server_name;
  if (f.timeout > 0) o.step_timeout = o.info_timeout = client::Seconds(f.timeout);
  o.session = f.session;
  auto client = client::Client::Create(o);
  LastChannel() = client->channel();
  if (f.wait > 0) {
    // A channel that is not READY by then is left to the first call, whose error says why.
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(f.wait));
    client->channel()->WaitForConnected(deadline);
  }
  return client;
}

std::string Bytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string Duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[64];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm%02llds", (long long)(s / 3600), (long long)(s / 60 % 60),
                  (long long)(s % 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  }
  return buf;
}

std::string CommandLineHint(const std::string& message) {
  // The request fields and RPC names the server's messages use, and their flags here.
  static const std::pair<const char*, const char*> kHints[] = {
      {"session is empty", "give --session NAME; `streambp session list` shows them, `streambp session create NAME` "
                           "makes one"},
      {"lora.r ", "--lora-rank"},
      {"lora.alpha", "--lora-alpha"},
      {"target_modules", "--lora-targets"},
      {"lora.seed", "--seed"},
      {"optimizer.lr", "--lr"},
      {"optimizer.name", "--optimizer"},
      {"optimizer.weight_decay", "--weight-decay"},
      {"groups_per_step", "--groups-per-step"},
  };
  std::string out;
  for (const auto& [needle, hint] : kHints) {
    if (message.find(needle) != std::string::npos) out += (out.empty() ? "" : "; ") + std::string(hint);
  }
  return out.empty() || out.rfind("give", 0) == 0 ? out : "on this command line: " + out;
}

}  // namespace streambp::cli
