// `streambp snapshot save|list|delete`: sampler snapshots of --session (SaveWeightsForSampler,
// ListSnapshots, DeleteSnapshot); `sample --snapshot` and `export-weights --snapshot` read them.
#include <cstdio>
#include <ctime>

#include "common.h"

namespace streambp::cli {
namespace {

std::string When(double unix_seconds) {
  if (unix_seconds <= 0) return "never";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  char out[32];
  std::strftime(out, sizeof out, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
  return out;
}

void Print(const v1::SnapshotInfo& s) {
  std::printf("%-24s step %-6lld version %-6lld %10s  %-9s saved %s UTC  expires %s\n", s.name().c_str(),
              (long long)s.step(), (long long)s.policy_version(), Bytes(s.bytes()).c_str(),
              s.resident() ? "resident" : "on disk", When(s.created_unix()).c_str(), When(s.expires_unix()).c_str());
}

}  // namespace

int SnapshotSave(const ConnectionFlags& conn, const SnapshotArgs& args) {
  v1::SaveWeightsForSamplerRequest request;
  request.set_name(args.name);
  request.set_ttl_seconds(args.ttl_seconds);
  request.set_replace_oldest(args.replace_oldest);
  auto client = Connect(conn);
  Print(Check(client->SaveWeightsForSampler(request)));
  std::fprintf(stderr, "sample from it with `streambp sample --snapshot %s ...`\n", args.name.c_str());
  return 0;
}

int SnapshotList(const ConnectionFlags& conn) {
  auto client = Connect(conn);
  const auto list = Check(client->ListSnapshots());
  for (const auto& s : list.snapshots()) Print(s);
  std::fprintf(stderr, "%d snapshot%s (a session holds up to %lld, %s on disk)\n", list.snapshots_size(),
               list.snapshots_size() == 1 ? "" : "s", (long long)list.max_snapshots(),
               Bytes(list.max_snapshot_bytes()).c_str());
  return 0;
}

int SnapshotDelete(const ConnectionFlags& conn, const std::string& name) {
  auto client = Connect(conn);
  std::printf("deleted %s\n", Check(client->DeleteSnapshot(name)).name().c_str());
  return 0;
}

}  // namespace streambp::cli
