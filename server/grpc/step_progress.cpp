// ForwardBackwardProgress / TrainStepProgress: the unary step with its progress streamed.
// The host reports queued / started / layer / optimizer events from its threads; this reactor
// writes them in order, one at a time (consecutive events of the same state coalesce, so a
// slow reader sees the latest layer rather than a backlog), then the answer as "done".
#include <deque>
#include <mutex>

#include "convert.h"
#include "text_input.h"
#include "streams.h"

namespace streambp::server {
namespace {

constexpr size_t kMaxPending = 64;

template <class Req, class Resp, class Stats>
class StepProgressWriter final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  using Submit = void (TrainingHost::*)(CallContext, StepRequest, Done<Stats>);
  using Fill = void (*)(const Stats&, v1::StepProgress*);

  StepProgressWriter(grpc::CallbackServerContext* ctx, TrainingHost* host, const EdgeContext& edge, const char* method,
                     const char* unary_method)
      : ctx_(ctx), host_(host), edge_(edge), method_(method), unary_method_(unary_method) {}

  void begin(const grpc::ByteBuffer* in, Submit submit, Fill fill) {
    edge_.observer->started(method_);
    try {
      const auto caller = edge_.auth->authorize(*ctx_, Access::kWrite);
      Req request;
      if (!ParseMessage(*in, &request)) throw InvalidArgument(WhyNotParsed(*in, Req::descriptor()));
      session_ = request.session();
      caller.require(session_, Access::kWrite);
      auto [request_id, digest] = TakeRequestId(&request);
      request_id_ = request_id;
      CallContext c;
      c.method = unary_method_;  // the unary call's request-id cache: a retry may take either route
      c.session = session_;
      c.request_id = request_id;
      c.digest = digest;
      c.deadline = ctx_->deadline();
      c.cancelled = [ctx = ctx_] { return ctx->IsCancelled(); };
      c.received = start_;
      c.progress = [this](const StepProgressEvent& e) { push(e); };
      // Text is turned into ids on the host's CPU pool, not on this gRPC thread; the reactor
      // lives until end() finishes it, which every path reaches.
      const int64_t charge = ChargeText(request, host_->limits());
      auto proceed = [this, request = std::move(request), c, submit, fill] { convert_and_submit(request, c, submit, fill); };
      if (charge == 0) {
        proceed();
      } else {
        host_->run_cpu(c, charge * kTextWorkBytesPerCharge, std::move(proceed),
                       [this](std::exception_ptr e) { end(e); });
      }
    } catch (...) {
      end(std::current_exception());
    }
  }

  void convert_and_submit(const Req& request, const CallContext& context, Submit submit, Fill fill) {
    auto step = ConvertStepRequest(request, host_->limits());
    tokens_ = step.tokens;
    lease_ = host_->acquire_stream();
    (host_->*submit)(context, std::move(step), [this, fill](const Outcome<Stats>& o) {
      if (!o.ok()) {
        end(o.error);
        return;
      }
      v1::StepProgress done;
      done.set_state("done");
      done.set_elapsed_seconds(Elapsed());
      fill(*o.value, &done);
      enqueue(done, true);
    });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mutex_);
    writing_ = false;
    if (!ok) {  // the client went away; the host's answer still comes and ends the call
      broken_ = true;
      pending_.clear();
      maybe_finish_locked();
      return;
    }
    pending_.pop_front();
    if (!pending_.empty()) {
      write_front_locked();
    } else {
      maybe_finish_locked();
    }
  }

  void OnDone() override { delete this; }

 private:
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void push(const StepProgressEvent& e) {
    v1::StepProgress p;
    p.set_state(e.state);
    p.set_queue_position(e.queue_position);
    p.set_layer(static_cast<int32_t>(e.layer));
    p.set_num_layers(static_cast<int32_t>(e.num_layers));
    p.set_micro_batch(static_cast<int32_t>(e.micro_batch));
    p.set_micro_batches(static_cast<int32_t>(e.micro_batches));
    p.set_elapsed_seconds(Elapsed());
    enqueue(p, false);
  }

  void enqueue(const v1::StepProgress& message, bool last) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_) return;
    if (last) {
      finishing_ = true;
      status_ = grpc::Status::OK;
    }
    if (broken_) {
      maybe_finish_locked();
      return;
    }
    // The queued message being written stays; a newer event of the same state replaces the
    // waiting one (layer 3 supersedes layer 2), and a reader far behind loses the oldest.
    if (pending_.size() > 1 && pending_.back().state == message.state() && !last) {
      pending_.back() = Item{message.state()};
      SerializeMessage(message, &pending_.back().bytes);
    } else {
      if (pending_.size() >= kMaxPending && !last) pending_.erase(pending_.begin() + 1);
      pending_.push_back(Item{message.state()});
      SerializeMessage(message, &pending_.back().bytes);
    }
    if (!writing_) write_front_locked();
  }

  void end(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_) return;
    finishing_ = true;
    status_ = ToStatus(error);
    // Progress not yet written is moot once the call failed.
    while (pending_.size() > (writing_ ? 1u : 0u)) pending_.pop_back();
    maybe_finish_locked();
  }

  void write_front_locked() {
    writing_ = true;
    StartWrite(&pending_.front().bytes);
  }

  void maybe_finish_locked() {
    if (!finishing_ || writing_ || (!pending_.empty() && !broken_) || finished_) return;
    finished_ = true;
    edge_.observer->finished(method_, session_, request_id_, tokens_, Elapsed(), status_);
    Finish(status_);
  }

  struct Item {
    std::string state;
    grpc::ByteBuffer bytes;
  };

  grpc::CallbackServerContext* ctx_;
  TrainingHost* host_;
  EdgeContext edge_;
  const char* method_;
  const char* unary_method_;
  Clock::time_point start_ = Clock::now();
  TrainingHost::Lease lease_;
  std::string session_, request_id_;
  int64_t tokens_ = 0;
  std::mutex mutex_;
  std::deque<Item> pending_;
  bool writing_ = false, finishing_ = false, finished_ = false, broken_ = false;
  grpc::Status status_;
};

void FillForwardBackward(const StepStats& s, v1::StepProgress* p) {
  ToProto(s, p->mutable_forward_backward());
}

void FillTrainStep(const TrainStats& t, v1::StepProgress* p) {
  auto* r = p->mutable_train_step();
  ToProto(t.forward, r->mutable_stats());
  ToProto(t.optim, r->mutable_optim());
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartForwardBackwardProgress(grpc::CallbackServerContext* ctx,
                                                                         const grpc::ByteBuffer* in,
                                                                         TrainingHost* host, const EdgeContext& edge) {
  using Writer = StepProgressWriter<v1::ForwardBackwardRequest, v1::ForwardBackwardResponse, StepStats>;
  auto* w = new Writer(ctx, host, edge, "ForwardBackwardProgress", "ForwardBackward");
  w->begin(in, &TrainingHost::forward_backward, &FillForwardBackward);
  return w;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartTrainStepProgress(grpc::CallbackServerContext* ctx,
                                                                   const grpc::ByteBuffer* in, TrainingHost* host,
                                                                   const EdgeContext& edge) {
  using Writer = StepProgressWriter<v1::TrainStepRequest, v1::TrainStepResponse, TrainStats>;
  auto* w = new Writer(ctx, host, edge, "TrainStepProgress", "TrainStep");
  w->begin(in, &TrainingHost::train_step, &FillTrainStep);
  return w;
}

}  // namespace streambp::server
