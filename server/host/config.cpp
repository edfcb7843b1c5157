#include "config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "streambp/chat.h"
#include "streambp/error.h"
#include "streambp/model.h"

namespace streambp::server {
namespace {

using nlohmann::json;

// Reads the keys of one JSON object into fields, rejecting keys it does not know.
class Section {
 public:
  Section(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) throw InvalidArgument("config: '" + path_ + "' must be an object");
    for (const auto& [k, v] : j_.items()) keys_.push_back(k);
  }
  template <typename T>
  void get(const char* key, T& out) {
    auto it = j_.find(key);
    seen(key);
    if (it == j_.end() || it->is_null()) return;
    try {
      out = it->get<T>();
    } catch (const json::exception&) {
      throw InvalidArgument("config: '" + name(key) + "' has the wrong type: " + it->dump());
    }
  }
  const json* sub(const char* key) {
    seen(key);
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  void done() const {
    for (const auto& k : keys_) {
      if (std::find(seen_.begin(), seen_.end(), k) == seen_.end()) {
        throw InvalidArgument("config: unknown key '" + (path_.empty() ? k : path_ + "." + k) + "'");
      }
    }
  }

 private:
  void seen(const char* key) { seen_.push_back(key); }
  const json& j_;
  std::string path_;
  std::vector<std::string> keys_, seen_;
};

}  // namespace

ServerConfig ServerConfig::FromJson(const json& j, bool validate) {
  ServerConfig c;
  Section top(j, "");
  if (const json* m = top.sub("model")) {
    Section s(*m, "model");
    s.get("dir", c.model.dir);
    s.get("preset", c.model.preset);
    s.get("family", c.model.family);
    s.get("seed", c.model.seed);
    s.get("dtype", c.model.dtype);
    s.get("device", c.model.device);
    s.get("chat_format", c.model.chat_format);
    s.done();
  }
  if (const json* t = top.sub("trainer")) {
    try {
      c.trainer = TrainerOptions::FromJson(*t);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("config: trainer: ") + e.what());
    }
  }
  top.get("listen", c.listen);
  top.get("threads", c.threads);
  if (const json* l = top.sub("limits")) {
    Section s(*l, "limits");
    s.get("max_tokens_per_request", c.limits.max_tokens_per_request);
    s.get("max_sequence_length", c.limits.max_sequence_length);
    s.get("max_message_bytes", c.limits.max_message_bytes);
    s.get("max_text_bytes", c.limits.max_text_bytes);
    s.get("text_workers", c.limits.text_workers);
    s.get("text_queue", c.limits.text_queue);
    s.get("text_memory_bytes", c.limits.text_memory_bytes);
    s.get("queue_depth", c.limits.queue_depth);
    s.get("memory_budget_bytes", c.limits.memory_budget_bytes);
    s.get("request_id_cache", c.limits.request_id_cache);
    s.get("request_id_cache_bytes", c.limits.request_id_cache_bytes);
    s.get("max_request_id_bytes", c.limits.max_request_id_bytes);
    s.get("auto_chunks", c.limits.auto_chunks);
    s.get("min_chunk", c.limits.min_chunk);
    s.get("min_key_chunk", c.limits.min_key_chunk);
    s.get("min_logits_chunk", c.limits.min_logits_chunk);
    s.get("max_sampled_tokens", c.limits.max_sampled_tokens);
    s.get("max_sample_rows", c.limits.max_sample_rows);
    s.get("max_kv_cache_bytes", c.limits.max_kv_cache_bytes);
    s.get("max_concurrent_exports", c.limits.max_concurrent_exports);
    s.get("min_export_chunk_bytes", c.limits.min_export_chunk_bytes);
    s.get("max_streams", c.limits.max_streams);
    s.done();
  }
  if (const json* a = top.sub("auth")) {
    Section s(*a, "auth");
    s.get("tokens", c.auth.tokens);
    s.get("read_only_tokens", c.auth.read_only_tokens);
    s.get("reflection_without_token", c.auth.reflection_without_token);
    if (const json* scoped = s.sub("scoped_tokens")) {
      if (!scoped->is_array()) throw InvalidArgument("config: 'auth.scoped_tokens' must be a list");
      for (size_t i = 0; i < scoped->size(); ++i) {
        Section t((*scoped)[i], "auth.scoped_tokens[" + std::to_string(i) + "]");
        ScopedToken st;
        t.get("token", st.token);
        t.get("sessions", st.sessions);
        t.get("access", st.access);
        t.get("create", st.create);
        t.done();
        c.auth.scoped_tokens.push_back(std::move(st));
      }
    }
    s.done();
  }
  if (const json* t = top.sub("tls")) {
    Section s(*t, "tls");
    s.get("cert", c.tls.cert);
    s.get("key", c.tls.key);
    s.get("client_ca", c.tls.client_ca);
    s.done();
  }
  top.get("checkpoint_dir", c.checkpoint_dir);
  if (const json* sd = top.sub("shutdown")) {
    Section s(*sd, "shutdown");
    s.get("grace_seconds", c.shutdown.grace_seconds);
    s.get("checkpoint_on_exit", c.shutdown.checkpoint_on_exit);
    s.done();
  }
  if (const json* lg = top.sub("log")) {
    Section s(*lg, "log");
    s.get("format", c.log.format);
    s.get("level", c.log.level);
    s.done();
  }
  if (const json* k = top.sub("keepalive")) {
    Section s(*k, "keepalive");
    s.get("time_ms", c.keepalive.time_ms);
    s.get("timeout_ms", c.keepalive.timeout_ms);
    s.done();
  }
  if (const json* m = top.sub("metrics")) {
    Section s(*m, "metrics");
    s.get("listen", c.metrics.listen);
    s.get("dashboard", c.metrics.dashboard);
    s.done();
  }
  if (const json* h = top.sub("history")) {
    Section s(*h, "history");
    s.get("max_records", c.history.max_records);
    s.get("file", c.history.file);
    s.get("tensorboard", c.history.tensorboard);
    s.done();
  }
  if (const json* r = top.sub("rollouts")) {
    Section s(*r, "rollouts");
    s.get("groups_per_step", c.rollouts.groups_per_step);
    s.get("max_staleness", c.rollouts.max_staleness);
    s.get("max_queue", c.rollouts.max_queue);
    s.get("log", c.rollouts.log);
    s.get("grpo", c.rollouts.grpo);
    s.get("checkpoint_every", c.rollouts.checkpoint_every);
    s.get("audit_log", c.rollouts.audit_log);
    s.done();
  }
  if (const json* ss = top.sub("sessions")) {
    Section s(*ss, "sessions");
    s.get("enabled", c.sessions.enabled);
    s.get("max_sessions", c.sessions.max_sessions);
    s.get("max_resident_sessions", c.sessions.max_resident_sessions);
    s.get("idle_seconds", c.sessions.idle_seconds);
    s.get("allow_full_finetuning", c.sessions.allow_full_finetuning);
    s.get("max_lora_rank", c.sessions.max_lora_rank);
    s.get("queue_depth", c.sessions.queue_depth);
    s.get("state_dir", c.sessions.state_dir);
    s.get("metrics_label", c.sessions.metrics_label);
    s.get("max_snapshots", c.sessions.max_snapshots);
    s.get("max_snapshot_bytes", c.sessions.max_snapshot_bytes);
    s.get("snapshot_ttl_seconds", c.sessions.snapshot_ttl_seconds);
    s.done();
  }
  if (const json* pp = top.sub("parallel")) {
    Section s(*pp, "parallel");
    s.get("context_parallel", c.parallel.context_parallel);
    s.done();
  }
  top.get("resume", c.resume);
  top.done();
  if (validate) c.Validate();
  return c;
}

ServerConfig ServerConfig::FromFile(const std::string& path, bool validate) {
  std::ifstream in(path);
  if (!in) throw NotFound("cannot open config file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return FromJson(json::parse(ss.str()), validate);
  } catch (const json::exception& e) {
    throw InvalidArgument(path + ": not valid JSON: " + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(path + ": " + e.what());
  }
}

void ServerConfig::Validate() const {
  auto fail = [](const std::string& m) { throw InvalidArgument("config: " + m); };
  ParseDtype(model.dtype);
  if (model.dir.empty() && model.preset != "tiny" && model.preset != "small") {
    fail("model.preset must be tiny or small, got '" + model.preset + "'");
  }
  if (const auto families = FamilyNames(); std::find(families.begin(), families.end(), model.family) == families.end()) {
    fail("model.family must be llama, qwen2, qwen3, qwen3_moe, mistral or gemma3, got '" + model.family + "'");
  }
  if (model.device != "cpu" && model.device.rfind("cuda", 0) != 0) {
    fail("model.device must be cpu, cuda or cuda:N, got '" + model.device + "'");
  }
  if (listen.find(':') == std::string::npos) fail("listen must be host:port, got '" + listen + "'");
  if (parallel.context_parallel < 1 || parallel.context_parallel > 4096) {
    fail("parallel.context_parallel must be between 1 and 4096, got " + std::to_string(parallel.context_parallel));
  }
  if (limits.max_tokens_per_request <= 0 || limits.max_sequence_length <= 0) {
    fail("limits.max_tokens_per_request and limits.max_sequence_length must be > 0");
  }
  if (limits.queue_depth <= 0) fail("limits.queue_depth must be > 0");
  if (limits.request_id_cache < 0 || limits.request_id_cache_bytes < 0) {
    fail("limits.request_id_cache and limits.request_id_cache_bytes must be >= 0");
  }
  if (limits.max_request_id_bytes < 1) fail("limits.max_request_id_bytes must be >= 1");
  if (limits.min_chunk < 1 || limits.min_key_chunk < 1 || limits.min_logits_chunk < 1) {
    fail("limits.min_chunk, limits.min_key_chunk and limits.min_logits_chunk must be >= 1");
  }
  if (limits.max_sampled_tokens < 1 || limits.max_sample_rows < 1 || limits.max_kv_cache_bytes < 1) {
    fail("limits.max_sampled_tokens, limits.max_sample_rows and limits.max_kv_cache_bytes must be >= 1");
  }
  if (limits.max_concurrent_exports < 1) fail("limits.max_concurrent_exports must be >= 1");
  if (limits.min_export_chunk_bytes < 1 || limits.min_export_chunk_bytes > (4 << 20)) {
    fail("limits.min_export_chunk_bytes must be in [1, 4194304]");
  }
  if (limits.max_streams < 1) fail("limits.max_streams must be >= 1");
  const std::vector<std::string> scoped = [&] {
    std::vector<std::string> out;
    for (const auto& t : auth.scoped_tokens) out.push_back(t.token);
    return out;
  }();
  for (size_t i = 0; i < auth.scoped_tokens.size(); ++i) {
    const auto& t = auth.scoped_tokens[i];
    const std::string f = "auth.scoped_tokens[" + std::to_string(i) + "]";
    if (t.access != "read" && t.access != "write") fail(f + ".access must be read or write");
    if (t.sessions.empty()) fail(f + ".sessions is empty: name the sessions (or \"prefix*\") it may use");
    if (!sessions.enabled) fail(f + ": scoped tokens need sessions.enabled");
  }
  for (const std::vector<std::string>* list : {&auth.tokens, &auth.read_only_tokens, &scoped}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const auto& t = (*list)[i];
      const std::string field = std::string(list == &auth.tokens            ? "auth.tokens"
                                            : list == &auth.read_only_tokens ? "auth.read_only_tokens"
                                                                             : "auth.scoped_tokens") +
                                "[" + std::to_string(i) + "]" + (list == &scoped ? ".token" : "");
      if (t.size() < kMinTokenLength) {
        fail(field + " is " + std::to_string(t.size()) + " characters; bearer tokens need at least " +
             std::to_string(kMinTokenLength) + " (e.g. `openssl rand -hex 24`)");
      }
      for (unsigned char ch : t) {
        if (ch <= 0x20 || ch >= 0x7f) fail(field + " has a space or a non-printable character");
      }
    }
  }
  if (limits.max_message_bytes < 1024) fail("limits.max_message_bytes must be >= 1024");
  if (limits.max_text_bytes < 1) fail("limits.max_text_bytes must be >= 1");
  if (limits.text_workers < 1 || limits.text_workers > 256) fail("limits.text_workers must be in [1, 256]");
  if (limits.text_queue < 1) fail("limits.text_queue must be >= 1");
  if (limits.text_memory_bytes < (1 << 20)) fail("limits.text_memory_bytes must be >= 1048576");
  if (!model.chat_format.empty()) {
    const auto names = ChatFormat::Names();
    if (std::find(names.begin(), names.end(), model.chat_format) == names.end()) {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      fail("model.chat_format '" + model.chat_format + "' is not one of " + known);
    }
  }
  if (tls.cert.empty() != tls.key.empty()) fail("tls.cert and tls.key go together");
  if (!tls.client_ca.empty() && tls.cert.empty()) fail("tls.client_ca (mutual TLS) needs tls.cert and tls.key");
  if (log.format != "text" && log.format != "json") fail("log.format must be text or json");
  if (log.level != "trace" && log.level != "debug" && log.level != "info" && log.level != "warn" &&
      log.level != "error" && log.level != "off") {
    fail("log.level must be trace, debug, info, warn, error or off, got '" + log.level + "'");
  }
  if (shutdown.grace_seconds < 0) fail("shutdown.grace_seconds must be >= 0");
  if (metrics.dashboard != "auto" && metrics.dashboard != "on" && metrics.dashboard != "off") {
    fail("metrics.dashboard must be auto, on or off, got '" + metrics.dashboard + "'");
  }
  if (!metrics.listen.empty() && metrics.listen.find(':') == std::string::npos) {
    fail("metrics.listen must be host:port or empty (off), got '" + metrics.listen + "'");
  }
  if (history.max_records < 1 || history.max_records > 1000000) {
    fail("history.max_records must be in [1, 1000000], got " + std::to_string(history.max_records));
  }
  if (history.tensorboard && (!history.file || checkpoint_dir.empty())) {
    fail("history.tensorboard needs history.file and checkpoint_dir (the event files go beside metrics.jsonl)");
  }
  if (limits.auto_chunks && limits.memory_budget_bytes <= 0) fail("limits.auto_chunks needs limits.memory_budget_bytes");
  if (rollouts.groups_per_step <= 0) fail("rollouts.groups_per_step must be > 0");
  if (rollouts.max_staleness < 0) fail("rollouts.max_staleness must be >= 0");
  if (rollouts.max_queue <= 0) fail("rollouts.max_queue must be > 0");
  if (!rollouts.grpo.is_object()) fail("rollouts.grpo must be an object of grpo options");
  if (rollouts.checkpoint_every < 0) fail("rollouts.checkpoint_every must be >= 0");
  if (rollouts.checkpoint_every > 0 && checkpoint_dir.empty()) fail("rollouts.checkpoint_every needs checkpoint_dir");
  if (resume && checkpoint_dir.empty()) fail("resume needs checkpoint_dir");
  if (sessions.enabled) {
    if (checkpoint_dir.empty() && sessions.state_dir.empty()) {
      fail("sessions.enabled needs checkpoint_dir (or sessions.state_dir): sessions are written to disk");
    }
    if (sessions.max_sessions < 1 || sessions.max_resident_sessions < 1) {
      fail("sessions.max_sessions and sessions.max_resident_sessions must be >= 1");
    }
    if (sessions.idle_seconds < 0) fail("sessions.idle_seconds must be >= 0");
    if (sessions.max_lora_rank < 1) fail("sessions.max_lora_rank must be >= 1");
    if (sessions.queue_depth < 1) fail("sessions.queue_depth must be >= 1");
    if (sessions.max_snapshots < 0) fail("sessions.max_snapshots must be >= 0 (0: no snapshots)");
    if (sessions.max_snapshot_bytes < 0) fail("sessions.max_snapshot_bytes must be >= 0");
    if (!(sessions.snapshot_ttl_seconds >= 0)) fail("sessions.snapshot_ttl_seconds must be >= 0 (0: kept until deleted)");
    if (!rollouts.log.empty()) fail("rollouts.log is per session with sessions (in their state folders); leave it empty");
    if (resume) fail("resume is for the default session; sessions resume from their state folders by themselves");
  }
  trainer.Validate();
}

json ServerConfig::ToJson(bool mask_secrets) const {
  auto secrets = [mask_secrets](const std::vector<std::string>& tokens) {
    if (!mask_secrets) return json(tokens);
    json out = json::array();
    for (size_t i = 0; i < tokens.size(); ++i) out.push_back("***");
    return out;
  };
  return json{{"model", {{"dir", model.dir}, {"preset", model.preset}, {"family", model.family},
                         {"seed", model.seed},
                         {"dtype", model.dtype}, {"device", model.device}, {"chat_format", model.chat_format}}},
              {"trainer", trainer.ToJson()},
              {"listen", listen},
              {"threads", threads},
              {"limits", {{"max_tokens_per_request", limits.max_tokens_per_request},
                          {"max_sequence_length", limits.max_sequence_length},
                          {"max_message_bytes", limits.max_message_bytes},
                          {"max_text_bytes", limits.max_text_bytes},
                          {"text_workers", limits.text_workers},
                          {"text_queue", limits.text_queue},
                          {"text_memory_bytes", limits.text_memory_bytes},
                          {"queue_depth", limits.queue_depth},
                          {"memory_budget_bytes", limits.memory_budget_bytes},
                          {"request_id_cache", limits.request_id_cache},
                          {"request_id_cache_bytes", limits.request_id_cache_bytes},
                          {"max_request_id_bytes", limits.max_request_id_bytes},
                          {"auto_chunks", limits.auto_chunks},
                          {"min_chunk", limits.min_chunk},
                          {"min_key_chunk", limits.min_key_chunk},
                          {"min_logits_chunk", limits.min_logits_chunk},
                          {"max_sampled_tokens", limits.max_sampled_tokens},
                          {"max_sample_rows", limits.max_sample_rows},
                          {"max_kv_cache_bytes", limits.max_kv_cache_bytes},
                          {"max_concurrent_exports", limits.max_concurrent_exports},
                          {"min_export_chunk_bytes", limits.min_export_chunk_bytes},
                          {"max_streams", limits.max_streams}}},
              {"auth", {{"tokens", secrets(auth.tokens)},
                        {"read_only_tokens", secrets(auth.read_only_tokens)},
                        {"scoped_tokens", [&] {
                           json out = json::array();
                           for (const auto& t : auth.scoped_tokens) {
                             out.push_back({{"token", mask_secrets ? "***" : t.token},
                                            {"sessions", t.sessions},
                                            {"access", t.access},
                                            {"create", t.create}});
                           }
                           return out;
                         }()},
                        {"reflection_without_token", auth.reflection_without_token}}},
              {"tls", {{"cert", tls.cert}, {"key", tls.key}, {"client_ca", tls.client_ca}}},
              {"checkpoint_dir", checkpoint_dir},
              {"shutdown", {{"grace_seconds", shutdown.grace_seconds}, {"checkpoint_on_exit", shutdown.checkpoint_on_exit}}},
              {"log", {{"format", log.format}, {"level", log.level}}},
              {"keepalive", {{"time_ms", keepalive.time_ms}, {"timeout_ms", keepalive.timeout_ms}}},
              {"metrics", {{"listen", metrics.listen}, {"dashboard", metrics.dashboard}}},
              {"parallel", {{"context_parallel", parallel.context_parallel}}},
              {"history",
               {{"max_records", history.max_records}, {"file", history.file}, {"tensorboard", history.tensorboard}}},
              {"rollouts", {{"groups_per_step", rollouts.groups_per_step},
                            {"max_staleness", rollouts.max_staleness},
                            {"max_queue", rollouts.max_queue},
                            {"log", rollouts.log},
                            {"grpo", rollouts.grpo},
                            {"checkpoint_every", rollouts.checkpoint_every},
                            {"audit_log", rollouts.audit_log}}},
              {"sessions", {{"enabled", sessions.enabled},
                            {"max_sessions", sessions.max_sessions},
                            {"max_resident_sessions", sessions.max_resident_sessions},
                            {"idle_seconds", sessions.idle_seconds},
                            {"allow_full_finetuning", sessions.allow_full_finetuning},
                            {"max_lora_rank", sessions.max_lora_rank},
                            {"queue_depth", sessions.queue_depth},
                            {"state_dir", sessions.state_dir},
                            {"metrics_label", sessions.metrics_label},
                            {"max_snapshots", sessions.max_snapshots},
                            {"max_snapshot_bytes", sessions.max_snapshot_bytes},
                            {"snapshot_ttl_seconds", sessions.snapshot_ttl_seconds}}},
              {"resume", resume}};
}

std::string ServerConfig::sessions_dir() const {
  if (!sessions.state_dir.empty()) return sessions.state_dir;
  return checkpoint_dir.empty() ? "" : checkpoint_dir + "/.sessions";
}

ModelSource ServerConfig::model_source() const {
  ModelSource m;
  m.dir = model.dir;
  m.preset = model.preset;
  m.family = model.family;
  m.seed = model.seed;
  m.dtype = model.dtype;
  m.device = model.device;
  return m;
}

}  // namespace streambp::server
