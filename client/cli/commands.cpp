// streambp info | logprobs | save | load | export-weights | estimate.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common.h"
#include "streambp/client/data.h"

namespace streambp::cli {
namespace {

std::string Chunk(int64_t n) { return n > 0 ? std::to_string(n) : n == 0 ? "auto" : "default"; }

std::string Count(int64_t n) {
  char buf[64];
  if (n >= 1000000000) {
    std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  } else if (n >= 1000000) {
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  } else if (n >= 1000) {
    std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", (long long)n);
  }
  return buf;
}

// Writes `text` to `path` through a temporary file and a rename.
void WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw client::ClientError(grpc::StatusCode::INTERNAL, "cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw client::ClientError(grpc::StatusCode::INTERNAL, "cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace

int Info(const ConnectionFlags& conn) {
  auto client = Connect(conn);
  const auto i = Check(client->GetInfo());
  std::printf("server:       %s at %s\n", i.server_version().empty() ? "streambp-server" : i.server_version().c_str(),
              conn.server.c_str());
  std::printf("model:        %s, %s parameters\n", i.architecture().c_str(), Count(i.num_parameters()).c_str());
  std::printf("sizes:        %lld layers, hidden %lld, %lld heads (%lld kv) x %lld, vocab %lld\n",
              (long long)i.num_layers(), (long long)i.hidden_size(), (long long)i.num_heads(),
              (long long)i.num_kv_heads(), (long long)i.head_dim(), (long long)i.vocab_size());
  std::printf("dtype:        %s on %s (world size %d%s)\n", i.dtype().c_str(), i.device().c_str(),
              i.world_size() > 0 ? i.world_size() : 1,
              i.context_parallel() > 1 ? (", each sequence split over " + std::to_string(i.context_parallel()) + " ranks").c_str()
                                       : "");
  std::printf("engine:       %s (chunk %s, logits chunk %s, key chunk %s)\n", i.engine().c_str(),
              Chunk(i.chunk()).c_str(), Chunk(i.logits_chunk()).c_str(), Chunk(i.key_chunk()).c_str());
  std::printf("policy:       version %lld, step %lld, %lld pending micro-batches\n", (long long)i.policy_version(),
              (long long)i.step(), (long long)i.pending_micro_batches());
  std::printf("optimizer:    %s, lr %.3e\n", i.optimizer().c_str(), i.learning_rate());
  std::printf("limits:       max sequence length %s, max tokens per request %s\n",
              i.max_sequence_length() > 0 ? std::to_string(i.max_sequence_length()).c_str() : "none",
              i.max_tokens_per_request() > 0 ? std::to_string(i.max_tokens_per_request()).c_str() : "none");
  std::printf("reference:    %s\n", i.reference_model() ? "frozen reference model loaded" : "none");
  std::printf("runtime:      %s\n", i.runtime().c_str());
  return 0;
}

int Logprobs(const ConnectionFlags& conn, const LogprobsArgs& args) {
  if (args.batch_tokens <= 0) throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT, "--batch-tokens must be > 0");
  auto all = client::ReadBatchJsonl(args.data, "sft");
  std::ofstream file;
  if (!args.out.empty()) {
    file.open(args.out, std::ios::trunc);
    if (!file) throw client::ClientError(grpc::StatusCode::NOT_FOUND, "cannot write " + args.out);
  }
  std::ostream& out = args.out.empty() ? std::cout : file;
  auto client = Connect(conn);
  if (client::BatchHasText(all)) {  // text: the ids (and targets) the server's tokenizer gives
    v1::TokenizeRequest tokenize;
    *tokenize.mutable_batch() = all;
    all = Check(client->Tokenize(tokenize)).batch();
  }
  const auto batches = client::SplitByTokens(all, args.batch_tokens);
  int64_t index = 0;
  for (const auto& batch : batches) {
    v1::ComputeLogprobsRequest request;
    request.set_reference(args.reference);
    if (args.temperature > 0) request.set_temperature(args.temperature);
    for (const auto& e : batch.sft().examples()) {
      const auto tokens = client::SequenceTokens(e);
      request.add_sequences()->mutable_tokens()->Add(tokens.begin(), tokens.end());
    }
    const auto response = Check(client->ComputeLogprobs(request));
    if (response.sequences_size() != batch.sft().examples_size()) {
      throw client::ClientError(grpc::StatusCode::INTERNAL,
                                "ComputeLogprobs answered " + std::to_string(response.sequences_size()) +
                                    " sequences for " + std::to_string(batch.sft().examples_size()));
    }
    for (int s = 0; s < response.sequences_size(); ++s) {
      const auto targets = client::SequenceTargets(batch.sft().examples(s));
      const auto& lp = response.sequences(s).logprobs();
      // logprobs[i] predicts token i+1; sum over the targets (loss_mask / completion).
      double target_logp = 0;
      for (int i = 0; i < lp.size() && i + 1 < static_cast<int>(targets.size()); ++i) {
        if (targets[i + 1]) target_logp += lp[i];
      }
      nlohmann::json line = {{"index", index++},
                             {"policy_version", response.policy_version()},
                             {"target_logp", target_logp},
                             {"logprobs", std::vector<double>(lp.begin(), lp.end())}};
      out << line.dump() << '\n';
    }
  }
  out.flush();
  if (!out) throw client::ClientError(grpc::StatusCode::INTERNAL, "cannot write " + args.out);
  if (!args.out.empty()) {
    std::fprintf(stderr, "wrote log-probs of %lld sequences to %s\n", (long long)index, args.out.c_str());
  }
  return 0;
}

int Save(const ConnectionFlags& conn, const std::string& name) {
  auto client = Connect(conn);
  v1::SaveCheckpointRequest request;
  request.set_name(name);
  const auto r = Check(client->SaveCheckpoint(request));
  std::printf("saved checkpoint %s: step %lld, policy version %lld, %s\n", r.name().c_str(), (long long)r.step(),
              (long long)r.policy_version(), Bytes(r.bytes()).c_str());
  return 0;
}

int Load(const ConnectionFlags& conn, const std::string& name) {
  auto client = Connect(conn);
  v1::LoadCheckpointRequest request;
  request.set_name(name);
  const auto r = Check(client->LoadCheckpoint(request));
  std::printf("loaded checkpoint %s: step %lld, policy version %lld\n", r.name().c_str(), (long long)r.step(),
              (long long)r.policy_version());
  return 0;
}

int ExportWeights(const ConnectionFlags& conn, const std::string& out_dir, bool merged, const std::string& snapshot) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw client::ClientError(grpc::StatusCode::INTERNAL, "cannot create " + out_dir + ": " + ec.message());
  auto client = Connect(conn);
  // The file's name depends on what the server sends (a model, or a session's adapter).
  const std::string received_path = (std::filesystem::path(out_dir) / ".export.safetensors").string();
  const bool tty = isatty(fileno(stderr));
  auto progress = [&](int64_t received, int64_t total) {
    if (tty) std::fprintf(stderr, "\rreceiving weights: %s / %s\033[K", Bytes(received).c_str(), Bytes(total).c_str());
  };
  v1::ExportWeightsRequest request;
  request.set_merged(merged);
  request.set_snapshot(snapshot);
  request.set_with_files(true);  // the tokenizer etc.: the folder loads in transformers / vLLM as is
  auto result = client->ExportWeightsToFile(received_path, request, {}, progress);
  if (tty) std::fprintf(stderr, "\r\033[K");
  const auto w = Check(std::move(result));
  const bool adapter = w.format == "peft_adapter";
  if (w.config_json.empty()) {
    throw client::ClientError(grpc::StatusCode::DATA_LOSS, "the server sent no configuration with the weights");
  }
  const std::string weights_path =
      (std::filesystem::path(out_dir) / (adapter ? "adapter_model.safetensors" : "model.safetensors")).string();
  std::filesystem::rename(received_path, weights_path, ec);
  if (ec) throw client::ClientError(grpc::StatusCode::INTERNAL, "cannot rename to " + weights_path + ": " + ec.message());
  const std::string config_path =
      (std::filesystem::path(out_dir) / (adapter ? "adapter_config.json" : "config.json")).string();
  WriteFileAtomically(config_path, w.config_json);
  std::string others;
  for (const auto& [name, bytes] : w.files) {
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
      throw client::ClientError(grpc::StatusCode::DATA_LOSS, "the server sent a file with a bad name: " + name);
    }
    WriteFileAtomically((std::filesystem::path(out_dir) / name).string(), bytes);
    others += " " + name;
  }
  std::printf("exported %s of policy version %lld: %lld bytes, sha256 %s\n",
              adapter ? "the PEFT adapter" : "the weights", (long long)w.policy_version, (long long)w.total_bytes,
              w.sha256.c_str());
  std::printf("wrote %s and %s%s%s\n", weights_path.c_str(), config_path.c_str(), others.empty() ? "" : ", with",
              others.c_str());
  return 0;
}

int Sample(const ConnectionFlags& conn, const SampleArgs& args) {
  if (args.prompt.empty() && args.user.empty() && args.prompt_ids.empty()) {
    throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT,
                              "--prompt: give the prompt as text (--prompt TEXT), token ids (--prompt-ids 1,5,9) or a "
                              "user message (--user TEXT)");
  }
  v1::SampleRequest request;
  if (!args.prompt_ids.empty()) {
    auto* ids = request.add_prompts();
    for (const int32_t t : args.prompt_ids) ids->add_tokens(t);
  } else if (!args.prompt.empty()) {
    request.add_text_prompts()->set_text(args.prompt);
  } else {
    auto* text = request.add_text_prompts();
    if (!args.system.empty()) {
      auto* m = text->add_messages();
      m->set_role("system");
      m->set_content(args.system);
    }
    auto* m = text->add_messages();
    m->set_role("user");
    m->set_content(args.user);
    if (args.no_thinking) text->set_enable_thinking(false);
  }
  request.set_n(args.n);
  request.set_max_tokens(args.max_tokens);
  request.set_temperature(args.temperature);
  request.set_top_p(args.top_p);
  if (args.seed >= 0) request.set_seed(static_cast<uint64_t>(args.seed));
  request.set_ignore_eos(args.ignore_eos);
  request.set_snapshot(args.snapshot);
  auto client = Connect(conn);
  const auto r = Check(client->Sample(request));
  for (const auto& c : r.completions()) {
    if (args.json) {
      nlohmann::json line = {{"text", c.text()},
                             {"tokens", std::vector<int32_t>(c.tokens().begin(), c.tokens().end())},
                             {"logprobs", std::vector<float>(c.logprobs().begin(), c.logprobs().end())},
                             {"finish_reason", c.finish_reason()},
                             {"policy_version", r.policy_version()}};
      std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      if (c.text().empty() && c.tokens_size() > 0) {  // a model without a tokenizer: the ids
        std::string ids;
        for (const int32_t t : c.tokens()) ids += (ids.empty() ? "" : ",") + std::to_string(t);
        std::printf("%s\n", ids.c_str());
      } else {
        std::printf("%s\n", c.text().c_str());
      }
      if (r.completions_size() > 1) std::printf("---\n");
    }
  }
  if (!args.json) {
    std::fprintf(stderr, "(%d completion%s, policy version %lld)\n", r.completions_size(),
                 r.completions_size() == 1 ? "" : "s", (long long)r.policy_version());
  }
  return 0;
}

int Estimate(const ConnectionFlags& conn, const EstimateArgs& args) {
  auto client = Connect(conn);
  v1::EstimateMemoryRequest request;
  request.set_seq_len(args.seq_len);
  request.set_batch(args.batch);
  *request.mutable_engine() = ToProto(args.engine);
  const auto r = Check(client->EstimateMemory(request));
  std::printf("step of %lld x %lld tokens, %s engine (chunk %s, logits chunk %s, key chunk %s)\n",
              (long long)args.batch, (long long)args.seq_len, r.engine().c_str(), Chunk(r.chunk()).c_str(),
              Chunk(r.logits_chunk()).c_str(), Chunk(r.key_chunk()).c_str());
  std::printf("weights:      %s\n", Bytes(r.weights_bytes()).c_str());
  std::printf("gradients:    %s\n", Bytes(r.gradient_bytes()).c_str());
  std::printf("optimizer:    %s\n", Bytes(r.optimizer_bytes()).c_str());
  std::printf("activations:  %s (peak)\n", Bytes(r.activation_bytes()).c_str());
  std::printf("total:        %s\n", Bytes(r.total_bytes()).c_str());
  if (r.budget_bytes() > 0) {
    std::printf("fits:         %s (budget %s)\n", r.fits() ? "yes" : "NO", Bytes(r.budget_bytes()).c_str());
  } else {
    std::printf("fits:         %s (no budget configured)\n", r.fits() ? "yes" : "NO");
  }
  return 0;
}

namespace {

void PrintSession(const v1::SessionInfo& s) {
  std::printf("%-24s %-5s %-14s step %-6lld version %-6lld %-9s %10s  %s lr %.3e  idle %s\n", s.name().c_str(),
              s.kind().c_str(),
              s.kind() == "lora" ? ("r " + std::to_string(s.lora().r()) + " a " + std::to_string(static_cast<int>(s.lora().alpha()))).c_str() : "-",
              (long long)s.step(), (long long)s.policy_version(), s.resident() ? "resident" : "on disk",
              Bytes(s.device_bytes()).c_str(), s.optimizer().c_str(), s.learning_rate(), Duration(s.idle_seconds()).c_str());
}

}  // namespace

void AddSessionName(CLI::App* cmd, std::string& name) {
  cmd->add_option("name", name, "session name ([A-Za-z0-9._-], at most 64)");
  cmd->add_option("--name", name, "the same, as an option");
}

namespace {

void RequireName(const std::string& name, const std::string& command) {
  if (name.empty()) {
    throw client::ClientError(grpc::StatusCode::INVALID_ARGUMENT,
                              "--name: give the session's name: streambp session " + command + " NAME (or --name NAME)");
  }
}

}  // namespace

int SessionCreate(const ConnectionFlags& conn, const SessionArgs& a) {
  RequireName(a.name, "create");
  v1::CreateSessionRequest request;
  request.set_name(a.name);
  if (a.full) {
    request.set_full(true);
  } else if (!a.adapter.empty()) {
    auto read = [](const std::filesystem::path& p) {
      std::ifstream in(p, std::ios::binary);
      if (!in) throw client::ClientError(grpc::StatusCode::NOT_FOUND, "cannot read " + p.string());
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    };
    request.mutable_adapter()->set_adapter_config_json(read(std::filesystem::path(a.adapter) / "adapter_config.json"));
    request.mutable_adapter()->set_adapter_model_safetensors(
        read(std::filesystem::path(a.adapter) / "adapter_model.safetensors"));
  } else {
    auto* l = request.mutable_lora();
    l->set_r(static_cast<int32_t>(a.lora_rank));
    if (a.lora_alpha > 0) l->set_alpha(a.lora_alpha);
    for (const auto& t : a.lora_targets) l->add_target_modules(t);
    for (const auto& m : a.lora_modules_to_save) l->add_modules_to_save(m);
    l->set_use_rslora(a.use_rslora);
    l->set_seed(a.seed);
  }
  auto* o = request.mutable_training()->mutable_optimizer();
  o->set_name(a.optimizer);
  if (a.lr > 0) o->set_lr(a.lr);
  if (a.weight_decay >= 0) o->set_weight_decay(a.weight_decay);
  if (a.groups_per_step > 0) request.mutable_rollouts()->set_groups_per_step(a.groups_per_step);
  auto client = Connect(conn);
  auto created = client->CreateSession(request);
  if (!created.ok() && a.exist_ok && created.status().error_code() == grpc::StatusCode::ALREADY_EXISTS) {
    // get-or-create: the session stays as it is (its settings are not compared with these)
    const auto s = Check(client->GetSession(a.name));
    std::fprintf(stderr, "session %s exists already: used as it is (step %lld)\n", s.name().c_str(), (long long)s.step());
    std::printf("%s\n", s.name().c_str());
    return 0;
  }
  const auto s = Check(std::move(created));
  std::printf("%s\n", s.name().c_str());
  return 0;
}

int SessionList(const ConnectionFlags& conn) {
  auto client = Connect(conn);
  const auto list = Check(client->ListSessions());
  for (const auto& s : list.sessions()) PrintSession(s);
  if (list.sessions_size() == 0) {
    std::fprintf(stderr, "no sessions yet (this server holds up to %lld, %lld resident at once); create one with "
                         "`streambp session create NAME`\n",
                 (long long)list.max_sessions(), (long long)list.max_resident_sessions());
  } else {
    std::fprintf(stderr, "%d session%s (the server holds up to %lld, %lld resident at once)\n", list.sessions_size(),
                 list.sessions_size() == 1 ? "" : "s", (long long)list.max_sessions(),
                 (long long)list.max_resident_sessions());
  }
  return 0;
}

int SessionGet(const ConnectionFlags& conn, const std::string& name) {
  RequireName(name, "get");
  auto client = Connect(conn);
  PrintSession(Check(client->GetSession(name)));
  return 0;
}

int SessionDelete(const ConnectionFlags& conn, const std::string& name) {
  RequireName(name, "delete");
  auto client = Connect(conn);
  std::printf("deleted %s\n", Check(client->DeleteSession(name)).name().c_str());
  return 0;
}

}  // namespace streambp::cli
