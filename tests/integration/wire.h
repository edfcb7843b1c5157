#pragma once
// Raw gRPC calls for the integration tests that speak the proto directly: a stub with a
// deadline per call, and helpers for chat messages and id lists.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "streambp/v1/trainer.grpc.pb.h"

namespace streambp::testing {

struct Wire {
  std::unique_ptr<v1::Trainer::Stub> stub;
  explicit Wire(const std::string& target)
      : stub(v1::Trainer::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}
  static std::unique_ptr<grpc::ClientContext> ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    return c;
  }
};

inline v1::ChatMessage* Add(google::protobuf::RepeatedPtrField<v1::ChatMessage>* to, const std::string& role,
                     const std::string& content) {
  auto* m = to->Add();
  m->set_role(role);
  m->set_content(content);
  return m;
}

inline std::vector<int64_t> Ids(const google::protobuf::RepeatedField<int32_t>& ids) { return {ids.begin(), ids.end()}; }

}  // namespace streambp::testing
