#pragma once
// One reactor class per streaming RPC (gRPC's callback route_guide is the model): each
// writes one message at a time, never blocks in a reaction, and holds a slot of the host's
// stream (or export) limit for its life. The classes live in their own files.
#include <grpcpp/grpcpp.h>

#include "calls.h"
#include "host.h"

namespace streambp::server {

constexpr int64_t kMaxWeightsChunk = 4 << 20;
/// The default: 64 KiB under 4 MiB, so a message with its fields fits the 4 MiB that gRPC
/// clients receive by default.
constexpr int64_t kDefaultWeightsChunk = kMaxWeightsChunk - (64 << 10);

/// ExportWeights: the current weights as a safetensors file, in pieces (weights_writer.cpp).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartWeightsWriter(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* in, TrainingHost* host,
                                                               const EdgeContext& edge);
/// WatchPolicy: one message per new policy version (policy_watcher.cpp).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartPolicyWatcher(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* in, TrainingHost* host,
                                                               const EdgeContext& edge);
/// ForwardBackwardProgress / TrainStepProgress: the step, with its progress (step_progress.cpp).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartForwardBackwardProgress(grpc::CallbackServerContext* ctx,
                                                                         const grpc::ByteBuffer* in,
                                                                         TrainingHost* host, const EdgeContext& edge);
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartTrainStepProgress(grpc::CallbackServerContext* ctx,
                                                                   const grpc::ByteBuffer* in, TrainingHost* host,
                                                                   const EdgeContext& edge);
/// PushRolloutsStream: one ack per pushed group, in order (push_stream.cpp).
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartPushStream(grpc::CallbackServerContext* ctx,
                                                                             TrainingHost* host,
                                                                             const EdgeContext& edge);

}  // namespace streambp::server
