#include "calls.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <nlohmann/json.hpp>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <spdlog/spdlog.h>

#include "metrics.h"
#include "streambp/digest.h"

namespace streambp::server {

void CallObserver::finished(const std::string& method, const std::string& session, const std::string& request_id,
                            int64_t tokens, double seconds, const grpc::Status& status) const {
  if (metrics_) metrics_->ObserveRequest(method, CodeName(status.error_code()), seconds);
  const auto level = status.ok() ? spdlog::level::info : spdlog::level::warn;
  if (json_) {
    nlohmann::json j{{"event", "request"}, {"method", method}, {"request_id", request_id}, {"tokens", tokens},
                     {"ms", seconds * 1e3}, {"status", CodeName(status.error_code())}};
    if (!session.empty()) j["session"] = session;
    if (!status.ok()) j["message"] = status.error_message();
    spdlog::log(level, "{}", j.dump());
  } else {
    spdlog::log(level, "{}{} id={} tokens={} {:.1f}ms {}{}", method, session.empty() ? "" : " session=" + session,
                request_id.empty() ? "-" : request_id, tokens, seconds * 1e3, CodeName(status.error_code()),
                status.ok() ? "" : ": " + status.error_message());
  }
}

std::string SessionOf(const google::protobuf::Message& message) {
  const auto* field = message.GetDescriptor()->FindFieldByName("session");
  if (field == nullptr || field->type() != google::protobuf::FieldDescriptor::TYPE_STRING) return "";
  return message.GetReflection()->GetString(message, field);
}

bool ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  grpc::ByteBuffer copy(buffer);  // shares the slices
  grpc::ProtoBufferReader reader(&copy);
  return message->ParseFromZeroCopyStream(&reader) && message->IsInitialized();
}

void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* buffer) {
  bool own = false;
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, buffer, &own);
}

std::pair<std::string, std::string> TakeRequestId(google::protobuf::Message* message) {
  const auto* field = message->GetDescriptor()->FindFieldByName("request_id");
  if (field == nullptr || field->type() != google::protobuf::FieldDescriptor::TYPE_STRING) return {};
  const auto* r = message->GetReflection();
  std::string id = r->GetString(*message, field);
  if (id.empty()) return {};
  r->ClearField(message, field);
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    message->SerializeToCodedStream(&out);
  }
  return {std::move(id), Sha256Hex(bytes)};
}

}  // namespace streambp::server
