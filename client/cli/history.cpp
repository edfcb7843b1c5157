// `streambp history`: a session's training history (GetHistory), as a table or as JSON lines
// (the server's metrics.jsonl format), read page by page.
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "common.h"

namespace streambp::cli {

int History(const ConnectionFlags& conn, const HistoryArgs& args) {
  auto client = Connect(conn);
  v1::GetHistoryRequest request;
  request.set_after_index(args.after);
  int64_t shown = 0, last = 0;
  bool header = false;
  while (true) {
    const auto page = Check(client->GetHistory(request));
    last = page.last_index();
    for (const auto& r : page.records()) {
      if (args.jsonl) {
        nlohmann::json line = {{"index", r.index()},
                               {"step", r.step()},
                               {"policy_version", r.policy_version()},
                               {"source", r.source()},
                               {"time", r.time()},
                               {"loss", r.loss()},
                               {"tokens", r.tokens()},
                               {"forward_backwards", r.forward_backwards()},
                               {"tokens_per_second", r.tokens_per_second()},
                               {"seconds", r.seconds()},
                               {"peak_memory_bytes", r.peak_memory_bytes()},
                               {"grad_norm", r.grad_norm()},
                               {"learning_rate", r.learning_rate()},
                               {"skipped", r.skipped()},
                               {"skip_reason", r.skip_reason()},
                               {"groups_consumed", r.groups_consumed()}};
        for (const auto& [name, value] : r.metrics()) line[line.contains(name) ? "objective/" + name : name] = value;
        std::printf("%s\n", line.dump().c_str());
      } else {
        if (!header) {
          std::printf("%6s %6s %-10s %12s %11s %10s %9s  %s\n", "index", "step", "source", "loss", "grad_norm", "lr",
                      "tokens/s", "metrics");
          header = true;
        }
        std::string metrics;
        const std::map<std::string, double> sorted(r.metrics().begin(), r.metrics().end());
        for (const auto& [name, value] : sorted) {
          char v[64];
          std::snprintf(v, sizeof(v), "%s%s=%.4g", metrics.empty() ? "" : " ", name.c_str(), value);
          metrics += v;
        }
        if (r.skipped()) metrics = "skipped: " + r.skip_reason();
        std::printf("%6lld %6lld %-10s %12.6f %11.4g %10.3g %9.0f  %s\n", (long long)r.index(), (long long)r.step(),
                    r.source().c_str(), r.loss(), r.grad_norm(), r.learning_rate(), r.tokens_per_second(),
                    metrics.c_str());
      }
      ++shown;
    }
    if (page.records_size() == 0 || page.records(page.records_size() - 1).index() >= last) break;
    request.set_after_index(page.records(page.records_size() - 1).index());
  }
  if (!args.jsonl) {
    if (shown == 0) {
      std::fprintf(stderr, "no steps recorded yet%s; train with `streambp train`\n",
                   args.after > 0 ? " after that index" : "");
    } else {
      std::fprintf(stderr, "%lld step%s (newest index %lld)\n", (long long)shown, shown == 1 ? "" : "s",
                   (long long)last);
    }
  }
  return 0;
}

}  // namespace streambp::cli
