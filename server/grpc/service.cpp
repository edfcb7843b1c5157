// The unary handlers: authorize -> convert -> submit to the host -> finish.
#include "service.h"

#include "convert.h"
#include "streams.h"
#include "text_input.h"

namespace streambp::server {

using Unary = grpc::ServerUnaryReactor;

namespace {

// Runs `body(call)` (convert and submit) on the host's CPU pool when the request carries text
// (`charge` > 0, already bounded), so that no gRPC thread tokenizes or renders; else here.
// The pool polls the call's deadline and cancellation while the text is processed.
template <class Call, class Body>
void WithText(TrainingHost* host, const std::shared_ptr<Call>& call, int64_t charge, Body body) {
  if (charge == 0) {
    body(call);
    return;
  }
  host->run_cpu(call->context(), charge * kTextWorkBytesPerCharge, [call, body] { body(call); },
                [call](std::exception_ptr e) { call->finish(e); });
}

// The session a read targets: a sampler snapshot of it when `snapshot` is set.
std::string ReadTarget(const std::string& session, const std::string& snapshot) {
  if (snapshot.empty()) return session;
  if (session.empty()) throw InvalidArgument("snapshot '" + snapshot.substr(0, 64) + "' needs its session: set session");
  ValidateSnapshotName(snapshot);
  return SnapshotKey(session, snapshot);
}

}  // namespace

Unary* TrainerService::GetInfo(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::GetInfoRequest, v1::GetInfoResponse>;
  return Call::Run(ctx, in, out, "GetInfo", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    auto info = host_->info();
    if (!call->session.empty()) {
      const auto report = host_->session_report(call->session);
      ToProto(report, call->response.mutable_session());
      info.policy_version = report.policy_version;
      info.step = report.step;
      info.pending_micro_batches = report.pending_micro_batches;
      info.optimizer = report.spec.trainer.optimizer.name;
      info.learning_rate = report.spec.trainer.optimizer.lr;
    }
    ToProto(info, &call->response);
    call->response.set_server_version(STREAMBP_VERSION);
    call->finish();
  });
}

Unary* TrainerService::EstimateMemory(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::EstimateMemoryRequest, v1::EstimateMemoryResponse>;
  return Call::Run(ctx, in, out, "EstimateMemory", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    const auto& r = call->request;
    ToProto(host_->estimate(r.session(), r.batch(), r.seq_len(), ConvertEngine(r.engine())), &call->response);
    call->finish();
  });
}

Unary* TrainerService::ForwardBackward(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::ForwardBackwardRequest, v1::ForwardBackwardResponse>;
  return Call::Run(ctx, in, out, "ForwardBackward", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    WithText(host_, call, ChargeText(call->request, host_->limits()), [this](const std::shared_ptr<Call>& call) {
      auto step = ConvertStepRequest(call->request, host_->limits());
      call->tokens = step.tokens;
      host_->forward_backward(call->context(), std::move(step),
                              call->template reply<StepStats>(
                                  [](const StepStats& s, v1::ForwardBackwardResponse* r) { ToProto(s, r); }));
    });
  });
}

Unary* TrainerService::TrainStep(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::TrainStepRequest, v1::TrainStepResponse>;
  return Call::Run(ctx, in, out, "TrainStep", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    WithText(host_, call, ChargeText(call->request, host_->limits()), [this](const std::shared_ptr<Call>& call) {
      auto step = ConvertStepRequest(call->request, host_->limits());
      call->tokens = step.tokens;
      host_->train_step(call->context(), std::move(step),
                        call->template reply<TrainStats>([](const TrainStats& t, v1::TrainStepResponse* r) {
                          ToProto(t.forward, r->mutable_stats());
                          ToProto(t.optim, r->mutable_optim());
                        }));
    });
  });
}

Unary* TrainerService::OptimStep(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::OptimStepRequest, v1::OptimStepResponse>;
  return Call::Run(ctx, in, out, "OptimStep", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    std::optional<AdamStepParams> adam;
    if (call->request.has_adam_params()) adam = ConvertAdam(call->request.adam_params());
    host_->optim_step(call->context(), adam, call->template reply<OptimStats>([](const OptimStats& o, v1::OptimStepResponse* r) {
      ToProto(o, r);
    }));
  });
}

Unary* TrainerService::ComputeLogprobs(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::ComputeLogprobsRequest, v1::ComputeLogprobsResponse>;
  return Call::Run(ctx, in, out, "ComputeLogprobs", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    auto request = ConvertLogprobs(call->request, host_->limits());
    for (const auto& s : request.sequences) call->tokens += static_cast<int64_t>(s.tokens.size());
    auto context = call->context();
    context.session = ReadTarget(call->session, call->request.snapshot());
    host_->compute_logprobs(
        std::move(context), std::move(request),
        call->template reply<LogprobsReply>([](const LogprobsReply& l, v1::ComputeLogprobsResponse* r) { ToProto(l, r); }));
  });
}

Unary* TrainerService::SaveCheckpoint(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::SaveCheckpointRequest, v1::SaveCheckpointResponse>;
  return Call::Run(ctx, in, out, "SaveCheckpoint", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    host_->save_checkpoint(call->context(), call->request.name(),
                           call->template reply<CheckpointReply>([](const CheckpointReply& c, v1::SaveCheckpointResponse* r) {
                             r->set_name(c.name);
                             r->set_step(c.step);
                             r->set_policy_version(c.policy_version);
                             r->set_bytes(c.bytes);
                           }));
  });
}

Unary* TrainerService::LoadCheckpoint(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::LoadCheckpointRequest, v1::LoadCheckpointResponse>;
  return Call::Run(ctx, in, out, "LoadCheckpoint", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    host_->load_checkpoint(call->context(), call->request.name(),
                           call->template reply<CheckpointReply>([](const CheckpointReply& c, v1::LoadCheckpointResponse* r) {
                             r->set_name(c.name);
                             r->set_step(c.step);
                             r->set_policy_version(c.policy_version);
                           }));
  });
}

Unary* TrainerService::Sample(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::SampleRequest, v1::SampleResponse>;
  return Call::Run(ctx, in, out, "Sample", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    WithText(host_, call, ChargeText(call->request, host_->limits()), [this](const std::shared_ptr<Call>& call) {
      auto request = ConvertSample(call->request, host_->limits());
      for (const auto& p : request.prompts) call->tokens += static_cast<int64_t>(p.size());
      auto context = call->context();
      context.session = ReadTarget(call->session, call->request.snapshot());
      host_->sample(std::move(context), std::move(request),
                    call->template reply<SampleReply>([](const SampleReply& s, v1::SampleResponse* r) { ToProto(s, r); }));
    });
  });
}

Unary* TrainerService::PushRollouts(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::PushRolloutsRequest, v1::PushRolloutsResponse>;
  return Call::Run(ctx, in, out, "PushRollouts", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    WithText(host_, call, ChargeText(call->request, host_->limits()),
             [this](const std::shared_ptr<Call>& call) { push_rollouts(call); });
  });
}

void TrainerService::push_rollouts(const std::shared_ptr<UnaryCall<v1::PushRolloutsRequest, v1::PushRolloutsResponse>>& call) {
  {
    std::vector<PushItem> items;
    for (int i = 0; i < call->request.groups_size(); ++i) {
      const auto& g = call->request.groups(i);
      for (const auto& c : g.completions()) call->tokens += g.prompt_size() + c.tokens_size();
      items.push_back(ConvertRolloutGroup(g, i, call->session, host_->limits(), "groups[" + std::to_string(i) + "]"));
      if (!g.session().empty() && g.session() != call->session) {
        try {
          call->caller.require(g.session(), Access::kWrite);
        } catch (const std::exception& e) {
          items.back().group.reset();
          items.back().error = e.what();
        }
      }
    }
    host_->push_rollouts(call->context(), std::move(items),
                         call->template reply<std::vector<RolloutAck>>(
                             [](const std::vector<RolloutAck>& acks, v1::PushRolloutsResponse* r) {
                               for (const auto& a : acks) ToProto(a, r->add_acks());
                             }));
  }
}

Unary* TrainerService::GetRolloutStats(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::GetRolloutStatsRequest, v1::RolloutStats>;
  return Call::Run(ctx, in, out, "GetRolloutStats", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    ToProto(host_->rollout_stats(call->session), &call->response);
    call->finish();
  });
}

Unary* TrainerService::GetHistory(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::GetHistoryRequest, v1::GetHistoryResponse>;
  return Call::Run(ctx, in, out, "GetHistory", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    ToProto(host_->history(call->session, call->request.after_index(), call->request.max_records()),
            &call->response);
    call->finish();
  });
}

Unary* TrainerService::CreateSession(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::CreateSessionRequest, v1::SessionInfo>;
  return Call::Run(ctx, in, out, "CreateSession", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    call->session = call->request.name();
    call->caller.require_create(call->session);
    host_->create_session(
        call->context(), ConvertCreateSession(call->request, host_->config()),
        call->template reply<SessionReport>([](const SessionReport& r, v1::SessionInfo* info) { ToProto(r, info); }));
  });
}

Unary* TrainerService::GetSession(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::GetSessionRequest, v1::SessionInfo>;
  return Call::Run(ctx, in, out, "GetSession", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    call->session = call->request.name();
    call->caller.require(call->session, Access::kRead);
    ToProto(host_->session_report(call->session), &call->response);
    call->finish();
  });
}

Unary* TrainerService::ListSessions(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::ListSessionsRequest, v1::ListSessionsResponse>;
  return Call::Run(ctx, in, out, "ListSessions", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    for (const auto& r : host_->list_sessions()) {
      if (call->caller.sees(r.spec.name)) ToProto(r, call->response.add_sessions());
    }
    call->response.set_max_sessions(host_->config().sessions.max_sessions);
    call->response.set_max_resident_sessions(host_->config().sessions.max_resident_sessions);
    call->finish();
  });
}

Unary* TrainerService::DeleteSession(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::DeleteSessionRequest, v1::DeleteSessionResponse>;
  return Call::Run(ctx, in, out, "DeleteSession", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    call->session = call->request.name();
    call->caller.require(call->session, Access::kWrite);
    host_->delete_session(call->context(), call->session,
                          call->template reply<std::string>([](const std::string& name, v1::DeleteSessionResponse* r) {
                            r->set_name(name);
                          }));
  });
}

Unary* TrainerService::SaveWeightsForSampler(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::SaveWeightsForSamplerRequest, v1::SnapshotInfo>;
  return Call::Run(ctx, in, out, "SaveWeightsForSampler", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    host_->save_snapshot(
        call->context(), call->request.name(), call->request.ttl_seconds(), call->request.replace_oldest(),
        call->template reply<SnapshotReport>([](const SnapshotReport& r, v1::SnapshotInfo* info) { ToProto(r, info); }));
  });
}

Unary* TrainerService::ListSnapshots(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::ListSnapshotsRequest, v1::ListSnapshotsResponse>;
  return Call::Run(ctx, in, out, "ListSnapshots", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    if (!host_->sessions_enabled()) throw FailedPrecondition("sampler snapshots need sessions (sessions.enabled)");
    for (const auto& r : host_->list_snapshots(call->session)) ToProto(r, call->response.add_snapshots());
    call->response.set_max_snapshots(host_->config().sessions.max_snapshots);
    call->response.set_max_snapshot_bytes(host_->config().sessions.max_snapshot_bytes);
    call->finish();
  });
}

Unary* TrainerService::DeleteSnapshot(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::DeleteSnapshotRequest, v1::DeleteSnapshotResponse>;
  return Call::Run(ctx, in, out, "DeleteSnapshot", Access::kWrite, edge_, [this](std::shared_ptr<Call> call) {
    host_->delete_snapshot(call->context(), call->request.name(),
                           call->template reply<std::string>([](const std::string& name, v1::DeleteSnapshotResponse* r) {
                             r->set_name(name);
                           }));
  });
}

Unary* TrainerService::Tokenize(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::TokenizeRequest, v1::TokenizeResponse>;
  return Call::Run(ctx, in, out, "Tokenize", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    WithText(host_, call, std::max<int64_t>(1, ChargeText(call->request, host_->limits())),
             [this](const std::shared_ptr<Call>& call) {
               call->response = server::Tokenize(call->request, host_->limits());
               call->finish();
             });
  });
}

Unary* TrainerService::Detokenize(Ctx* ctx, const Bytes* in, Bytes* out) {
  using Call = UnaryCall<v1::DetokenizeRequest, v1::DetokenizeResponse>;
  return Call::Run(ctx, in, out, "Detokenize", Access::kRead, edge_, [this](std::shared_ptr<Call> call) {
    WithText(host_, call, std::max<int64_t>(1, ChargeDetokenize(call->request, host_->limits())),
             [this](const std::shared_ptr<Call>& call) {
               call->response = server::Detokenize(call->request, host_->limits());
               call->finish();
             });
  });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TrainerService::ExportWeights(Ctx* ctx, const Bytes* in) {
  return StartWeightsWriter(ctx, in, host_, edge_);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TrainerService::ForwardBackwardProgress(Ctx* ctx, const Bytes* in) {
  return StartForwardBackwardProgress(ctx, in, host_, edge_);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TrainerService::TrainStepProgress(Ctx* ctx, const Bytes* in) {
  return StartTrainStepProgress(ctx, in, host_, edge_);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TrainerService::WatchPolicy(Ctx* ctx, const Bytes* in) {
  return StartPolicyWatcher(ctx, in, host_, edge_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TrainerService::PushRolloutsStream(Ctx* ctx) {
  return StartPushStream(ctx, host_, edge_);
}

}  // namespace streambp::server
