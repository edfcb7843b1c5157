#include "health_tool.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "streambp/error.h"

namespace streambp::tools {

int Health(const HealthArgs& args) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments channel_args;
  if (!args.ca.empty()) {
    std::ifstream in(args.ca);
    if (!in) throw NotFound("cannot read --ca " + args.ca);
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    creds = grpc::SslCredentials(ssl);
    if (!args.server_name.empty()) channel_args.SetSslTargetNameOverride(args.server_name);
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(args.target, creds, channel_args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(args.timeout_seconds * 1000)));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(args.service);
  grpc::health::v1::HealthCheckResponse resp;
  const auto status = stub->Check(&ctx, req, &resp);
  if (!status.ok()) {
    std::printf("%s: %s (%d)\n", args.target.c_str(), status.error_message().c_str(),
                static_cast<int>(status.error_code()));
    return 1;
  }
  const auto name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  std::printf("%s %s: %s\n", args.target.c_str(), args.service.empty() ? "(server)" : args.service.c_str(), name.c_str());
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace streambp::tools
