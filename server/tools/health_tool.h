#pragma once
// `streambp-server health`: a grpc.health.v1 check of a running server, for container
// HEALTHCHECKs and exec probes (exit 0 = SERVING, 1 = anything else, printed).
#include <string>

namespace streambp::tools {

struct HealthArgs {
  std::string target = "127.0.0.1:50051";     ///< host:port of the server
  std::string service = "streambp.v1.Trainer";  ///< "" = the whole server
  std::string ca;                              ///< PEM roots: connect with TLS (empty = plaintext)
  std::string server_name;                     ///< name to check in the server certificate
  double timeout_seconds = 3;                  ///< deadline of the check
};

int Health(const HealthArgs& args);

}  // namespace streambp::tools
