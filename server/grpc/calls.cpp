#include "calls.h"

#include <map>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/unknown_field_set.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <nlohmann/json.hpp>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <spdlog/spdlog.h>

#include "metrics.h"
#include "streambp/digest.h"

namespace streambp::server {

void CallObserver::started(const std::string& method) const {
  if (metrics_) metrics_->ObserveRequestStarted(method);
}

void CallObserver::finished(const std::string& method, const std::string& session, const std::string& request_id,
                            int64_t tokens, double seconds, const grpc::Status& status) const {
  if (metrics_) metrics_->ObserveRequest(method, CodeName(status.error_code()), seconds);
  // A client that goes away (a watcher closed, a cancelled call) is routine, not a warning.
  const auto level = status.ok() || status.error_code() == grpc::StatusCode::CANCELLED ? spdlog::level::info
                                                                                        : spdlog::level::warn;
  if (json_) {
    nlohmann::json j{{"event", "request"}, {"method", method}, {"request_id", request_id}, {"tokens", tokens},
                     {"seconds", seconds}, {"code", CodeName(status.error_code())}};
    if (!session.empty()) j["session"] = session;
    if (!status.ok()) j["message"] = status.error_message();
    spdlog::log(level, "{}", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
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

namespace {

// The byte offset of the first ill-formed UTF-8 sequence (overlongs, surrogates and code
// points past U+10FFFF included), or npos.
size_t InvalidUtf8At(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return i;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return i;
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b & 0x3F);
    }
    const uint32_t min = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n + 1;
  }
  return std::string::npos;
}

// The first string field of `bytes` (a `d` message on the wire) that is not UTF-8, as a path.
std::string FindInvalidUtf8(const std::string& bytes, const google::protobuf::Descriptor* d, const std::string& path,
                            int depth) {
  google::protobuf::UnknownFieldSet fields;
  if (depth > 32 || !fields.ParseFromString(bytes)) return "";
  std::map<int, int> seen;
  for (int i = 0; i < fields.field_count(); ++i) {
    const auto& f = fields.field(i);
    if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const auto* fd = d->FindFieldByNumber(f.number());
    if (fd == nullptr) continue;
    const int index = seen[f.number()]++;
    std::string name = path;
    if (!name.empty()) name += '.';
    name += fd->name();
    if (fd->is_repeated()) {
      name += '[';
      name += std::to_string(index);
      name += ']';
    }
    if (fd->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      const size_t at = InvalidUtf8At(f.length_delimited());
      if (at != std::string::npos) return name + " is not valid UTF-8 at byte " + std::to_string(at);
    } else if (fd->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      auto inner = FindInvalidUtf8(f.length_delimited(), fd->message_type(), name, depth + 1);
      if (!inner.empty()) return inner;
    }
  }
  return "";
}

}  // namespace

std::string WhyNotParsed(const grpc::ByteBuffer& buffer, const google::protobuf::Descriptor* descriptor) {
  std::string message = "the request body is not a valid " + descriptor->full_name() + " message";
  grpc::Slice slice;
  grpc::ByteBuffer copy(buffer);
  if (!copy.TrySingleSlice(&slice).ok() && !copy.DumpToSingleSlice(&slice).ok()) return message;
  const auto why = FindInvalidUtf8(std::string(reinterpret_cast<const char*>(slice.begin()), slice.size()), descriptor,
                                   "", 0);
  return why.empty() ? message : message + ": " + why + " (text must be UTF-8)";
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
