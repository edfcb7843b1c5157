#include "streambp/client/client.h"

#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "streambp/client/sha256.h"

namespace streambp::client {
namespace {

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    const auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const auto tid = static_cast<uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(now), static_cast<unsigned>(now >> 32),
                      static_cast<unsigned>(tid), static_cast<unsigned>(tid >> 32)};
    return std::mt19937_64(seq);
  }();
  return rng;
}

[[noreturn]] void Bad(const std::string& message) { throw ClientError(grpc::StatusCode::INVALID_ARGUMENT, message); }

std::string ReadPem(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ClientError(grpc::StatusCode::NOT_FOUND, std::string(field) + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void ValidateOptions(const ClientOptions& o) {
  for (const auto& [name, t] : {std::pair{"step_timeout", o.step_timeout}, std::pair{"info_timeout", o.info_timeout}}) {
    if (!(t.count() > 0) || !std::isfinite(t.count())) Bad(std::string(name) + " must be a finite number of seconds > 0");
  }
  ValidateRetryPolicy(o.retry);
}

// One call: the context (deadline, token, wait-for-ready) around `attempt`. The channel
// retries UNAVAILABLE by its service config; a call that still fails says so.
template <class Resp, class Attempt>
Result<Resp> Call(const ClientOptions& o, Seconds timeout, Attempt&& attempt) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout));
  if (!o.token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.token);
  if (o.wait_for_ready) ctx.set_wait_for_ready(true);
  Resp response{};
  const grpc::Status status = attempt(&ctx, &response);
  if (status.ok()) return Result<Resp>(std::move(response));
  if (IsRetryable(status.error_code()) && o.retry.max_attempts > 1) {
    return Result<Resp>(grpc::Status(status.error_code(), status.error_message() + " (retried up to " +
                                                              std::to_string(o.retry.max_attempts) + " attempts)"));
  }
  return Result<Resp>(status);
}

template <class Request>
void EnsureRequestId(Request& request) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
}

// The client's session on a request that names none.
template <class Request>
Request Scoped(Request request, const ClientOptions& o) {
  if (request.session().empty()) request.set_session(o.session);
  return request;
}

grpc::Status DataLoss(const std::string& message) {
  return grpc::Status(grpc::StatusCode::DATA_LOSS, "ExportWeights: " + message);
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::string NewRequestId() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 2; ++i) {
    uint64_t v = Rng()();
    for (int j = 0; j < 16; ++j, v >>= 4) out += kHex[v & 15];
  }
  return out;
}

// Where the bytes of ExportWeights go; reset() starts (opens) it.
struct detail::WeightsSink {
  virtual ~WeightsSink() = default;
  virtual void reset() = 0;
  virtual bool write(const std::string& data) = 0;
};

namespace {

struct MemorySink : public detail::WeightsSink {
  std::string data;
  void reset() override { data.clear(); }
  bool write(const std::string& d) override {
    data += d;
    return true;
  }
};

struct FileSink : public detail::WeightsSink {
  explicit FileSink(std::string p) : path(std::move(p)) {}
  std::string path;
  std::ofstream out;
  void reset() override {
    out.close();
    out.clear();
    out.open(path, std::ios::binary | std::ios::trunc);
  }
  bool write(const std::string& d) override {
    out.write(d.data(), static_cast<std::streamsize>(d.size()));
    return static_cast<bool>(out);
  }
};

}  // namespace

std::unique_ptr<Client> Client::Create(const ClientOptions& options) {
  ValidateOptions(options);
  if (options.target.empty()) Bad("target is empty (expected host:port)");
  if (options.max_message_bytes <= 0 || options.max_message_bytes > INT_MAX) {
    Bad("max_message_bytes must be in [1, " + std::to_string(INT_MAX) + "], got " +
        std::to_string(options.max_message_bytes));
  }
  const auto& tls = options.tls;
  if (!tls.enabled && (!tls.root_ca_file.empty() || !tls.cert_file.empty() || !tls.key_file.empty() ||
                       !tls.server_name_override.empty())) {
    Bad("tls: CA, certificate, key or server name given but TLS is not enabled");
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    Bad("tls: a client certificate needs its key and a key its certificate (cert_file and key_file)");
  }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // A server restarting (or still loading its model) is tried again within 5 s, not after
  // gRPC's default backoff of up to 120 s: a rollout worker or `streambp --wait` waiting for
  // it would otherwise sit idle long after it listens.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls.enabled) {
    grpc::SslCredentialsOptions ssl;
    if (!tls.root_ca_file.empty()) ssl.pem_root_certs = ReadPem(tls.root_ca_file, "tls.root_ca_file");
    if (!tls.cert_file.empty()) {
      ssl.pem_cert_chain = ReadPem(tls.cert_file, "tls.cert_file");
      ssl.pem_private_key = ReadPem(tls.key_file, "tls.key_file");
    }
    if (!tls.server_name_override.empty()) args.SetSslTargetNameOverride(tls.server_name_override);
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  // Retries are gRPC's: the service config's retryPolicy. A request is kept for a retry only
  // up to the per-call retry buffer (256 KiB by default), so a larger batch would not be
  // retried at all: the buffer is the message limit.
  const std::string service_config = ServiceConfigJson(options.retry);
  if (service_config.empty()) {
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  } else {
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
    args.SetServiceConfigJSON(service_config);
    args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, static_cast<int>(options.max_message_bytes));
  }
  auto channel = grpc::CreateCustomChannel(options.target, credentials, args);
  return std::unique_ptr<Client>(new Client(std::move(channel), options, true));
}

std::unique_ptr<Client> Client::Create(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options) {
  ValidateOptions(options);
  if (!channel) Bad("channel is null");
  return std::unique_ptr<Client>(new Client(std::move(channel), options, false));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options, bool own_retries)
    : options_(options), call_options_(options), channel_(std::move(channel)), stub_(v1::Trainer::NewStub(channel_)) {
  if (!own_retries) call_options_.retry.max_attempts = 1;  // a caller's channel: its retries are not ours to report
}

Client::~Client() = default;

Result<v1::GetInfoResponse> Client::GetInfo(const CallOptions& call) const {
  const auto request = Scoped(v1::GetInfoRequest(), options_);
  return Call<v1::GetInfoResponse>(
      call_options_, call.timeout.value_or(options_.info_timeout),
      [&](grpc::ClientContext* ctx, v1::GetInfoResponse* r) { return stub_->GetInfo(ctx, request, r); });
}

Result<v1::ForwardBackwardResponse> Client::ForwardBackward(v1::ForwardBackwardRequest request,
                                                            const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  return Call<v1::ForwardBackwardResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::ForwardBackwardResponse* r) { return stub_->ForwardBackward(ctx, request, r); });
}

Result<v1::OptimStepResponse> Client::OptimStep(v1::OptimStepRequest request, const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  return Call<v1::OptimStepResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::OptimStepResponse* r) { return stub_->OptimStep(ctx, request, r); });
}

Result<v1::TrainStepResponse> Client::TrainStep(v1::TrainStepRequest request, const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  return Call<v1::TrainStepResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::TrainStepResponse* r) { return stub_->TrainStep(ctx, request, r); });
}

Result<v1::TrainStepResponse> Client::TrainStepWithProgress(
    v1::TrainStepRequest request, const std::function<void(const v1::StepProgress&)>& on_progress,
    const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  bool unimplemented = false;
  auto result = Call<v1::TrainStepResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::TrainStepResponse* r) {
        auto reader = stub_->TrainStepProgress(ctx, request);
        v1::StepProgress p;
        bool done = false;
        while (reader->Read(&p)) {
          if (p.state() == "done") {
            *r = p.train_step();
            done = true;
          } else if (on_progress) {
            on_progress(p);
          }
        }
        auto status = reader->Finish();
        if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) unimplemented = true;
        if (status.ok() && !done) return grpc::Status(grpc::StatusCode::DATA_LOSS, "TrainStepProgress ended without done");
        return status;
      });
  if (unimplemented) return TrainStep(std::move(request), call);  // an older server
  return result;
}

Result<v1::TokenizeResponse> Client::Tokenize(const v1::TokenizeRequest& request, const CallOptions& call) const {
  return Call<v1::TokenizeResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::TokenizeResponse* r) { return stub_->Tokenize(ctx, request, r); });
}

Result<v1::DetokenizeResponse> Client::Detokenize(const v1::DetokenizeRequest& request, const CallOptions& call) const {
  return Call<v1::DetokenizeResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::DetokenizeResponse* r) { return stub_->Detokenize(ctx, request, r); });
}

Result<v1::SampleResponse> Client::Sample(const v1::SampleRequest& original, const CallOptions& call) const {
  const auto request = Scoped(original, options_);
  return Call<v1::SampleResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::SampleResponse* r) { return stub_->Sample(ctx, request, r); });
}

Result<v1::ComputeLogprobsResponse> Client::ComputeLogprobs(const v1::ComputeLogprobsRequest& original,
                                                            const CallOptions& call) const {
  const auto request = Scoped(original, options_);
  return Call<v1::ComputeLogprobsResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::ComputeLogprobsResponse* r) { return stub_->ComputeLogprobs(ctx, request, r); });
}

Result<v1::SaveCheckpointResponse> Client::SaveCheckpoint(v1::SaveCheckpointRequest request,
                                                          const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  return Call<v1::SaveCheckpointResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::SaveCheckpointResponse* r) { return stub_->SaveCheckpoint(ctx, request, r); });
}

Result<v1::LoadCheckpointResponse> Client::LoadCheckpoint(v1::LoadCheckpointRequest request,
                                                          const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  return Call<v1::LoadCheckpointResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::LoadCheckpointResponse* r) { return stub_->LoadCheckpoint(ctx, request, r); });
}

Result<v1::EstimateMemoryResponse> Client::EstimateMemory(const v1::EstimateMemoryRequest& original,
                                                          const CallOptions& call) const {
  const auto request = Scoped(original, options_);
  return Call<v1::EstimateMemoryResponse>(
      call_options_, call.timeout.value_or(options_.info_timeout),
      [&](grpc::ClientContext* ctx, v1::EstimateMemoryResponse* r) { return stub_->EstimateMemory(ctx, request, r); });
}

Result<ExportedWeights> Client::Export(const v1::ExportWeightsRequest& original, const CallOptions& call,
                                       detail::WeightsSink& sink,
                                       const std::function<void(int64_t, int64_t)>& progress) const {
  const auto request = Scoped(original, options_);
  return Call<ExportedWeights>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, ExportedWeights* out) -> grpc::Status {
        sink.reset();
        auto reader = stub_->ExportWeights(ctx, request);
        v1::WeightsChunk chunk;
        Sha256 sha;
        int64_t received = 0;
        int64_t messages = 0;
        bool last = false;
        grpc::Status bad;
        std::set<std::string> files_done;
        while (reader->Read(&chunk)) {
          const std::string at = "message " + std::to_string(messages) + ": ";
          if (!chunk.file().empty()) {  // with_files: a side file after the weights
            ++messages;
            auto& bytes = out->files[chunk.file()];
            if (bad.ok() && !last) bad = DataLoss(at + "file " + chunk.file() + " before the weights' last message");
            if (bad.ok() && (files_done.count(chunk.file()) || chunk.offset() != static_cast<int64_t>(bytes.size()))) {
              bad = DataLoss(at + "file " + chunk.file() + ": pieces not contiguous");
            }
            if (!bad.ok()) {
              ctx->TryCancel();
              while (reader->Read(&chunk)) {
              }
              break;
            }
            bytes += chunk.data();
            if (chunk.last()) {
              files_done.insert(chunk.file());
              if (Sha256Hex(bytes) != Lower(chunk.sha256())) bad = DataLoss("file " + chunk.file() + ": sha256 mismatch");
            }
            continue;
          }
          if (messages == 0) {
            out->total_bytes = chunk.total_bytes();
            out->policy_version = chunk.policy_version();
            if (!chunk.format().empty()) out->format = chunk.format();
            if (out->total_bytes < 0) bad = DataLoss(at + "negative total_bytes");
          } else if (chunk.total_bytes() != 0 && chunk.total_bytes() != out->total_bytes) {
            bad = DataLoss(at + "total_bytes changed from " + std::to_string(out->total_bytes) + " to " +
                           std::to_string(chunk.total_bytes()));
          } else if (chunk.policy_version() != 0 && chunk.policy_version() != out->policy_version) {
            bad = DataLoss(at + "policy_version changed within the stream");
          }
          ++messages;
          if (bad.ok() && last) bad = DataLoss(at + "a message after the last one");
          if (bad.ok() && chunk.offset() != received) {
            bad = DataLoss(at + "offset " + std::to_string(chunk.offset()) + ", expected " + std::to_string(received) +
                           " (chunks not contiguous)");
          }
          if (bad.ok() && received + static_cast<int64_t>(chunk.data().size()) > out->total_bytes) {
            bad = DataLoss(at + "data beyond total_bytes " + std::to_string(out->total_bytes));
          }
          if (bad.ok() && !sink.write(chunk.data())) {
            bad = grpc::Status(grpc::StatusCode::INTERNAL, "ExportWeights: cannot write the weights");
          }
          if (!bad.ok()) {
            ctx->TryCancel();
            while (reader->Read(&chunk)) {
            }
            break;
          }
          sha.update(chunk.data());
          received += static_cast<int64_t>(chunk.data().size());
          if (progress) progress(received, out->total_bytes);
          if (chunk.last()) {
            last = true;
            out->sha256 = Lower(chunk.sha256());
            out->config_json = chunk.config_json();
          }
        }
        const grpc::Status finished = reader->Finish();
        if (!bad.ok()) return bad;
        if (!finished.ok()) return finished;
        if (!last) return DataLoss("the stream ended without its last message");
        for (const auto& [name, bytes] : out->files) {
          if (!files_done.count(name)) return DataLoss("file " + name + " ended without its last message");
        }
        if (received != out->total_bytes) {
          return DataLoss("received " + std::to_string(received) + " bytes, expected total_bytes " +
                          std::to_string(out->total_bytes));
        }
        if (out->sha256.empty()) return DataLoss("the last message has no sha256");
        const std::string actual = sha.hex();
        if (actual != out->sha256) return DataLoss("sha256 mismatch: received " + actual + ", server sent " + out->sha256);
        return grpc::Status::OK;
      });
}

Result<ExportedWeights> Client::ExportWeights(const v1::ExportWeightsRequest& request, const CallOptions& call) const {
  MemorySink sink;
  auto result = Export(request, call, sink, {});
  if (!result.ok()) return result;
  ExportedWeights weights = std::move(result).value();
  weights.data = std::move(sink.data);
  return Result<ExportedWeights>(std::move(weights));
}

Result<ExportedWeights> Client::ExportWeightsToFile(const std::string& path, const v1::ExportWeightsRequest& request,
                                                    const CallOptions& call,
                                                    const std::function<void(int64_t, int64_t)>& progress) const {
  const std::string tmp = path + ".tmp";
  FileSink sink(tmp);
  auto result = Export(request, call, sink, progress);
  sink.out.close();
  std::error_code ec;
  if (!result.ok()) {
    std::filesystem::remove(tmp, ec);
    return result;
  }
  if (!sink.out) {
    std::filesystem::remove(tmp, ec);
    return Result<ExportedWeights>(grpc::Status(grpc::StatusCode::INTERNAL, "cannot write " + tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Result<ExportedWeights>(grpc::Status(grpc::StatusCode::INTERNAL, "cannot rename " + tmp + " to " + path));
  }
  return result;
}

Result<v1::SessionInfo> Client::CreateSession(v1::CreateSessionRequest request, const CallOptions& call) const {
  EnsureRequestId(request);
  return Call<v1::SessionInfo>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::SessionInfo* r) { return stub_->CreateSession(ctx, request, r); });
}

Result<v1::GetHistoryResponse> Client::GetHistory(v1::GetHistoryRequest request, const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  return Call<v1::GetHistoryResponse>(
      call_options_, call.timeout.value_or(options_.info_timeout),
      [&](grpc::ClientContext* ctx, v1::GetHistoryResponse* r) { return stub_->GetHistory(ctx, request, r); });
}

Result<v1::SessionInfo> Client::GetSession(const std::string& name, const CallOptions& call) const {
  v1::GetSessionRequest request;
  request.set_name(name);
  return Call<v1::SessionInfo>(
      call_options_, call.timeout.value_or(options_.info_timeout),
      [&](grpc::ClientContext* ctx, v1::SessionInfo* r) { return stub_->GetSession(ctx, request, r); });
}

Result<v1::ListSessionsResponse> Client::ListSessions(const CallOptions& call) const {
  const v1::ListSessionsRequest request;
  return Call<v1::ListSessionsResponse>(
      call_options_, call.timeout.value_or(options_.info_timeout),
      [&](grpc::ClientContext* ctx, v1::ListSessionsResponse* r) { return stub_->ListSessions(ctx, request, r); });
}

Result<v1::DeleteSessionResponse> Client::DeleteSession(const std::string& name, const CallOptions& call) const {
  v1::DeleteSessionRequest request;
  request.set_name(name);
  request.set_request_id(NewRequestId());
  return Call<v1::DeleteSessionResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::DeleteSessionResponse* r) { return stub_->DeleteSession(ctx, request, r); });
}

Result<v1::SnapshotInfo> Client::SaveWeightsForSampler(v1::SaveWeightsForSamplerRequest request,
                                                       const CallOptions& call) const {
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  return Call<v1::SnapshotInfo>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::SnapshotInfo* r) { return stub_->SaveWeightsForSampler(ctx, request, r); });
}

Result<v1::ListSnapshotsResponse> Client::ListSnapshots(const CallOptions& call) const {
  const auto request = Scoped(v1::ListSnapshotsRequest(), options_);
  return Call<v1::ListSnapshotsResponse>(
      call_options_, call.timeout.value_or(options_.info_timeout),
      [&](grpc::ClientContext* ctx, v1::ListSnapshotsResponse* r) { return stub_->ListSnapshots(ctx, request, r); });
}

Result<v1::DeleteSnapshotResponse> Client::DeleteSnapshot(const std::string& name, const CallOptions& call) const {
  v1::DeleteSnapshotRequest request;
  request.set_name(name);
  request = Scoped(std::move(request), options_);
  EnsureRequestId(request);
  return Call<v1::DeleteSnapshotResponse>(
      call_options_, call.timeout.value_or(options_.step_timeout),
      [&](grpc::ClientContext* ctx, v1::DeleteSnapshotResponse* r) { return stub_->DeleteSnapshot(ctx, request, r); });
}

}  // namespace streambp::client
