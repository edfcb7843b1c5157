#pragma once
// The streambp.v1.Trainer service: every method takes raw bytes (so a body that does not
// parse is INVALID_ARGUMENT, not gRPC's bare UNIMPLEMENTED) and hands the work to the
// TrainingHost. Unary handlers live in service.cpp; each streaming RPC has its own reactor
// (streams.h).
#include "calls.h"
#include "host.h"
#include "streambp/v1/trainer.grpc.pb.h"

namespace streambp::server {

namespace raw {
using v1::Trainer;
// clang-format off
using Service =
    Trainer::WithRawCallbackMethod_GetInfo<
    Trainer::WithRawCallbackMethod_ForwardBackward<
    Trainer::WithRawCallbackMethod_OptimStep<
    Trainer::WithRawCallbackMethod_TrainStep<
    Trainer::WithRawCallbackMethod_ComputeLogprobs<
    Trainer::WithRawCallbackMethod_SaveCheckpoint<
    Trainer::WithRawCallbackMethod_LoadCheckpoint<
    Trainer::WithRawCallbackMethod_ExportWeights<
    Trainer::WithRawCallbackMethod_EstimateMemory<
    Trainer::WithRawCallbackMethod_Sample<
    Trainer::WithRawCallbackMethod_PushRollouts<
    Trainer::WithRawCallbackMethod_PushRolloutsStream<
    Trainer::WithRawCallbackMethod_WatchPolicy<
    Trainer::WithRawCallbackMethod_GetRolloutStats<
    Trainer::WithRawCallbackMethod_GetHistory<
    Trainer::WithRawCallbackMethod_CreateSession<
    Trainer::WithRawCallbackMethod_GetSession<
    Trainer::WithRawCallbackMethod_ListSessions<
    Trainer::WithRawCallbackMethod_DeleteSession<
    Trainer::WithRawCallbackMethod_SaveWeightsForSampler<
    Trainer::WithRawCallbackMethod_ListSnapshots<
    Trainer::WithRawCallbackMethod_DeleteSnapshot<
    Trainer::WithRawCallbackMethod_Tokenize<
    Trainer::WithRawCallbackMethod_Detokenize<
    Trainer::WithRawCallbackMethod_ForwardBackwardProgress<
    Trainer::WithRawCallbackMethod_TrainStepProgress<
    Trainer::Service>>>>>>>>>>>>>>>>>>>>>>>>>>;
// clang-format on
}  // namespace raw

class TrainerService final : public raw::Service {
 public:
  TrainerService(TrainingHost* host, EdgeContext edge) : host_(host), edge_(edge) {}

  using Unary = grpc::ServerUnaryReactor;
  using Ctx = grpc::CallbackServerContext;
  using Bytes = grpc::ByteBuffer;

  Unary* GetInfo(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* EstimateMemory(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* ForwardBackward(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* OptimStep(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* TrainStep(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* ComputeLogprobs(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* SaveCheckpoint(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* LoadCheckpoint(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* Sample(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* PushRollouts(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* GetRolloutStats(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* GetHistory(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* CreateSession(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* GetSession(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* ListSessions(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* DeleteSession(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* SaveWeightsForSampler(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* ListSnapshots(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* DeleteSnapshot(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* Tokenize(Ctx* ctx, const Bytes* in, Bytes* out) override;
  Unary* Detokenize(Ctx* ctx, const Bytes* in, Bytes* out) override;
  grpc::ServerWriteReactor<Bytes>* ForwardBackwardProgress(Ctx* ctx, const Bytes* in) override;
  grpc::ServerWriteReactor<Bytes>* TrainStepProgress(Ctx* ctx, const Bytes* in) override;
  grpc::ServerWriteReactor<Bytes>* ExportWeights(Ctx* ctx, const Bytes* in) override;
  grpc::ServerWriteReactor<Bytes>* WatchPolicy(Ctx* ctx, const Bytes* in) override;
  grpc::ServerBidiReactor<Bytes, Bytes>* PushRolloutsStream(Ctx* ctx) override;

 private:
  void push_rollouts(const std::shared_ptr<UnaryCall<v1::PushRolloutsRequest, v1::PushRolloutsResponse>>& call);

  TrainingHost* host_;
  EdgeContext edge_;
};

}  // namespace streambp::server
