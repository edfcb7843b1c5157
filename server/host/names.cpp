// The names a client gives that become folder names on the server (checkpoints, sessions,
// sampler snapshots): never a path.
#include <cctype>
#include <string>

#include "host.h"
#include "streambp/error.h"

namespace streambp::server {
namespace {

void ValidateName(const std::string& name, size_t max, const char* what, const char* where) {
  bool ok = !name.empty() && name.size() <= max && name.front() != '.';
  for (char ch : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-');
  }
  if (!ok) {
    throw InvalidArgument(std::string(what) + " name '" + name.substr(0, 200) +
                          "' is not allowed: use letters, digits, '.', '_' and '-', at most " + std::to_string(max) +
                          " characters, not starting with '.' (" + where + ")");
  }
}

}  // namespace

void ValidateCheckpointName(const std::string& name) {
  ValidateName(name, 128, "checkpoint", "a name inside the server's checkpoint directory, never a path");
  const bool history_file = name.size() > 6 && name.compare(name.size() - 6, 6, ".jsonl") == 0 &&
                            (name == "metrics.jsonl" || name.rfind("metrics-", 0) == 0);
  if (history_file || name == "tensorboard") {
    throw InvalidArgument("checkpoint name '" + name +
                          "' is reserved for the training history (metrics.jsonl, tensorboard/); choose another");
  }
}

void ValidateSessionName(const std::string& name) { ValidateName(name, 64, "session", "a name, never a path"); }
void ValidateSnapshotName(const std::string& name) {
  ValidateName(name, 64, "snapshot", "a name inside the session's state folder, never a path");
}

}  // namespace streambp::server
