// WatchPolicy: the host's policy hub pushes updates; this reactor writes them in order.
#include <deque>
#include <mutex>

#include "convert.h"
#include "streams.h"

namespace streambp::server {
namespace {

constexpr size_t kMaxPending = 1024;  // updates a slow reader may fall behind by

class PolicyWatcher final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public PolicySink {
 public:
  PolicyWatcher(grpc::CallbackServerContext* ctx, TrainingHost* host, const EdgeContext& edge)
      : ctx_(ctx), host_(host), edge_(edge) {}

  void begin(const grpc::ByteBuffer* in) {
    edge_.observer->started("WatchPolicy");
    try {
      const auto caller = edge_.auth->authorize(*ctx_, Access::kRead);
      v1::WatchPolicyRequest request;
      if (!ParseMessage(*in, &request)) {
        throw InvalidArgument("the request body is not a valid streambp.v1.WatchPolicyRequest message");
      }
      session_ = request.session();
      caller.require(session_, Access::kRead);
      lease_ = host_->acquire_stream();
      host_->watch_policy(session_, this, request.since_version());
      subscribed_ = true;
    } catch (...) {
      close(std::current_exception());
    }
  }

  void push(const PolicyUpdate& update) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    if (pending_.size() >= kMaxPending) {
      finish_locked(std::make_exception_ptr(ResourceExhausted(
          "this watcher fell " + std::to_string(kMaxPending) + " policy updates behind; watch again from the last "
          "version it read")));
      return;
    }
    v1::PolicyUpdate message;
    ToProto(update, &message);
    pending_.emplace_back();
    SerializeMessage(message, &pending_.back());
    if (!writing_) {
      writing_ = true;
      StartWrite(&pending_.front());
    }
  }

  void close(std::exception_ptr error) override {
    std::lock_guard<std::mutex> lock(mutex_);
    finish_locked(error);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.pop_front();
    if (!ok || finished_) {
      writing_ = false;
      return;
    }
    if (!pending_.empty()) {
      StartWrite(&pending_.front());
    } else {
      writing_ = false;
    }
  }
  void OnCancel() override { close(std::make_exception_ptr(Cancelled("the watcher went away"))); }
  void OnDone() override {
    if (subscribed_) host_->unwatch_policy(session_, this);
    delete this;
  }

 private:
  void finish_locked(std::exception_ptr error) {
    if (finished_) return;
    finished_ = true;
    const auto status = ToStatus(error);
    edge_.observer->finished("WatchPolicy", session_, "", 0, std::chrono::duration<double>(Clock::now() - start_).count(),
                             status);
    Finish(status);
  }

  grpc::CallbackServerContext* ctx_;
  TrainingHost* host_;
  EdgeContext edge_;
  Clock::time_point start_ = Clock::now();
  TrainingHost::Lease lease_;
  std::string session_;
  bool subscribed_ = false;
  std::mutex mutex_;
  std::deque<grpc::ByteBuffer> pending_;
  bool writing_ = false, finished_ = false;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartPolicyWatcher(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* in, TrainingHost* host,
                                                               const EdgeContext& edge) {
  auto* watcher = new PolicyWatcher(ctx, host, edge);
  watcher->begin(in);
  return watcher;
}

}  // namespace streambp::server
