// streambp: the command-line client of streambp-server.
//
// Exit status: 0 done; 1 the server answered with an error (the gRPC code and the server's
// message are printed), or a local file could not be read or written; 2 the command line is
// wrong (CLI11's own codes are folded into 2); 3 no server answered at --server.
#include <cstdio>
#include <exception>
#include <functional>

#include <CLI/CLI.hpp>

#include "common.h"
#include "streambp/command_hint.h"

int main(int argc, char** argv) {
  using namespace streambp::cli;
  CLI::App app{"streambp: command-line client of streambp-server (streambp.v1.Trainer)"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.set_version_flag("--version", std::string("streambp ") + STREAMBP_VERSION + " (protocol streambp.v1)");
  app.footer("Exit status: 0 done, 1 error from the server (code and message printed), 2 bad command line, "
             "3 no server at --server.");
  ConnectionFlags conn;
  std::function<int()> run;

  auto* info = app.add_subcommand("info", "what the server runs: model, dtype, device, engine, policy version");
  AddConnectionFlags(info, conn);
  info->callback([&] { run = [&] { return Info(conn); }; });

  TrainArgs train;
  auto* train_cmd = app.add_subcommand("train", "one TrainStep per step over a JSONL file");
  AddConnectionFlags(train_cmd, conn);
  train_cmd->add_option("--objective", train.objective,
                        "sft | dpo | grpo | weighted (the data format; weighted: a client's custom loss, "
                        "{\"tokens\",\"weights\"} per line)")
      ->check(CLI::IsMember({"sft", "dpo", "grpo", "weighted"}))
      ->capture_default_str();
  train_cmd->add_option("--weights-version", train.weights_version,
                        "weighted: the policy version the weights were computed at (refused once the policy has "
                        "moved; -1 = not checked)")
      ->capture_default_str();
  train_cmd->add_option("--data", train.data, "JSONL file in the objective's format")->required();
  auto* batch_tokens = train_cmd->add_option("--batch-tokens", train.batch_tokens,
                                             "tokens per step: whole examples packed greedily")
                           ->capture_default_str();
  train_cmd->add_option("--batch-size", train.batch_size, "examples per step (a DPO pair, a GRPO group = one)")
      ->excludes(batch_tokens);
  train_cmd->add_option("--steps", train.steps, "steps to run (default: one pass; the data cycles when larger)");
  train_cmd->add_option("--objective-options", train.objective_options,
                        "the objective's options as a JSON object, e.g. '{\"beta\":0.1,\"loss_type\":\"ipo\"}'");
  AddEngineFlags(train_cmd, train.engine);
  train_cmd->callback([&] { run = [&] { return Train(conn, train); }; });

  SampleArgs sample;
  auto* sample_cmd = app.add_subcommand("sample", "completions of a text prompt or a user message, from the policy");
  AddConnectionFlags(sample_cmd, conn);
  auto* prompt_opt = sample_cmd->add_option("--prompt", sample.prompt, "the prompt as plain text");
  auto* ids_opt = sample_cmd->add_option("--prompt-ids", sample.prompt_ids,
                                         "the prompt as token ids, e.g. 1,5,9 (models without a tokenizer)")
                      ->delimiter(',')
                      ->excludes(prompt_opt);
  sample_cmd->add_option("--user", sample.user, "a user message, rendered with the model's chat format")
      ->excludes(prompt_opt)
      ->excludes(ids_opt);
  sample_cmd->add_option("--system", sample.system, "a system message before --user");
  sample_cmd->add_option("-n", sample.n, "completions")->check(CLI::Range(1, 256));
  sample_cmd->add_option("--max-tokens", sample.max_tokens, "new tokens per completion")->check(CLI::PositiveNumber);
  sample_cmd->add_option("--temperature", sample.temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  sample_cmd->add_option("--top-p", sample.top_p, "nucleus sampling")->check(CLI::Range(0.0, 1.0));
  sample_cmd->add_option("--seed", sample.seed, "same seed and policy version -> same samples (-1 = random)");
  sample_cmd->add_flag("--ignore-eos", sample.ignore_eos, "do not stop at the model's end tokens");
  sample_cmd->add_flag("--no-thinking", sample.no_thinking, "qwen3: the non-thinking generation prompt");
  sample_cmd->add_flag("--json", sample.json, "one JSON object per completion (text, tokens, logprobs)");
  sample_cmd->add_option("--snapshot", sample.snapshot,
                         "from a sampler snapshot of the session (streambp snapshot save) instead of its weights now");
  sample_cmd->callback([&] { run = [&] { return Sample(conn, sample); }; });

  LogprobsArgs logprobs;
  auto* logprobs_cmd = app.add_subcommand("logprobs", "per-token log-probs of sequences (JSONL in the sft format)");
  AddConnectionFlags(logprobs_cmd, conn);
  logprobs_cmd->add_option("--data", logprobs.data, "JSONL file: {\"tokens\":[...]} or {\"prompt\",\"completion\"}")
      ->required();
  logprobs_cmd->add_flag("--reference", logprobs.reference, "under the frozen reference model instead of the policy");
  logprobs_cmd->add_option("--temperature", logprobs.temperature, "logits / temperature (default 1)")->default_str("")
      ->check(CLI::PositiveNumber);
  logprobs_cmd->add_option("--out", logprobs.out, "output JSONL file (default: stdout)");
  logprobs_cmd->add_option("--batch-tokens", logprobs.batch_tokens, "tokens per request")->capture_default_str();
  logprobs_cmd->callback([&] { run = [&] { return Logprobs(conn, logprobs); }; });

  std::string save_name, load_name;
  auto* save = app.add_subcommand("save", "save a checkpoint in the server's checkpoint directory");
  AddConnectionFlags(save, conn);
  save->add_option("--name", save_name, "checkpoint name (default: step-<step>)");
  save->callback([&] { run = [&] { return Save(conn, save_name); }; });
  auto* load = app.add_subcommand("load", "load a checkpoint from the server's checkpoint directory");
  AddConnectionFlags(load, conn);
  load->add_option("--name", load_name, "checkpoint name (default: the newest complete one)");
  load->callback([&] { run = [&] { return Load(conn, load_name); }; });

  std::string export_dir;
  bool export_merged = false;
  auto* export_cmd = app.add_subcommand(
      "export-weights",
      "write DIR/model.safetensors + config.json (verified by SHA-256); for an adapter session its PEFT adapter");
  export_cmd->alias("export");
  AddConnectionFlags(export_cmd, conn);
  export_cmd->add_option("--out", export_dir, "output folder (created if needed)")->required();
  export_cmd->add_flag("--merged", export_merged, "adapter session: the base with the adapter folded in");
  std::string export_snapshot;
  export_cmd->add_option("--snapshot", export_snapshot, "a sampler snapshot of the session (streambp snapshot save)");
  export_cmd->callback([&] { run = [&] { return ExportWeights(conn, export_dir, export_merged, export_snapshot); }; });

  // streambp session create|list|get|delete
  SessionArgs session_args;
  std::string session_name;
  auto* session_cmd = app.add_subcommand("session", "sessions of a server: create, list, get, delete");
  session_cmd->require_subcommand(1);
  auto* create = session_cmd->add_subcommand("create", "a new session (prints its name)");
  AddConnectionFlags(create, conn);
  AddSessionName(create, session_args.name);
  create->add_flag("--exist-ok", session_args.exist_ok,
                   "a session of that name already there is used as it is (get-or-create, for scripts run again)");
  create->add_option("--lora-rank", session_args.lora_rank, "adapter rank")->capture_default_str();
  create->add_option("--lora-alpha", session_args.lora_alpha, "adapter alpha (default 2 x rank)")->default_str("");
  create->add_option("--lora-targets", session_args.lora_targets, "modules to adapt (default the seven projections)")
      ->delimiter(',');
  create->add_option("--lora-modules-to-save", session_args.lora_modules_to_save,
                     "modules trained as full copies: gate (the mixture-of-experts router; frozen by default)")
      ->delimiter(',');
  create->add_flag("--use-rslora", session_args.use_rslora, "scale alpha / sqrt(rank)");
  create->add_option("--seed", session_args.seed, "initialization of the adapter");
  create->add_option("--adapter", session_args.adapter, "start from this PEFT adapter folder");
  create->add_flag("--full", session_args.full, "full fine-tuning of a copy of the base (where allowed)");
  create->add_option("--optimizer", session_args.optimizer, "adamw | sgd (default: the server's)");
  create->add_option("--lr", session_args.lr, "learning rate (default: the server's)")->default_str("");
  create->add_option("--weight-decay", session_args.weight_decay, "weight decay (default: the server's)");
  create->add_option("--groups-per-step", session_args.groups_per_step,
                     "rollout groups per server-side step (default: the server's)")
      ->default_str("");
  create->callback([&] { run = [&] { return SessionCreate(conn, session_args); }; });
  auto* list = session_cmd->add_subcommand("list", "the sessions this token may see");
  AddConnectionFlags(list, conn);
  list->callback([&] { run = [&] { return SessionList(conn); }; });
  auto* get = session_cmd->add_subcommand("get", "one session");
  AddConnectionFlags(get, conn);
  AddSessionName(get, session_name);
  get->callback([&] { run = [&] { return SessionGet(conn, session_name); }; });
  auto* del = session_cmd->add_subcommand("delete", "delete a session (its checkpoints stay)");
  AddConnectionFlags(del, conn);
  AddSessionName(del, session_name);
  del->callback([&] { run = [&] { return SessionDelete(conn, session_name); }; });

  // streambp snapshot save|list|delete
  SnapshotArgs snapshot;
  auto* snapshot_cmd = app.add_subcommand("snapshot", "sampler snapshots of a session (--session): save, list, delete");
  snapshot_cmd->require_subcommand(1);
  auto* snap_save = snapshot_cmd->add_subcommand("save", "freeze the session's weights now under NAME");
  AddConnectionFlags(snap_save, conn);
  snap_save->add_option("name", snapshot.name, "snapshot name ([A-Za-z0-9._-], at most 64)")->required();
  snap_save->add_option("--ttl", snapshot.ttl_seconds, "seconds until it is removed (default: the server's)")
      ->check(CLI::NonNegativeNumber);
  snap_save->add_flag("--replace-oldest", snapshot.replace_oldest,
                      "at the session's bound, remove the oldest snapshots to make room");
  snap_save->callback([&] { run = [&] { return SnapshotSave(conn, snapshot); }; });
  auto* snap_list = snapshot_cmd->add_subcommand("list", "the session's snapshots, oldest first");
  AddConnectionFlags(snap_list, conn);
  snap_list->callback([&] { run = [&] { return SnapshotList(conn); }; });
  auto* snap_del = snapshot_cmd->add_subcommand("delete", "remove a snapshot");
  AddConnectionFlags(snap_del, conn);
  snap_del->add_option("name", snapshot.name, "snapshot name")->required();
  snap_del->callback([&] { run = [&] { return SnapshotDelete(conn, snapshot.name); }; });

  EstimateArgs estimate;
  auto* estimate_cmd = app.add_subcommand("estimate", "predicted peak memory of a step and whether it fits");
  AddConnectionFlags(estimate_cmd, conn);
  estimate_cmd->add_option("--seq-len", estimate.seq_len, "tokens per sequence")->required()->check(CLI::PositiveNumber);
  estimate_cmd->add_option("--batch", estimate.batch, "sequences")->check(CLI::PositiveNumber)->capture_default_str();
  AddEngineFlags(estimate_cmd, estimate.engine);
  estimate_cmd->callback([&] { run = [&] { return Estimate(conn, estimate); }; });

  HistoryArgs history;
  auto* history_cmd = app.add_subcommand("history", "the session's training history: a line per optimizer step");
  AddConnectionFlags(history_cmd, conn);
  history_cmd->add_option("--after", history.after, "only records with a larger index")
      ->check([](const std::string& v) {
        return !v.empty() && v.front() == '-' ? "must be a record index >= 0, got " + v : std::string();
      })
      ->capture_default_str();
  history_cmd->add_flag("--jsonl", history.jsonl, "JSON lines (the server's metrics.jsonl format) instead of a table");
  history_cmd->callback([&] { run = [&] { return History(conn, history); }; });

  if (const auto unknown = streambp::UnknownCommand(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "error: %s\n", unknown.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, the version, or what is wrong
    return code == 0 ? 0 : 2;
  }
  try {
    return run();
  } catch (const streambp::client::ClientError& e) {
    std::fflush(stdout);
    const bool unreachable = e.code() == grpc::StatusCode::UNAVAILABLE || e.code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (unreachable && (IsConnectionFailure(e.message()) || LastChannelDown())) {
      const std::string why = e.code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                  ? "still not connected when the deadline passed"
                                  : e.message();
      std::fprintf(stderr, "error: no server at %s (%s); start one with `streambp-server serve`, or give --server\n",
                   conn.server.c_str(), why.c_str());
      return 3;
    }
    std::fprintf(stderr, "error: %s: %s\n", streambp::client::StatusCodeName(e.code()), e.message().c_str());
    if (const auto hint = CommandLineHint(e.message()); !hint.empty()) std::fprintf(stderr, "  (%s)\n", hint.c_str());
    if (e.code() == grpc::StatusCode::INVALID_ARGUMENT && e.message().rfind("--", 0) == 0) return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: INTERNAL: %s\n", e.what());
  }
  return 1;
}
