// The mixture-of-experts feed-forward (docs/architecture.md: Models): Qwen3-MoE's sparse block.
#include <ATen/record_function.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/torch.h>

#include "streambp/model.h"

namespace streambp {

std::vector<ProjectionSpec> SparseMoeImpl::Projections(const ModelConfig& c) {
  std::vector<ProjectionSpec> out;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    for (auto p : GatedMlpImpl::Projections(c, c.moe_intermediate_size)) {
      p.name = "experts." + std::to_string(e) + "." + p.name;
      out.push_back(p);
    }
  }
  return out;
}

SparseMoeImpl::SparseMoeImpl(const ModelConfig& c) : top_k_(c.num_experts_per_tok), norm_topk_prob_(c.norm_topk_prob) {
  gate = register_module("gate", Projection(c.hidden_size, c.num_experts, false));
  auto list = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < c.num_experts; ++e) {
    experts.push_back(std::make_shared<GatedMlpImpl>(c, c.moe_intermediate_size));
    list->push_back(experts.back());
  }
}

void SparseMoeImpl::set_routing(RoutingReplay* replay, RouterAuxLoss* aux, int64_t sparse_index) {
  replay_ = replay;
  aux_ = aux;
  sparse_index_ = sparse_index;
}

int64_t RoutingReplay::decisions() const { return counted.defined() ? counted[0].item<int64_t>() : 0; }
int64_t RoutingReplay::mismatches() const { return counted.defined() ? counted[1].item<int64_t>() : 0; }

namespace {

// The identity on a layer's output whose backward also hands the router's probabilities
// their load-balancing gradient, scale * C_e for every valid token (RouterAuxLoss). C is read
// when the backward runs: complete by then in every engine (their first forward collected it).
struct RouterAuxGradient : public torch::autograd::Function<RouterAuxGradient> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& out,
                               const torch::Tensor& probs, const torch::Tensor& valid, const torch::Tensor& counts,
                               double scale) {
    ctx->saved_data["valid"] = valid;
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["dtype"] = static_cast<int64_t>(probs.scalar_type());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto valid = ctx->saved_data["valid"].toTensor().to(dtype).unsqueeze(1);      // [N, 1]
    const auto per_expert = (ctx->saved_data["counts"].toTensor() * ctx->saved_data["scale"].toDouble()).to(dtype);
    return {grads[0], valid * per_expert.unsqueeze(0), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

Routing SparseMoeImpl::route(const torch::Tensor& h, const torch::Tensor& given, RoutingReplay* replay) {
  RECORD_USER_SCOPE("streambp::router");
  // HF: softmax of the router logits in float32 (float64 for float64 models here), the top-k
  // probabilities, renormalised over the chosen k when norm_topk_prob.
  const auto compute = h.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto probs = torch::softmax(gate(h).to(compute), -1);
  auto [weights, ids] = probs.topk(top_k_, -1);
  if (given.defined()) {
    // Replayed rows take the given experts and the router's probabilities of them.
    const auto replayed = given.ge(0).all(-1, /*keepdim=*/true);  // [N, 1]
    if (replay != nullptr) {
      // Counted where the tensors are: a read per layer would make the host wait for the device.
      torch::NoGradGuard no_grad;
      const auto outside = given.unsqueeze(-1).ne(ids.unsqueeze(-2)).all(-1) & replayed;  // [N, k]
      auto counted = torch::stack({replayed.sum() * top_k_, outside.sum()});
      replay->counted = replay->counted.defined() ? replay->counted + counted : counted;
    }
    ids = torch::where(replayed, given, ids);
    weights = probs.gather(-1, ids);
  }
  if (norm_topk_prob_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return Routing{ids, weights, probs};
}

torch::Tensor SparseMoeImpl::forward(const torch::Tensor& h, int64_t q_start) {
  RECORD_USER_SCOPE("streambp::moe");
  const int64_t d = h.size(-1);
  auto x = h.reshape({-1, d});
  const int64_t n = x.size(0), k = top_k_;
  if (n == 0) return torch::zeros_like(h);
  torch::Tensor given, record;
  if (replay_ != nullptr) {
    // This layer's k columns of the replay, for the rows [q_start, q_start + c) of the batch.
    const auto& all = replay_->experts;
    TORCH_CHECK(h.dim() == 3 && all.size(0) == h.size(0) && q_start + h.size(1) <= all.size(1),
                "routing replay of ", all.sizes(), " does not cover rows [", q_start, ", ", q_start + h.size(1), ")");
    auto columns = all.slice(1, q_start, q_start + h.size(1)).narrow(2, sparse_index_ * k, k);  // a view
    if (replay_->record) {
      record = columns;
    } else {
      given = columns.reshape({-1, k});
    }
  }
  const auto routing = route(x, given, record.defined() ? nullptr : replay_);
  if (record.defined()) {
    torch::NoGradGuard no_grad;
    record.copy_(routing.experts.view({h.size(0), h.size(1), k}));
  }
  torch::Tensor valid;  // the load-balancing loss's non-padding rows of this call
  if (aux_ != nullptr) {
    TORCH_CHECK(h.dim() == 3 && aux_->valid.size(0) == h.size(0) && q_start + h.size(1) <= aux_->valid.size(1),
                "router aux loss of ", aux_->valid.sizes(), " does not cover rows [", q_start, ", ",
                q_start + h.size(1), ")");
    valid = aux_->valid.slice(1, q_start, q_start + h.size(1)).reshape({-1});
    if (aux_->collecting) {
      torch::NoGradGuard no_grad;
      const auto used = routing.experts.index({valid}).reshape({-1});
      aux_->counts += torch::bincount(used, {}, aux_->counts.size(0)).to(torch::kFloat64);
      aux_->probs += routing.probs.detach().index({valid}).sum(0).to(torch::kFloat64);
    }
  }
  // The n*k (token, slot) pairs grouped by expert with one stable sort of their expert ids:
  // an expert's rows are then one contiguous range, run as one GEMM chain.
  const auto flat = routing.experts.reshape({-1});
  const auto order = std::get<1>(flat.sort(/*stable=*/true, 0, /*descending=*/false));
  const auto token = order.div(k, "floor");
  const auto weights = routing.weights.reshape({-1}).index_select(0, order).to(x.scalar_type()).unsqueeze(1);
  const auto counts = torch::bincount(flat, {}, static_cast<int64_t>(experts.size())).to(torch::kCPU);
  const auto* count = counts.data_ptr<int64_t>();
  std::vector<torch::Tensor> rows;
  int64_t start = 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    if (count[e] == 0) continue;
    const int64_t end = start + count[e];
    // HF: the expert's output times the token's routing weight, in the hidden states' dtype.
    rows.push_back(experts[e]->forward(x.index_select(0, token.slice(0, start, end)), 0) * weights.slice(0, start, end));
    start = end;
  }
  // Back to (token, slot) order and the k slots of each token summed: a gather and a sum,
  // the same order on every device (an index_add would be nondeterministic on CUDA).
  auto sorted = torch::cat(rows, 0);
  const auto inverse = torch::empty_like(order).scatter_(0, order, torch::arange(n * k, order.options()));
  auto out = sorted.index_select(0, inverse).view({n, k, d}).sum(1);
  if (valid.defined() && torch::GradMode::is_enabled() && routing.probs.requires_grad()) {
    out = RouterAuxGradient::apply(out, routing.probs, valid, aux_->counts, aux_->scale);
  }
  return out.view(h.sizes());
}

void SparseMoeImpl::append_hf_parameters(const std::string& prefix,
                                         std::vector<std::pair<std::string, torch::Tensor>>& out) const {
  out.emplace_back(prefix + ".gate.weight", gate->weight);
  for (size_t e = 0; e < experts.size(); ++e) experts[e]->append_hf_parameters(prefix + ".experts." + std::to_string(e), out);
}

std::vector<std::pair<std::string, Projection>> SparseMoeImpl::projections() const {
  std::vector<std::pair<std::string, Projection>> out;
  for (size_t e = 0; e < experts.size(); ++e) {
    for (auto& [name, p] : experts[e]->projections()) out.emplace_back("experts." + std::to_string(e) + "." + name, p);
  }
  return out;
}

}  // namespace streambp
