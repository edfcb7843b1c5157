#include "replica.h"

#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/model.h"

namespace streambp::server {

std::unique_ptr<Replica> Replica::Create(const ServerConfig& config, const torch::Device& device,
                                         std::shared_ptr<Communicator> comm) {
  std::unique_ptr<Replica> r(new Replica());
  auto model = LoadOrInitModel(config.model_source(), &device);
  r->model_config_ = model->config();
  r->dtype_ = ParseDtype(config.model.dtype);
  r->trainer_options_ = config.trainer;
  r->trainer_options_.max_sequence_length = config.limits.max_sequence_length;
  r->trainer_ = Trainer::Create(model, r->trainer_options_);
  r->comm_ = std::move(comm);
  if (r->comm_) r->trainer_->set_communicator(r->comm_);
  return r;
}

Trainer& Replica::trainer(const std::string& session) {
  if (!session.empty()) throw NotFound("no session named '" + session + "'");
  return *trainer_;
}

void Replica::load(const std::string& session, const std::string& dir) {
  trainer(session);  // the session exists
  auto loaded = Trainer::LoadCheckpoint(dir, &trainer_options_);
  auto shape = [](const ModelConfig& c) {
    auto j = c.ToJson();
    j.erase("torch_dtype");
    return j;
  };
  if (shape(loaded->model()->config()) != shape(model_config_)) {
    throw FailedPrecondition("the checkpoint holds a different model (" + loaded->model()->config().architecture +
                             ", other sizes) than this server serves");
  }
  if (comm_) loaded->set_communicator(comm_);
  trainer_ = std::move(loaded);
}

}  // namespace streambp::server
