// `streambp history`: a session's training history (GetHistory), as a table or as JSON lines
// (the server's metrics.jsonl format), read page by page.
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "common.h"
#include "streambp/history_line.h"

namespace streambp::cli {
namespace {

// The record as a metrics.jsonl line: its scalar fields by their proto names (the file's
// names), then the objective's metrics (streambp/history_line.h has the shared rules).
nlohmann::json Line(const v1::HistoryRecord& r) {
  nlohmann::json line = nlohmann::json::object();
  const auto* d = r.GetDescriptor();
  const auto* reflection = r.GetReflection();
  using F = google::protobuf::FieldDescriptor;
  for (int i = 0; i < d->field_count(); ++i) {
    const F* f = d->field(i);
    if (f->is_repeated()) continue;  // the metrics map, below
    switch (f->cpp_type()) {
      case F::CPPTYPE_INT64: line[f->name()] = reflection->GetInt64(r, f); break;
      case F::CPPTYPE_DOUBLE: line[f->name()] = HistoryNumber(reflection->GetDouble(r, f)); break;
      case F::CPPTYPE_BOOL: line[f->name()] = reflection->GetBool(r, f); break;
      case F::CPPTYPE_STRING: line[f->name()] = reflection->GetString(r, f); break;
      default: break;
    }
  }
  for (const auto& [name, value] : r.metrics()) line[HistoryMetricKey(name)] = HistoryNumber(value);
  return line;
}

}  // namespace

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
        std::printf("%s\n", Line(r).dump().c_str());
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
