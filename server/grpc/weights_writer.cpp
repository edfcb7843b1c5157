// ExportWeights: streams the shared snapshot of the current version, one message at a time
// (OnWriteDone drives the next write).
#include <atomic>

#include "convert.h"
#include "streambp/digest.h"
#include "streams.h"

namespace streambp::server {
namespace {

class WeightsWriter final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WeightsWriter(grpc::CallbackServerContext* ctx, TrainingHost* host, const EdgeContext& edge)
      : ctx_(ctx), host_(host), edge_(edge) {}

  void begin(const grpc::ByteBuffer* in) {
    edge_.observer->started("ExportWeights");
    try {
      const auto caller = edge_.auth->authorize(*ctx_, Access::kRead);
      v1::ExportWeightsRequest request;
      if (!ParseMessage(*in, &request)) {
        throw InvalidArgument("the request body is not a valid streambp.v1.ExportWeightsRequest message");
      }
      session_ = request.session();
      caller.require(session_, Access::kRead);
      const int64_t floor = host_->config().limits.min_export_chunk_bytes;
      const int64_t want = request.max_chunk_bytes();
      if (want < 0 || (want > 0 && want < floor) || want > kMaxWeightsChunk) {
        throw InvalidArgument("max_chunk_bytes must be 0 (the default, 4 MiB - 64 KiB) or in [" + std::to_string(floor) + ", " +
                              std::to_string(kMaxWeightsChunk) + "]");
      }
      chunk_bytes_ = want > 0 ? want : kDefaultWeightsChunk;
      with_files_ = request.with_files();
      lease_ = host_->acquire_export();
      CallContext c;
      c.method = "ExportWeights";
      if (!request.snapshot().empty()) {
        if (session_.empty()) throw InvalidArgument("snapshot '" + request.snapshot().substr(0, 64) + "' needs its session: set session");
        ValidateSnapshotName(request.snapshot());
      }
      c.session = request.snapshot().empty() ? session_ : SnapshotKey(session_, request.snapshot());
      c.deadline = ctx_->deadline();
      c.cancelled = [ctx = ctx_] { return ctx->IsCancelled(); };
      host_->export_weights(c, request.version(), request.merged(), [this](const Outcome<ExportReply>& o) {
        if (!o.ok()) {
          finish(o.error);
          return;
        }
        reply_ = o.value;
        next();
      });
    } catch (...) {
      finish(std::current_exception());
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      finish(std::make_exception_ptr(Cancelled("the client went away during the export")));
      return;
    }
    next();
  }
  void OnDone() override { delete this; }

 private:
  void next() {
    const auto& snapshot = *reply_->snapshot;
    const int64_t total = static_cast<int64_t>(snapshot.bytes.size());
    if (done_) {
      if (with_files_ && reply_->files && file_ < reply_->files->size()) {
        next_file();
        return;
      }
      finish(nullptr);
      return;
    }
    const int64_t n = std::min(chunk_bytes_, total - offset_);
    v1::WeightsChunk chunk;
    chunk.set_policy_version(snapshot.policy_version);
    chunk.set_total_bytes(total);
    chunk.set_offset(offset_);
    chunk.set_data(snapshot.bytes.data() + offset_, static_cast<size_t>(n));
    if (offset_ == 0) {
      chunk.set_note(reply_->note);
      chunk.set_format(snapshot.format);
    }
    offset_ += n;
    if (offset_ >= total) {
      chunk.set_sha256(snapshot.sha256);
      chunk.set_config_json(snapshot.config_json);
      chunk.set_last(true);
      done_ = true;
    }
    buffer_.Clear();
    SerializeMessage(chunk, &buffer_);
    StartWrite(&buffer_);
  }

  // The model folder's side files, one after the other, each in pieces.
  void next_file() {
    const auto& [name, bytes] = (*reply_->files)[file_];
    const int64_t total = static_cast<int64_t>(bytes.size());
    const int64_t n = std::min(chunk_bytes_, total - file_offset_);
    v1::WeightsChunk chunk;
    chunk.set_policy_version(reply_->snapshot->policy_version);
    chunk.set_file(name);
    chunk.set_total_bytes(total);
    chunk.set_offset(file_offset_);
    chunk.set_data(bytes.data() + file_offset_, static_cast<size_t>(n));
    file_offset_ += n;
    if (file_offset_ >= total) {
      chunk.set_sha256(Sha256Hex(bytes));
      chunk.set_last(true);
      ++file_;
      file_offset_ = 0;
    }
    buffer_.Clear();
    SerializeMessage(chunk, &buffer_);
    StartWrite(&buffer_);
  }

  void finish(std::exception_ptr error) {
    if (finished_.exchange(true)) return;
    const auto status = ToStatus(error);
    edge_.observer->finished("ExportWeights", session_, "", 0, std::chrono::duration<double>(Clock::now() - start_).count(),
                             status);
    Finish(status);
  }

  grpc::CallbackServerContext* ctx_;
  TrainingHost* host_;
  EdgeContext edge_;
  Clock::time_point start_ = Clock::now();
  TrainingHost::Lease lease_;
  std::string session_;
  std::shared_ptr<const ExportReply> reply_;
  int64_t chunk_bytes_ = kMaxWeightsChunk, offset_ = 0;
  bool done_ = false;
  bool with_files_ = false;
  size_t file_ = 0;
  int64_t file_offset_ = 0;
  std::atomic<bool> finished_{false};
  grpc::ByteBuffer buffer_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartWeightsWriter(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* in, TrainingHost* host,
                                                               const EdgeContext& edge) {
  auto* writer = new WeightsWriter(ctx, host, edge);
  writer->begin(in);
  return writer;
}

}  // namespace streambp::server
