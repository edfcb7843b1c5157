// Objective options: a JSON object -> SftOptions / DpoOptions / GrpoOptions, field by
// field through the proto descriptors, so a field added to the proto is accepted here
// with no change.
#include <cmath>
#include <limits>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <nlohmann/json.hpp>

#include "streambp/client/data.h"
#include "streambp/client/result.h"

namespace streambp::client {
namespace {

using google::protobuf::FieldDescriptor;
using nlohmann::json;

[[noreturn]] void Bad(const std::string& message) { throw ClientError(grpc::StatusCode::INVALID_ARGUMENT, message); }

void SetField(google::protobuf::Message* m, const FieldDescriptor* f, const json& v, const std::string& where) {
  const auto* r = m->GetReflection();
  auto expect = [&](bool ok, const char* what) {
    if (!ok) Bad(where + " must be " + what + ", got " + v.dump());
  };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      expect(v.is_number(), "a number");
      const double d = v.get<double>();
      expect(std::isfinite(d), "a finite number");
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        r->SetDouble(m, f, d);
      } else {
        r->SetFloat(m, f, static_cast<float>(d));
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64: {
      expect(v.is_number_integer(), "an integer");
      const int64_t i = v.get<int64_t>();
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
        r->SetInt64(m, f, i);
      } else {
        expect(i >= std::numeric_limits<int32_t>::min() && i <= std::numeric_limits<int32_t>::max(), "a 32-bit integer");
        r->SetInt32(m, f, static_cast<int32_t>(i));
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      expect(v.is_boolean(), "true or false");
      r->SetBool(m, f, v.get<bool>());
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      expect(v.is_string(), "a string");
      r->SetString(m, f, v.get<std::string>());
      break;
    default:
      Bad(where + " cannot be set from JSON");
  }
}

void FromJson(const json& j, google::protobuf::Message* m, const std::string& kind) {
  const auto* d = m->GetDescriptor();
  for (const auto& [key, v] : j.items()) {
    const FieldDescriptor* f = d->FindFieldByName(key);
    if (f == nullptr || f->is_repeated() || f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      std::string known;
      for (int i = 0; i < d->field_count(); ++i) known += (i ? ", " : "") + d->field(i)->name();
      Bad("objective options: unknown key '" + key + "' for " + kind + " (known: " + known + ")");
    }
    SetField(m, f, v, "objective options: " + kind + "." + key);
  }
}

}  // namespace

ObjectiveOptions ParseObjectiveOptions(const std::string& kind, const std::string& text) {
  CheckObjectiveKind(kind);
  json j;
  try {
    j = text.empty() ? json::object() : json::parse(text);
  } catch (const json::exception& e) {
    Bad("objective options are not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) Bad("objective options must be a JSON object, got " + j.dump());
  ObjectiveOptions out;
  out.kind = kind;
  if (kind == "sft") FromJson(j, &out.sft, kind);
  if (kind == "dpo") FromJson(j, &out.dpo, kind);
  if (kind == "grpo") FromJson(j, &out.grpo, kind);
  if (kind == "weighted") FromJson(j, &out.weighted, kind);
  return out;
}

namespace {
template <class Request>
void Apply(const ObjectiveOptions& o, Request* request) {
  request->set_objective(o.kind == "weighted" ? "weighted_logprobs" : o.kind);
  if (o.kind == "weighted") *request->mutable_weighted() = o.weighted;
  if (o.kind == "sft") *request->mutable_sft() = o.sft;
  if (o.kind == "dpo") *request->mutable_dpo() = o.dpo;
  if (o.kind == "grpo") *request->mutable_grpo() = o.grpo;
}
}  // namespace

void ObjectiveOptions::ApplyTo(v1::TrainStepRequest* request) const { Apply(*this, request); }
void ObjectiveOptions::ApplyTo(v1::ForwardBackwardRequest* request) const { Apply(*this, request); }

}  // namespace streambp::client
