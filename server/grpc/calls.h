#pragma once
// One unary call at the edge, from its raw bytes to its answer: parse (a body that is not
// the request message is INVALID_ARGUMENT), authorize, convert and submit (the handler's
// body), and finish (serialize the response, log the call once, count it). Handlers then
// read as authorize -> convert -> submit -> finish and never build a status themselves.
#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "auth.h"
#include "config.h"
#include "streambp/error.h"
#include "status.h"
#include "types.h"

namespace streambp::server {

class MetricsExporter;

/// Logs and counts finished calls (one line or JSON object per call).
class CallObserver {
 public:
  CallObserver(const LogSection& log, MetricsExporter* metrics, bool session_label = false)
      : json_(log.format == "json"), metrics_(metrics), session_label_(session_label) {}
  /// A call arrived (grpc_server_started_total).
  void started(const std::string& method) const;
  void finished(const std::string& method, const std::string& session, const std::string& request_id, int64_t tokens,
                double seconds, const grpc::Status& status) const;

 private:
  bool json_;
  MetricsExporter* metrics_;
  bool session_label_;
};

/// Parses `buffer` into `message`; false when it is not one.
bool ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);
/// Why `buffer` is not a `descriptor` message: the generic sentence, and the field when the
/// cause is a string that is not UTF-8 ("... message: batch.sft.examples[0].text is not valid
/// UTF-8 at byte 3 (text must be UTF-8)").
std::string WhyNotParsed(const grpc::ByteBuffer& buffer, const google::protobuf::Descriptor* descriptor);
/// Serializes `message` into `buffer`.
void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* buffer);
/// The request id of a request message (its `request_id` field, or "") and the SHA-256 of
/// the message without it (deterministic serialization): a reused id with another body
/// is refused by the host. Clears the field in `message`.
std::pair<std::string, std::string> TakeRequestId(google::protobuf::Message* message);
/// The `session` field of a request message ("" when it has none).
std::string SessionOf(const google::protobuf::Message& message);

/// The services a call needs: the authorizer and the observer.
struct EdgeContext {
  const Authorizer* auth = nullptr;
  const CallObserver* observer = nullptr;
};

template <class Req, class Resp>
class UnaryCall : public std::enable_shared_from_this<UnaryCall<Req, Resp>> {
 public:
  UnaryCall(grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out, const char* method, const EdgeContext& edge)
      : ctx_(ctx), reactor_(ctx->DefaultReactor()), out_(out), method_(method), edge_(edge) {}

  Req request;
  Resp response;
  int64_t tokens = 0;    ///< for the log
  std::string session;   ///< the request's session field (authorized for the call's access)
  Caller caller = Caller::Admin();

  /// What the host needs to know about the call.
  CallContext context() const {
    CallContext c;
    c.method = method_;
    c.session = session;
    c.request_id = request_id_;
    c.digest = digest_;
    c.deadline = ctx_->deadline();
    c.cancelled = [ctx = ctx_] { return ctx->IsCancelled(); };
    c.received = start_;
    return c;
  }

  /// A Done for a host method: fills the response from the host's answer, then finishes.
  template <class T, class Fill>
  Done<T> reply(Fill fill) {
    return [self = this->shared_from_this(), fill](const Outcome<T>& o) {
      if (o.ok()) {
        try {
          fill(*o.value, &self->response);
        } catch (...) {
          self->finish(std::current_exception());
          return;
        }
      }
      self->finish(o.error);
    };
  }

  /// Serializes the response (when `error` is null) and finishes the call. Once.
  void finish(std::exception_ptr error = nullptr) {
    const grpc::Status status = ToStatus(error);
    if (status.ok()) SerializeMessage(response, out_);
    edge_.observer->finished(method_, session, request_id_, tokens,
                             std::chrono::duration<double>(Clock::now() - start_).count(), status);
    reactor_->Finish(status);
  }

  /// Authenticates, parses, and authorizes the request's session (a `session` field) for
  /// `access`; then runs `body(shared_ptr<UnaryCall>)`, which converts and submits (or
  /// answers at once). Anything `body` throws finishes the call with it.
  template <class Body>
  static grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out, const char* method, Access access,
                                       const EdgeContext& edge, Body body) {
    auto call = std::make_shared<UnaryCall>(ctx, out, method, edge);
    auto* reactor = call->reactor_;
    edge.observer->started(method);
    try {
      call->caller = edge.auth->authorize(*ctx, access);
      if (!ParseMessage(*in, &call->request)) throw InvalidArgument(WhyNotParsed(*in, Req::descriptor()));
      call->session = SessionOf(call->request);
      if (Req::descriptor()->FindFieldByName("session") != nullptr) call->caller.require(call->session, access);
      std::tie(call->request_id_, call->digest_) = TakeRequestId(&call->request);
      body(call);
    } catch (...) {
      call->finish(std::current_exception());
    }
    return reactor;
  }

 private:
  grpc::CallbackServerContext* ctx_;
  grpc::ServerUnaryReactor* reactor_;
  grpc::ByteBuffer* out_;
  const char* method_;
  EdgeContext edge_;
  Clock::time_point start_ = Clock::now();
  std::string request_id_, digest_;
};

}  // namespace streambp::server
