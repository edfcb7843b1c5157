// PushRolloutsStream: every group read goes to the host (validation and the rollout log's
// fsync run on the host's I/O thread, never in a reaction; a group's text is tokenized on
// the host's CPU pool); acks come back in order and are written one at a time. At most kMaxInFlight groups wait for their ack: reading
// pauses beyond that (backpressure to the client).
#include <deque>
#include <mutex>

#include "convert.h"
#include "streams.h"
#include "text_input.h"

namespace streambp::server {
namespace {

constexpr int kMaxInFlight = 64;

class PushStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushStream(grpc::CallbackServerContext* ctx, TrainingHost* host, const EdgeContext& edge)
      : ctx_(ctx), host_(host), edge_(edge) {}

  /// Owned by `self` (callbacks from the host keep it alive until their ack is handled).
  void begin(std::shared_ptr<PushStream> self) {
    self_ = std::move(self);
    edge_.observer->started("PushRolloutsStream");
    try {
      caller_ = edge_.auth->authorize(*ctx_, Access::kWrite);
      lease_ = host_->acquire_stream();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      finish_locked(std::current_exception());
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ok) {
      reads_done_ = true;
      maybe_finish_locked();
      return;
    }
    if (finished_) return;
    Pending p;
    p.index = index_++;
    if (!ParseMessage(in_, &p.group)) {
      p.parse_error = "groups[" + std::to_string(p.index) + "]: " + WhyNotParsed(in_, v1::RolloutGroup::descriptor());
    }
    pending_.push_back(std::move(p));
    ++in_flight_;
    const bool read_more = in_flight_ < kMaxInFlight;
    if (!read_more) read_paused_ = true;
    lock.unlock();
    pump();
    lock.lock();
    if (read_more && !finished_) StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mutex_);
    acks_.pop_front();
    if (!ok) {
      writing_ = false;
      finish_locked(std::make_exception_ptr(Cancelled("the client went away")));
      return;
    }
    if (!acks_.empty()) {
      StartWrite(&acks_.front());
    } else {
      writing_ = false;
      maybe_finish_locked();
    }
  }

  void OnDone() override {
    std::shared_ptr<PushStream> self;  // the host's pending callbacks may keep it a little longer
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      self = std::move(self_);
    }
  }

 private:
  void on_acks(const Outcome<std::vector<RolloutAck>>& o) {
    std::lock_guard<std::mutex> lock(mutex_);
    --in_flight_;
    if (done_ || finished_) return;
    if (!o.ok()) {
      finish_locked(o.error);
      return;
    }
    for (const auto& a : *o.value) {
      v1::RolloutAck ack;
      ToProto(a, &ack);
      acks_.emplace_back();
      SerializeMessage(ack, &acks_.back());
    }
    if (!writing_ && !acks_.empty()) {
      writing_ = true;
      StartWrite(&acks_.front());
    }
    if (read_paused_ && !reads_done_) {
      read_paused_ = false;
      StartRead(&in_);
    }
    maybe_finish_locked();
  }

  // A group read but not yet handed to the host. Groups go to the host one at a time, in
  // the order they were read (acks come back in that order); a group with text is
  // converted on the host's CPU pool, never on a gRPC thread.
  struct Pending {
    int index = 0;
    v1::RolloutGroup group;
    std::string parse_error;
  };

  // Hands pending groups to the host in order, until one is converting on the CPU pool (its
  // completion calls pump() again). Called without mutex_.
  void pump() {
    for (;;) {
      Pending p;
      std::shared_ptr<PushStream> self;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (converting_ || pending_.empty()) return;
        self = self_;
        if (finished_ || done_) {
          pending_.clear();
          return;
        }
        converting_ = true;
        p = std::move(pending_.front());
        pending_.pop_front();
      }
      int64_t charge = 0;
      if (p.parse_error.empty()) {
        try {
          charge = ChargeText(p.group, host_->limits());
        } catch (const std::exception& e) {
          p.parse_error = "groups[" + std::to_string(p.index) + "]: " + e.what();
        }
      }
      if (charge == 0) {  // tokens only: cheap, converted here
        try {
          submit(self, convert(p));
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex_);
          converting_ = false;
          --in_flight_;
          finish_locked(std::current_exception());
          return;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        converting_ = false;
        continue;
      }
      auto shared = std::make_shared<Pending>(std::move(p));
      CallContext c;
      c.method = "PushRolloutsStream";
      c.cancelled = [self] { return self->gone(); };
      auto failed = [self](std::exception_ptr error) {
        {
          std::lock_guard<std::mutex> lock(self->mutex_);
          self->converting_ = false;
          --self->in_flight_;
          self->finish_locked(error);
        }
        self->pump();
      };
      try {
        host_->run_cpu(
            c, charge * kTextWorkBytesPerCharge,
            [self, shared] {
              PushItem item = self->convert(*shared);  // a deadline or cancel throws: `failed`
              {
                std::lock_guard<std::mutex> lock(self->mutex_);
                if (self->finished_ || self->done_) {  // the stream ended meanwhile: not pushed
                  self->converting_ = false;
                  --self->in_flight_;
                  return;
                }
              }
              self->submit(self, std::move(item));
              {
                std::lock_guard<std::mutex> lock(self->mutex_);
                self->converting_ = false;
              }
              self->pump();
            },
            failed);
      } catch (...) {
        failed(std::current_exception());
      }
      return;
    }
  }

  // Whether the group's work can stop: the stream ended (a failure finished it, or the call
  // is done and its context gone) or the client cancelled. Safe from any thread at any time:
  // the context is asked only while OnDone has not run (it waits for mutex_).
  bool gone() {
    std::lock_guard<std::mutex> lock(mutex_);
    return finished_ || done_ || ctx_->IsCancelled();
  }

  PushItem convert(const Pending& p) {
    PushItem item;
    if (!p.parse_error.empty()) {
      item.index = p.index;
      item.error = p.parse_error;
      return item;
    }
    item = ConvertRolloutGroup(p.group, p.index, p.group.session(), host_->limits(),
                               "groups[" + std::to_string(p.index) + "]");
    try {
      caller_.require(item.session, Access::kWrite);
    } catch (const std::exception& e) {
      item.group.reset();
      item.error = e.what();
    }
    return item;
  }

  // One group to the host; the host may answer at once (a refusal), into on_acks.
  void submit(const std::shared_ptr<PushStream>& self, PushItem item) {
    CallContext c;
    c.method = "PushRolloutsStream";
    c.cancelled = [self] { return self->gone(); };
    std::vector<PushItem> items;
    items.push_back(std::move(item));
    host_->push_rollouts(c, std::move(items), [self](const Outcome<std::vector<RolloutAck>>& o) { self->on_acks(o); });
  }

  void maybe_finish_locked() {
    if (reads_done_ && in_flight_ == 0 && !writing_) finish_locked(nullptr);
  }

  void finish_locked(std::exception_ptr error) {
    if (finished_ || done_) return;
    finished_ = true;
    const auto status = ToStatus(error);
    edge_.observer->finished("PushRolloutsStream", "", "", 0,
                             std::chrono::duration<double>(Clock::now() - start_).count(), status);
    Finish(status);
  }

  grpc::CallbackServerContext* ctx_;
  TrainingHost* host_;
  EdgeContext edge_;
  Clock::time_point start_ = Clock::now();
  std::shared_ptr<PushStream> self_;
  Caller caller_ = Caller::Admin();
  TrainingHost::Lease lease_;
  grpc::ByteBuffer in_;
  int index_ = 0, in_flight_ = 0;
  std::mutex mutex_;
  std::deque<grpc::ByteBuffer> acks_;
  std::deque<Pending> pending_;
  bool converting_ = false;  // a group is on its way to the host (pump() hands one at a time)
  bool writing_ = false, reads_done_ = false, read_paused_ = false, finished_ = false, done_ = false;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartPushStream(grpc::CallbackServerContext* ctx,
                                                                             TrainingHost* host,
                                                                             const EdgeContext& edge) {
  auto stream = std::make_shared<PushStream>(ctx, host, edge);
  auto* raw = stream.get();
  raw->begin(std::move(stream));
  return raw;
}

}  // namespace streambp::server
