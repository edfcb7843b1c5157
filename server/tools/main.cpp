// streambp-server: the training service and its local tools.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include "streambp/command_hint.h"
#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/memory.h"
#include "streambp/runtime.h"
#include "config.h"
#include "tools.h"
#include "health_tool.h"
#include "serve_tool.h"
#include "train_tool.h"

namespace {

void AddModelFlags(CLI::App* cmd, streambp::ModelSource& m) {
  cmd->add_option("--model", m.dir, "Hugging Face model folder (config.json + safetensors); "
                                    "default: the embedded preset");
  cmd->add_option("--preset", m.preset, "embedded model when --model is not given: tiny | small | qwen3-8b | qwen3-30b-a3b")
      ->check(CLI::IsMember(streambp::PresetNames()));
  cmd->add_option("--family", m.family, "architecture of the embedded model: llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3")
      ->check(CLI::IsMember(streambp::FamilyNames()));
  cmd->add_option("--seed", m.seed, "seed of the embedded model");
  cmd->add_option("--dtype", m.dtype, "float32 | float64 | bfloat16 | float16")
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "float16"}));
  cmd->add_option("--device", m.device, "cpu | cuda | cuda:N (the batches follow the model there)");
}

void AddEngineFlags(CLI::App* cmd, streambp::tools::EngineFlags& f) {
  cmd->add_option("--chunk", f.chunk, "stream: query positions per layer chunk (0 = default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--logits-chunk", f.logits_chunk,
                  "positions per lm_head+loss chunk (0 = all at once, -1 = default)")
      ->check(CLI::Range(-1, 1 << 30));
  cmd->add_option("--key-chunk", f.key_chunk, "stream: keys per attention tile inside a chunk (0 = default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--keep-attention", f.keep_attention,
                "stream: keep each layer's attention output and log-sum-exp from the forward, so the backward "
                "skips attention's forward tiles (faster; costs L x T x (q_dim + heads) values more; "
                "docs/architecture.md#engines)");
  cmd->add_option("--context-exchange", f.context_exchange,
                  "with --context-parallel: heads (each rank attends a share of the heads over the whole sequence), "
                  "kv (each rank gathers every rank's K/V), auto (heads where they split over the ranks)")
      ->check(CLI::IsMember({"auto", "heads", "kv"}));
}

// `--version`: what was built and what it runs on (docs/architecture.md: Build and runtime: speed depends on the BLAS).
std::string BuildInfo() {
  const auto rt = streambp::GetRuntimeInfo();
#if defined(STREAMBP_WITH_CUDA)
  const std::string cuda = std::string("built with CUDA; device ") + (rt.cuda ? "available" : "not available");
#else
  const std::string cuda = "CPU-only build (no CUDA)";
#endif
#if defined(__clang__)
  const std::string compiler = "clang " __clang_version__;
#else
  const std::string compiler = "GCC " __VERSION__;
#endif
  return "streambp-server " STREAMBP_VERSION "\nLibTorch " + rt.torch_version + "\nBLAS " + rt.blas_kernels() + "\n" + cuda +
         "\ncompiler " + compiler + ", C++" + std::to_string(__cplusplus / 100 % 100);
}

}  // namespace

int main(int argc, char** argv) {
  streambp::UseCpuBlasKernels(argv);  // may restart the process with OpenBLAS's kernels for this CPU
  streambp::memory::InstallTrackingAllocator();
  CLI::App app{"streambp-server: exact StreamBP training as a service"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "LibTorch threads (0 = OMP_NUM_THREADS when set, else the CPUs this process may use)");
  app.set_version_flag("--version", BuildInfo, "print version and build info (LibTorch, BLAS, CUDA) and exit");

  streambp::tools::InitModelArgs init;
  auto* init_cmd = app.add_subcommand("init-model", "write a deterministic random-init model in HF format");
  init_cmd->add_option("--preset", init.preset, "tiny | small | qwen3-8b | qwen3-30b-a3b")->check(CLI::IsMember(streambp::PresetNames()));
  init_cmd->add_option("--family", init.family, "architecture of the written model: llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3")
      ->check(CLI::IsMember(streambp::FamilyNames()));
  init_cmd->add_option("--seed", init.seed, "random seed");
  init_cmd->add_option("--dtype", init.dtype, "dtype of the written weights")
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "float16"}));
  init_cmd->add_option("--out", init.out, "output folder")->required();
  init_cmd->add_option("--tokenizer", init.tokenizer,
                       "folder with a tokenizer.json: the model takes its vocabulary and end tokens, and its "
                       "tokenizer files are copied");

  streambp::tools::TokenizeArgs tokenize;
  auto* tokenize_cmd = app.add_subcommand("tokenize", "JSON lines {\"text\": ...} on stdin -> {\"ids\": [...]}");
  tokenize_cmd->add_option("--model", tokenize.model, "model folder with a tokenizer.json")->required();
  tokenize_cmd->add_flag("--add-special-tokens", tokenize.add_special_tokens,
                         "add the tokenizer's special tokens (Llama 3: <|begin_of_text|>), as HF's add_special_tokens");

  streambp::tools::RenderArgs render;
  auto* render_cmd = app.add_subcommand(
      "render", "JSON lines {\"messages\": [...]} on stdin -> {\"text\", \"ids\", \"loss_mask\"} (chat format)");
  render_cmd->add_option("--model", render.model, "model folder with a tokenizer.json")->required();
  render_cmd->add_option("--format", render.format, "qwen3 | llama3 | llama3.1 | llama3.2 | gemma | chatml (default: inferred)")
      ->check(CLI::IsMember({"qwen3", "llama3", "llama3.1", "llama3.2", "gemma", "chatml"}));
  render_cmd->add_flag("--add-generation-prompt", render.add_generation_prompt,
                       "end with the assistant header (what sampling starts from)");
  render_cmd->add_flag("--disable-thinking", render.disable_thinking, "qwen3: an empty think block in the prompt");

  streambp::tools::GradArgs grad;
  auto* grad_cmd = app.add_subcommand("grad", "loss and gradient of every parameter, as safetensors");
  AddModelFlags(grad_cmd, grad.model);
  grad_cmd->add_option("--data", grad.data, "JSONL file of examples")->required();
  grad_cmd->add_option("--objective", grad.objective, "loss plugin: sft | dpo | grpo | weighted_logprobs, or Tinker's cross_entropy | importance_sampling | ppo | cispo | dro");
  grad_cmd->add_option("--objective-options", grad.objective_options,
                       "the objective's options as a JSON object, e.g. '{\"beta\":0.1}'");
  grad_cmd->add_option("--engine", grad.engine, "full | checkpoint | stream")
      ->check(CLI::IsMember({"full", "checkpoint", "stream"}));
  grad_cmd->add_option("--layout", grad.layout, "right | left | packed")
      ->check(CLI::IsMember({"right", "left", "packed"}));
  AddEngineFlags(grad_cmd, grad.flags);
  grad_cmd->add_option("--adapter", grad.adapter,
                       "PEFT LoRA adapter folder: the base frozen, the adapter's gradients written under its names");
  grad_cmd->add_option("--out", grad.out, "output .safetensors file")->required();
  grad_cmd->add_option("--context-parallel", grad.context_parallel,
                       "split every sequence over this many processes (RANK, WORLD_SIZE, MASTER_ADDR, "
                       "MASTER_PORT; WORLD_SIZE a multiple of it adds data parallel); rank 0 writes the gradients")
      ->check(CLI::PositiveNumber);

  streambp::tools::VerifyArgs verify;
  auto* verify_cmd = app.add_subcommand(
      "verify", "run every engine on the same batch and check they give the same gradients");
  AddModelFlags(verify_cmd, verify.model);
  verify_cmd->add_option("--data", verify.data, "JSONL file (default: a synthetic batch)");
  verify_cmd->add_option("--objective", verify.objective, "loss plugin: sft | dpo | grpo | weighted_logprobs, or Tinker's cross_entropy | importance_sampling | ppo | cispo | dro");
  verify_cmd->add_option("--objective-options", verify.objective_options,
                         "the objective's options as a JSON object");
  verify_cmd->add_option("--layout", verify.layout, "right | left | packed")
      ->check(CLI::IsMember({"right", "left", "packed"}));
  verify_cmd->add_option("--seq-len", verify.seq_len, "synthetic batch: longest sequence")
      ->check(CLI::PositiveNumber);
  verify_cmd->add_option("--batch", verify.batch, "synthetic batch: number of sequences")
      ->check(CLI::PositiveNumber);
  verify_cmd->add_option("--tolerance", verify.tolerance, "max relative difference (0 = dtype default)");
  AddEngineFlags(verify_cmd, verify.flags);
  verify_cmd->add_option("--adapter", verify.adapter, "PEFT LoRA adapter folder: compare the adapter's gradients");
  verify_cmd->add_option("--context-parallel", verify.context_parallel,
                         "also the stream engine with every sequence split over this many processes (RANK, "
                         "WORLD_SIZE, MASTER_ADDR, MASTER_PORT); rank 0 prints")
      ->check(CLI::PositiveNumber);

  // --- train: a local training loop (train_tool.h) ---
  streambp::tools::TrainArgs train;
  auto* train_cmd = app.add_subcommand("train", "train on a JSONL file with the Trainer, one line per step");
  AddModelFlags(train_cmd, train.model);  // --seed seeds the embedded model and the trainer
  train_cmd->add_option("--data", train.data, "JSONL file of examples")->required();
  train_cmd->add_option("--objective", train.objective, "loss plugin: sft | dpo | grpo | weighted_logprobs, or Tinker's cross_entropy | importance_sampling | ppo | cispo | dro");
  train_cmd->add_option("--objective-options", train.objective_options,
                        "the objective's options as a JSON object");
  train_cmd->add_option("--steps", train.steps, "optimizer steps")->required()->check(CLI::PositiveNumber);
  train_cmd->add_option("--batch-size", train.batch_size,
                        "examples per step (a DPO pair or GRPO group is one; 0 = all)")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--optimizer", train.optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  train_cmd->add_option("--lr", train.lr, "peak learning rate")->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--weight-decay", train.weight_decay, "adamw: decoupled; sgd: L2")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--schedule", train.schedule, "constant | linear | cosine (over --steps)")
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  train_cmd->add_option("--warmup", train.warmup, "linear warmup steps")->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--max-grad-norm", train.max_grad_norm, "clip the gradient norm (0 = off)")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--engine", train.engine, "full | checkpoint | stream")
      ->check(CLI::IsMember({"full", "checkpoint", "stream"}));
  train_cmd->add_option("--layout", train.layout, "right | left | packed")
      ->check(CLI::IsMember({"right", "left", "packed"}));
  AddEngineFlags(train_cmd, train.flags);
  train_cmd->add_option("--micro-batch-tokens", train.micro_batch_tokens,
                        "padded tokens per micro-batch (0 = the whole step at once)")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--save", train.save, "write a checkpoint folder at the end");
  train_cmd->add_option("--context-parallel", train.context_parallel,
                        "split every sequence over this many processes (RANK, WORLD_SIZE, MASTER_ADDR, "
                        "MASTER_PORT; WORLD_SIZE a multiple of it adds data parallel); rank 0 reports and saves")
      ->check(CLI::PositiveNumber);
  train_cmd->add_option("--lora-rank", train.lora_rank, "train a LoRA adapter of this rank on the frozen base")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--lora-alpha", train.lora_alpha, "LoRA alpha (default 2 x rank)")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--lora-targets", train.lora_targets,
                        "modules to adapt (default q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)")
      ->delimiter(',');
  train_cmd->add_option("--lora-modules-to-save", train.lora_modules_to_save,
                        "modules trained as full copies in the adapter: gate (the mixture-of-experts router; frozen "
                        "by default)")
      ->delimiter(',');
  train_cmd->add_flag("--use-rslora", train.use_rslora, "scale alpha / sqrt(rank) (rsLoRA)");
  train_cmd->add_option("--adapter", train.adapter, "start from this PEFT adapter folder");
  train_cmd->add_option("--save-adapter", train.save_adapter, "write the PEFT adapter folder at the end");
  train_cmd->add_option("--save-merged", train.save_merged,
                        "write an HF model folder with the adapter folded into the weights");
  // --- end train ---

  // --- serve: the gRPC training service (serve_tool.h) ---
  streambp::tools::ServeArgs serve;
  auto* serve_cmd = app.add_subcommand("serve", "start the gRPC training service (Ctrl-C or SIGTERM drains and stops)");
  // The defaults a flag falls back to are the config's (a --config file may set them instead).
  const streambp::server::ServerConfig defaults;
  const auto with_default = [](const std::string& text, const std::string& value) {
    return text + " (default " + value + ")";
  };
  serve_cmd->add_option("--config", serve.config_file, "JSON config file; the flags below override it");
  serve_cmd->add_option("--model", serve.model_dir, "Hugging Face model folder (default: the embedded preset)");
  serve_cmd->add_option("--preset", serve.preset,
                        with_default("embedded model when --model is not given: tiny | small | qwen3-8b | qwen3-30b-a3b",
                                     defaults.model.preset))
      ->check(CLI::IsMember(streambp::PresetNames()));
  serve_cmd->add_option("--family", serve.family,
                        with_default("architecture of the embedded model: llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3",
                                     defaults.model.family))
      ->check(CLI::IsMember(streambp::FamilyNames()));
  serve_cmd->add_option("--seed", serve.seed, with_default("seed of the embedded model", std::to_string(defaults.model.seed)));
  serve_cmd->add_option("--dtype", serve.dtype, with_default("float32 | float64 | bfloat16", defaults.model.dtype));
  serve_cmd->add_option("--device", serve.device, with_default("cpu | cuda | cuda:N", defaults.model.device));
  serve_cmd->add_option("--listen", serve.listen,
                        with_default("host:port (port 0 picks a free one, logged)", defaults.listen));
  serve_cmd->add_option("--port-file", serve.port_file, "write the bound port to this file");
  serve_cmd->add_option("--engine", serve.engine,
                        with_default("default engine: full | checkpoint | stream",
                                     streambp::EngineName(defaults.trainer.engine.kind)));
  serve_cmd->add_option("--chunk", serve.chunk, "default stream chunk (0 = default)");
  serve_cmd->add_option("--logits-chunk", serve.logits_chunk, "default logits chunk (-1 = default, 0 = all)");
  serve_cmd->add_option("--key-chunk", serve.key_chunk, "default stream attention key tile (0 = default)");
  serve_cmd->add_flag("--keep-attention", serve.keep_attention,
                      "stream: keep attention outputs for the backward (trainer.engine.keep_attention; "
                      "with limits.auto_chunks dropped for a step whose memory budget has no room for it)");
  serve_cmd->add_option("--optimizer", serve.optimizer, with_default("adamw | sgd", defaults.trainer.optimizer.name));
  char lr[32];
  std::snprintf(lr, sizeof lr, "%g", defaults.trainer.optimizer.lr);
  serve_cmd->add_option("--lr", serve.lr, with_default("learning rate", lr));
  serve_cmd->add_option("--micro-batch-tokens", serve.micro_batch_tokens, "padded tokens per micro-batch (0 = whole)");
  serve_cmd->add_option("--checkpoint-dir", serve.checkpoint_dir, "folder of Save/LoadCheckpoint names");
  serve_cmd->add_flag("--history-tensorboard", serve.history_tensorboard,
                      "also write each session's training history as TensorBoard event files "
                      "(<checkpoint-dir>[/<session>]/tensorboard/; needs --checkpoint-dir)");
  serve_cmd->add_option("--token", serve.tokens, "bearer token clients must send (repeatable)");
  serve_cmd->add_option("--queue-depth", serve.queue_depth,
                        with_default("requests that may wait for the device", std::to_string(defaults.limits.queue_depth)));
  serve_cmd->add_option("--max-seq-len", serve.max_sequence_length,
                        with_default("longest sequence accepted", std::to_string(defaults.limits.max_sequence_length)));
  serve_cmd->add_option("--memory-budget", serve.memory_budget,
                        "refuse steps estimated above this many bytes (default 0: no budget)");
  serve_cmd->add_option("--context-parallel", serve.context_parallel,
                        "split every sequence over this many ranks (parallel.context_parallel; launch WORLD_SIZE = a "
                        "multiple of it, with RANK, MASTER_ADDR, MASTER_PORT: the rest is data parallel); rank 0 serves")
      ->check(CLI::PositiveNumber);
  serve_cmd->add_option("--log-format", serve.log_format, with_default("text | json", defaults.log.format));
  serve_cmd->add_flag("--check-config", serve.check_config,
                      "validate the config (and the model folder, device and dtype on this machine), print it, and exit");
  serve_cmd
      ->add_flag("--no-model-check", serve.no_model_check,
                 "with --check-config: check the keys and values only, not the model folder or device (a config "
                 "meant for another machine)")
      ->needs("--check-config");
  // --- end serve ---

  streambp::tools::HealthArgs health;
  auto* health_cmd = app.add_subcommand("health", "grpc.health.v1 check of a running server (exit 0 = SERVING)");
  health_cmd->add_option("--server", health.target, "host:port");
  health_cmd->add_option("--service", health.service, "service name (\"\" = the whole server)");
  health_cmd->add_option("--ca", health.ca, "PEM roots: connect with TLS");
  health_cmd->add_option("--server-name", health.server_name, "name expected in the server certificate");
  health_cmd->add_option("--timeout", health.timeout_seconds, "seconds")->check(CLI::PositiveNumber);

  if (const auto unknown = streambp::UnknownCommand(app, argc, argv, {"--threads"}); !unknown.empty()) {
    std::fprintf(stderr, "error: %s\n", unknown.c_str());
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
  CLI11_PARSE(app, argc, argv);
  streambp::ConfigureThreads(threads);
  try {
    if (*init_cmd) return streambp::tools::InitModel(init);
    if (*tokenize_cmd) return streambp::tools::Tokenize(tokenize);
    if (*render_cmd) return streambp::tools::Render(render);
    if (*grad_cmd) return streambp::tools::Grad(grad);
    if (*verify_cmd) return streambp::tools::Verify(verify);
    if (*train_cmd) return streambp::tools::Train(train);
    if (*health_cmd) return streambp::tools::Health(health);
    if (*serve_cmd) {
      serve.threads = threads;
      return streambp::tools::Serve(serve);
    }
  } catch (const streambp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const c10::OutOfMemoryError& e) {
    std::fprintf(stderr, "error: out of memory: %s\n", e.what_without_backtrace());
    return 3;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
