#pragma once
/// The decoder: one LibTorch implementation for every supported architecture, described by
/// ModelConfig (per-layer windows and RoPE, norm kind, sandwich norms, activation, scales). The engines drive a layer in two halves so that StreamBP can compute keys
/// and values once per layer and queries chunk by chunk:
///   kv = layer->keys_values(x, positions)            (N1, k/v projections, k-norm, RoPE)
///   y  = layer->forward_queries(x_c, positions_c, kv, mask_c)  (queries of one chunk)
/// and layer->forward(x, positions, mask) is both over the whole sequence. The *_normed
/// variants take input_layernorm's output, so rows that feed both halves are normalized once.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "streambp/batch.h"
#include "streambp/config.h"
#include "streambp/safetensors.h"

namespace streambp {

class LoraAdapter;
struct LoraWeights;

/// RMSNorm as in HF: normalize in at least float32, then (config.norm_kind) cast back and
/// scale by w (Llama, Qwen, Mistral), or scale by (1 + w) and cast back (Gemma).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, NormKind kind = NormKind::kScaled);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
  NormKind kind_;
};
TORCH_MODULE(RMSNorm);

/// Rotary tables of one RoPE for given positions: cos/sin [B, T, head_dim] in the dtype of
/// the hidden states (computed in at least float32, in float64 for float64 models).
struct RopeTable {
  torch::Tensor cos;
  torch::Tensor sin;
};
/// The rotary tables of a set of positions for every RoPE the model's layers use (one, or
/// Gemma3's global and local ones): a layer picks its own (ModelConfig::rope_kind).
struct Rope {
  std::vector<RopeTable> kinds;
  /// The tables of positions [s, e) (dimension 1).
  Rope slice(int64_t s, int64_t e) const;
};
/// One RoPE: inverse frequencies from a base and a scaling rule.
class RotaryEmbedding {
 public:
  RotaryEmbedding(int64_t head_dim, double theta, const RopeScaling& scaling);
  RopeTable tables(const torch::Tensor& position_ids, const torch::Tensor& like) const;
  /// x: [B, T, heads, head_dim] (position major, as the projections give it); rope
  /// tables [B, T, head_dim]. Returns the same layout, contiguous.
  static torch::Tensor apply(const torch::Tensor& x, const RopeTable& rope);
  const torch::Tensor& inv_freq() const { return inv_freq_; }

 private:
  torch::Tensor inv_freq_;  // float64, [head_dim / 2]
};

/// Keys and values of a whole sequence, after k-norm and RoPE: [B, kv_heads, T, head_dim]
/// (contiguous, as keys_values() returns them).
struct KeysValues {
  torch::Tensor k;
  torch::Tensor v;
};

class HeadExchange;

/// Selective recompute (the stream engine's EngineOptions::keep_attention): one call's rows
/// of a layer's attention output and log-sum-exp, kept from the forward so that the
/// backward's attention does not run its forward again (two of its GEMMs per key tile) and
/// only runs its backward from them. out: [B * kv_heads, rows * groups, head_dim] and lse:
/// [B * kv_heads, rows * groups, 1], in the attention's compute dtype (float32; float64 for
/// float64 models): views into the layer's buffers for the call's query positions.
struct AttentionKept {
  torch::Tensor out, lse;
  bool replay = false;  ///< false: the call writes its rows here; true: it takes them from here
};

/// How forward_queries computes attention. With key_tile > 0 and more keys than that, or
/// query_tile > 0 and more queries than that, it runs over blocks of queries and tiles of
/// keys with an online softmax (the FlashAttention recurrences; the backward recomputes
/// each tile from the saved log-sum-exp): no queries x keys scores ever exist, only a
/// query block x key tile at a time. Otherwise scores are materialized (PyTorch eager).
struct AttentionTiling {
  int64_t key_tile = 0;    ///< keys per tile (0: all keys at once)
  int64_t query_tile = 0;  ///< query positions per block (0: all queries at once)
  /// Tiled only: when set, the backward adds dL/dK and dL/dV into these buffers
  /// ([B, kv_heads, >= keys, head_dim], float32, float64 for float64 models) instead of
  /// returning them through autograd, so a caller that visits the keys in many calls (the
  /// stream engine: one call per query chunk over a growing prefix) accumulates them in
  /// place, without a prefix-sized gradient per call. The buffers must outlive the graph.
  const KeysValues* grad_sink = nullptr;
  /// Context parallel over heads (docs/architecture.md: Context parallel): when set, the
  /// layer hands its query rows to this exchange instead of attending itself (the K/V and
  /// pattern of the call are the exchange's).
  const HeadExchange* heads = nullptr;
  /// Tiled only (a call with it is always tiled): where the call writes, or from where it
  /// replays, its output and log-sum-exp (AttentionKept).
  const AttentionKept* kept = nullptr;
  /// Tile even a call whose keys fit in one tile (a call is otherwise tiled only past
  /// key_tile / query_tile or with grad_sink / kept). The stream engine's forward sets it:
  /// its backward recomputes every chunk through the tiled kernel (grad_sink), so the
  /// forward computes the very same outputs, bit for bit, and kept ones replay exactly.
  bool always = false;
};

/// Attention with the heads split over the ranks of a context-parallel group (Ulysses): the
/// layer's query rows of this rank's positions go to the ranks that own their heads, each
/// rank attends its heads' queries from every rank against the whole sequence's K/V of
/// those heads, and the outputs come back; differentiable (the backward exchanges the
/// gradients the other way). Built by the stream engine for one query chunk.
class HeadExchange {
 public:
  virtual ~HeadExchange() = default;
  /// qg [B, KVH, C*G, hd] in the layer's layout (AttentionCall's q: all heads of this rank's
  /// C query positions) -> the attention output in the same layout.
  virtual torch::Tensor attend(const torch::Tensor& qg, int64_t groups, double scale) const = 0;
};

/// A linear projection y = x W^T (+ b), HF's nn.Linear (parameters "weight", "bias"), plus
/// the term s · B(A x) of the LoRA adapter that targets it, when one does
/// (CausalLMImpl::set_adapter): adapters address projections by module, not by index.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in, int64_t out, bool bias);
  torch::Tensor forward(const torch::Tensor& x);
  /// forward(x) for an output that is only backpropagated, never read (a layer's recompute
  /// for its backward: DecoderLayerImpl::backward_queries_normed). When the weight gradients
  /// go in place (InPlaceWeightGradients, docs/architecture.md: Engines) the product x W^T is
  /// left out: the result has forward's shape, graph and backward (the same dX, dW, db, and
  /// the adapter's), but zeros where the product would be. Otherwise it is forward(x).
  torch::Tensor backward_only(const torch::Tensor& x);
  /// The adapter term from now on (null: none).
  void set_lora(const LoraWeights* weights, double scale);
  torch::Tensor weight;  ///< [out, in]
  torch::Tensor bias;    ///< [out], undefined without a bias

 private:
  /// forward (product) or backward_only (!product).
  torch::Tensor apply(const torch::Tensor& x, bool product);
  const LoraWeights* lora_ = nullptr;
  double lora_scale_ = 0.0;
};
TORCH_MODULE(Projection);

/// A projection of a layer module as its spec gives it: name (PEFT's module name), shape.
struct ProjectionSpec {
  std::string name;  ///< "q_proj", "gate_proj", ...
  int64_t in = 0, out = 0;
  bool bias = false;
};

/// A projection an adapter can target, anywhere in the model: its HF module path
/// ("model.layers.3.self_attn.q_proj", "lm_head"), PEFT's name for it (the path's last part)
/// and its shape.
struct ProjectionSite {
  std::string path;
  std::string name;
  int64_t in = 0, out = 0;
};
/// Every projection of a model of `config` an adapter can target, in the order of its
/// parameters (per layer the attention's, then the feed-forward's; the untied lm_head last):
/// what the modules below are built from.
std::vector<ProjectionSite> ProjectionSites(const ModelConfig& config);

/// Self-attention (HF's `self_attn`): q/k/v/o projections and Qwen3's q/k norms, over
/// normalized layer inputs. K/V once per layer, queries per chunk (the engines' halves).
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, int64_t layer);
  /// The projections of this module for `config` (names, shapes): q_proj k_proj v_proj o_proj.
  static std::vector<ProjectionSpec> Projections(const ModelConfig& config);
  /// K/V of normalized inputs h [B, T, d] (k-norm, RoPE), [B, KVH, T, hd] contiguous. With
  /// !read the K/V are only backpropagated, never read (the stream engine's recompute for
  /// their VJP): V's projection, and K's where no k-norm reads it, leave out their products
  /// (ProjectionImpl::backward_only): the same graph and gradients, other values.
  KeysValues keys_values(const torch::Tensor& h, const Rope& rope, bool read = true);
  /// o_proj(attention) of the query rows h_q [B, c, d] against kv under `pattern`.
  torch::Tensor forward(const torch::Tensor& h_q, const Rope& rope_q, const KeysValues& kv,
                        const AttentionPattern& pattern, const AttentionTiling& tiling);
  /// Parameters under HF's names below `prefix` ("model.layers.3.self_attn"), in HF's order.
  void append_hf_parameters(const std::string& prefix, std::vector<std::pair<std::string, torch::Tensor>>& out) const;
  /// The projections by name, in Projections()' order.
  std::vector<std::pair<std::string, Projection>> projections() const;

  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // only with config.qk_norm

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double scale_;
  int rope_kind_;
};
TORCH_MODULE(Attention);

/// The feed-forward seam (HF's `mlp`): what a layer applies to its normalized post-attention
/// state. A dense gated MLP or a mixture of experts (MakeFeedForward picks one per layer).
class FeedForwardImpl : public torch::nn::Module {
 public:
  ~FeedForwardImpl() override = default;
  /// h [B, c, d]: the rows of the batch's positions [q_start, q_start + c) (what a routing
  /// replay indexes; a dense MLP ignores it).
  virtual torch::Tensor forward(const torch::Tensor& h, int64_t q_start) = 0;
  /// forward for an output that is only backpropagated, never read: a module may leave out
  /// the products that feed only the value (ProjectionImpl::backward_only). By default forward.
  virtual torch::Tensor backward_only(const torch::Tensor& h, int64_t q_start) { return forward(h, q_start); }
  virtual void append_hf_parameters(const std::string& prefix,
                                    std::vector<std::pair<std::string, torch::Tensor>>& out) const = 0;
  virtual std::vector<std::pair<std::string, Projection>> projections() const = 0;
};

/// act(gate_proj(h)) * up_proj(h), then down_proj: SwiGLU (SiLU) or Gemma's tanh-GELU.
/// `width` is the hidden width (0: config.intermediate_size; an expert's: moe_intermediate_size).
class GatedMlpImpl : public FeedForwardImpl {
 public:
  explicit GatedMlpImpl(const ModelConfig& config, int64_t width = 0);
  /// gate_proj up_proj down_proj.
  static std::vector<ProjectionSpec> Projections(const ModelConfig& config, int64_t width = 0);
  torch::Tensor forward(const torch::Tensor& h, int64_t q_start) override;
  /// The down projection's product left out (its output is the MLP's).
  torch::Tensor backward_only(const torch::Tensor& h, int64_t q_start) override;
  void append_hf_parameters(const std::string& prefix,
                            std::vector<std::pair<std::string, torch::Tensor>>& out) const override;
  std::vector<std::pair<std::string, Projection>> projections() const override;

  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  Activation activation_;
};

/// Where a mixture of experts sent the tokens of one forward call: per token its top-k
/// expert ids [N, k] (int64, in descending router probability), the router's
/// probabilities of them [N, k] (renormalised when the config says so), and its softmax
/// over all experts [N, E] (at least float32).
struct Routing {
  torch::Tensor experts;
  torch::Tensor weights;
  torch::Tensor probs;
};

/// Routing replay: the experts the tokens of one batch go to in the sparse layers instead of
/// the router's choice (an RL trainer replaying what its sampler routed). The weights stay
/// the router's probabilities of those experts, renormalised as configured.
struct RoutingReplay {
  /// [B, T, sparse_layers * k] int64 on the model's device (Batch::routed_experts): sparse
  /// layer j reads entries [j k, (j + 1) k); -1 (all k of them): the router routes that token.
  torch::Tensor experts;
  /// Recording instead: the layers write the router's choices into `experts` (allocated
  /// [B, T, sparse_layers * k], -1) for the rows they route, and replay nothing.
  bool record = false;
  /// Filled by the layers, on the model's device (read once, at the end of the step):
  /// [replayed (token, layer, slot) choices, of them experts outside the router's own top-k].
  torch::Tensor counted;
  int64_t decisions() const;
  int64_t mismatches() const;
};

/// The load-balancing loss of a batch's sparse layers, HF's load_balancing_loss_func with
/// the padding masked:
///   aux = E sum_e f_e P_e,   f_e = C_e / (L N),   P_e = S_e / (L N)
/// over the N non-padding tokens and L sparse layers, where C_e counts the (token, layer)
/// pairs routed to expert e (the experts used: the replayed ones where a replay gives them)
/// and S_e sums the router's probability of e over them. f carries no gradient, so the loss
/// coef * aux adds coef E C_e / (L N)^2 to dL/dp_e of every token and layer: the engines'
/// first forward collects C and S (no graph), and each later forward of a sparse layer with
/// a graph adds that gradient to its router probabilities in the backward — exact under any
/// chunking (docs/architecture.md: Models). A step split into micro-batches or ranks adds
/// each part's aux weighted by its share of the step's tokens (N N_step in place of N^2).
struct RouterAuxLoss {
  torch::Tensor valid;     ///< [B, T] bool: non-padding positions
  double scale = 0;        ///< coef E / (L^2 N N_step): the gradient per count
  bool collecting = true;  ///< the layers add to counts and probs (the engine's first forward)
  torch::Tensor counts;    ///< [E] float64: C
  torch::Tensor probs;     ///< [E] float64: S
};

/// A mixture of experts (HF's Qwen3MoeSparseMoeBlock): the router `gate` (d -> E, no bias)
/// gives each token a softmax over the experts (in at least float32); the token goes to its
/// top-k experts, whose outputs are added weighted by those probabilities (renormalised to
/// sum 1 when norm_topk_prob). The router learns through the chosen probabilities. The
/// tokens of a call are grouped by expert (one sort), each active expert runs one GEMM chain
/// over its rows, and the rows come back in token order (docs/architecture.md: Models).
class SparseMoeImpl : public FeedForwardImpl {
 public:
  explicit SparseMoeImpl(const ModelConfig& config);
  /// experts.{e}.gate_proj, experts.{e}.up_proj, experts.{e}.down_proj for every expert e.
  static std::vector<ProjectionSpec> Projections(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& h, int64_t q_start) override;
  /// The router's choice for normalized inputs h [N, d] (graph recorded in grad mode), or
  /// the experts `given` [N, k] (int64; rows of -1: the router's choice) weighted by the
  /// router's probabilities of them; `replay` (optional) counts the replayed decisions.
  Routing route(const torch::Tensor& h, const torch::Tensor& given = {}, RoutingReplay* replay = nullptr);
  /// Replay and aux loss from now on (null: none): this layer is the `sparse_index`-th sparse layer.
  void set_routing(RoutingReplay* replay, RouterAuxLoss* aux, int64_t sparse_index);
  void append_hf_parameters(const std::string& prefix,
                            std::vector<std::pair<std::string, torch::Tensor>>& out) const override;
  std::vector<std::pair<std::string, Projection>> projections() const override;

  Projection gate{nullptr};
  std::vector<std::shared_ptr<GatedMlpImpl>> experts;

 private:
  int64_t top_k_;
  bool norm_topk_prob_;
  RoutingReplay* replay_ = nullptr;
  RouterAuxLoss* aux_ = nullptr;
  int64_t sparse_index_ = 0;
};

/// The feed-forward module of layer `layer` (a GatedMlp, or a SparseMoe on a sparse layer of
/// a mixture-of-experts model) and its projections' specs.
std::shared_ptr<FeedForwardImpl> MakeFeedForward(const ModelConfig& config, int64_t layer);
std::vector<ProjectionSpec> FeedForwardProjections(const ModelConfig& config, int64_t layer);

/// One decoder layer composed of its modules: input_layernorm, self_attn,
/// post_attention_layernorm, (Gemma3's pre/post_feedforward_layernorm,) mlp.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& config, int64_t index);

  /// K/V for all positions of x [B, T, d] (graph recorded if grad mode is on); `read` as
  /// AttentionImpl::keys_values.
  KeysValues keys_values(const torch::Tensor& x, const Rope& rope, bool read = true);
  /// K/V from h = input_layernorm(x): an engine that needs both halves of the same rows
  /// normalizes them once and passes h here and to forward_queries.
  KeysValues keys_values_normed(const torch::Tensor& h, const Rope& rope, bool read = true);
  /// Output rows for the query positions x_q [B, c, d] (a contiguous slice [s, s+c) of the
  /// layer input) attending to kv restricted to the first kv.k.size(2) positions.
  /// `mask` (a [B, c, kv_len] tensor or a pattern built tile by tile) says where attention
  /// is allowed; every query row must allow at least one key. `tiling`: see AttentionTiling.
  torch::Tensor forward_queries(const torch::Tensor& x_q, const Rope& rope_q,
                                const KeysValues& kv, const AttentionPattern& mask,
                                const AttentionTiling& tiling = {});
  /// forward_queries with the query rows already normalized: h_q = input_layernorm(x_q).
  torch::Tensor forward_queries_normed(const torch::Tensor& x_q, const torch::Tensor& h_q, const Rope& rope_q,
                                       const KeysValues& kv, const AttentionPattern& mask,
                                       const AttentionTiling& tiling = {});
  /// forward_queries_normed in its two halves, row-wise after the attention:
  /// x1 = x_q + attention (Gemma3: its output normalized), then
  /// y = feedforward_residual(x1) = x1 + the feed-forward of x1's norm. Rows [q_start, ...)
  /// of the batch (a mixture of experts replays their routing); `read` as in
  /// backward_queries_normed (false: y's value is never read).
  torch::Tensor attention_residual(const torch::Tensor& x_q, const torch::Tensor& h_q, const Rope& rope_q,
                                   const KeysValues& kv, const AttentionPattern& mask, const AttentionTiling& tiling);
  torch::Tensor feedforward_residual(const torch::Tensor& x1, int64_t q_start, bool read = true);
  /// The whole layer on the whole sequence.
  torch::Tensor forward(const torch::Tensor& x, const Rope& rope, const AttentionPattern& mask,
                        const AttentionTiling& tiling = {});
  /// The backward of forward_queries_normed's rows (an engine's recompute): recomputes them
  /// with a graph and backpropagates grad_y = dL/dy [B, c, d] into whatever requires a
  /// gradient (x_q, h_q, kv, the parameters). The output's value is never read, so the
  /// feed-forward leaves out the products that feed only it (FeedForwardImpl::backward_only)
  /// where no norm reads it (Gemma3's post-feedforward norm does): the same gradients
  /// without the down projection's forward product.
  void backward_queries_normed(const torch::Tensor& x_q, const torch::Tensor& h_q, const Rope& rope_q,
                               const KeysValues& kv, const AttentionPattern& mask, const AttentionTiling& tiling,
                               const torch::Tensor& grad_y);
  /// backward_queries_normed from x_q (input_layernorm recomputed with the graph).
  void backward_queries(const torch::Tensor& x_q, const Rope& rope_q, const KeysValues& kv,
                        const AttentionPattern& mask, const AttentionTiling& tiling, const torch::Tensor& grad_y);
  /// The backward of forward (the whole layer on the whole sequence), as backward_queries_normed.
  void backward(const torch::Tensor& x, const Rope& rope, const AttentionPattern& mask, const AttentionTiling& tiling,
                const torch::Tensor& grad_y);

  /// Parameters under HF's names below `prefix` ("model.layers.3"), in HF's order.
  void append_hf_parameters(const std::string& prefix, std::vector<std::pair<std::string, torch::Tensor>>& out) const;
  /// The projections an adapter can target, by module path within the layer
  /// ("self_attn.q_proj", ..., "mlp.down_proj").
  std::vector<std::pair<std::string, Projection>> projections() const;

  Attention self_attn{nullptr};
  std::shared_ptr<FeedForwardImpl> mlp;
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  // sandwich_norms only

 private:
  /// forward_queries_normed; with read = false for backward_queries_normed.
  torch::Tensor queries_output(const torch::Tensor& x_q, const torch::Tensor& h_q, const Rope& rope_q,
                               const KeysValues& kv, const AttentionPattern& mask, const AttentionTiling& tiling,
                               bool read);
};
TORCH_MODULE(DecoderLayer);

class CausalLMImpl : public torch::nn::Module {
 public:
  explicit CausalLMImpl(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  /// The rotary tables of position_ids [B, T] for every RoPE kind, in the dtype and on the
  /// device of `like` (the hidden states).
  Rope rope_tables(const torch::Tensor& position_ids, const torch::Tensor& like) const;

  /// Token embeddings [B, T, d] of input_ids [B, T] (int64), times the config's embedding
  /// scale (Gemma), with autograd's gradient for a full graph.
  torch::Tensor embed(const torch::Tensor& input_ids);
  /// dL/dx of the embeddings of input_ids added into the embedding matrix's gradient, in
  /// place (no [V, d] tensor of its own): the scale applied, the pad_token_id row left out
  /// (nn.Embedding's padding_idx). No-op when the matrix does not train.
  void embed_backward(const torch::Tensor& input_ids, const torch::Tensor& grad);
  /// Logits of final hidden states h [B, T, d] (after the final norm is applied here),
  /// upcast to at least float32, soft-capped when the config says so.
  torch::Tensor logits(const torch::Tensor& h_last);
  /// logits(h_last) with the lm_head matrix outside the graph, for a caller that adds its
  /// gradient itself (W.grad += dP^T N) instead of autograd's fresh [V, d] tensor per call:
  /// `normed` is norm(h_last) (N) and `projected` is N W^T (P, in the weights' dtype, before
  /// the adapter term and the upcast), both part of the returned logits' graph.
  torch::Tensor logits_outside_head(const torch::Tensor& h_last, torch::Tensor* normed, torch::Tensor* projected);
  /// The lm_head matrix [V, d]: the embedding matrix itself when tied.
  torch::Tensor lm_head_weight() const;

  /// Parameters under their Hugging Face names (tied lm_head appears once, as
  /// model.embed_tokens.weight).
  std::vector<std::pair<std::string, torch::Tensor>> named_hf_parameters() const;

  /// Copies tensors (any dtype, converted to the model's) into the parameters. Every
  /// parameter must be present with the right shape, else InvalidArgument naming it; a
  /// tensor with no parameter is an error too (except lm_head.weight of a tied model and
  /// rotary inv_freq buffers, which are ignored).
  void load_hf_tensors(const TensorMap& tensors);
  TensorMap hf_tensors() const;  ///< detached copies of the parameters, HF names

  /// Attaches `adapter` (null: none, the base model alone): the projections it targets add
  /// its terms from now on, in every engine. The model keeps it alive while attached.
  /// InvalidArgument when the adapter was made for another model shape.
  void set_adapter(std::shared_ptr<const LoraAdapter> adapter);
  const std::shared_ptr<const LoraAdapter>& adapter() const { return adapter_; }
  /// Routes the sparse layers by `replay` from now on (null: by their routers) and adds the
  /// load-balancing loss `aux` (null: none). The caller keeps them alive while set
  /// (ScopedRoutingReplay).
  void set_routing(RoutingReplay* replay, RouterAuxLoss* aux = nullptr);
  RoutingReplay* routing_replay() const { return replay_; }
  RouterAuxLoss* router_aux_loss() const { return aux_; }
  /// The weights with the attached adapter folded in (W + s B A, computed in the adapter's
  /// dtype, stored in the model's), HF names: a plain model with the same outputs.
  TensorMap merged_hf_tensors() const;

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<DecoderLayer> layer_list;
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied

 private:
  ModelConfig config_;
  std::vector<RotaryEmbedding> rotary_;  // by ModelConfig::rope_kind
  std::shared_ptr<const LoraAdapter> adapter_;
  RoutingReplay* replay_ = nullptr;
  RouterAuxLoss* aux_ = nullptr;
};
TORCH_MODULE(CausalLM);

/// Attaches `adapter` to `model` for a scope and restores the one attached before (the
/// reference model of an adapter run is the base with its adapter off: a null adapter).
class ScopedAdapter {
 public:
  ScopedAdapter(CausalLMImpl& model, std::shared_ptr<const LoraAdapter> adapter);
  ~ScopedAdapter();
  ScopedAdapter(const ScopedAdapter&) = delete;
  ScopedAdapter& operator=(const ScopedAdapter&) = delete;

 private:
  CausalLMImpl& model_;
  std::shared_ptr<const LoraAdapter> previous_;
};

/// Sets a routing replay (none when `replay` is null or holds no experts) and an aux loss
/// (none when null) for a scope, and restores the ones set before at the end.
class ScopedRoutingReplay {
 public:
  ScopedRoutingReplay(CausalLMImpl& model, RoutingReplay* replay, RouterAuxLoss* aux = nullptr);
  ~ScopedRoutingReplay();
  ScopedRoutingReplay(const ScopedRoutingReplay&) = delete;
  ScopedRoutingReplay& operator=(const ScopedRoutingReplay&) = delete;

 private:
  CausalLMImpl& model_;
  RoutingReplay* previous_replay_;
  RouterAuxLoss* previous_aux_;
};

/// Parses a dtype name: float32 | float64 | bfloat16 | float16 (also fp32, bf16, ...).
torch::Dtype ParseDtype(const std::string& name);
std::string DtypeName(torch::Dtype dtype);

/// Throws InvalidArgument for a dtype the device cannot compute in (float16 on the CPU).
void CheckDtypeOnDevice(torch::Dtype dtype, const torch::Device& device);

/// A model built from a config with deterministic random weights (normal(0, 0.02) for
/// matrices, norms the identity (w = 1, or 0 for Gemma's 1 + w), 0 for biases) from `seed`, independent of global RNG state, on
/// `device`. Models up to kHostDrawParameters draw on the CPU: the same values in every dtype,
/// on every machine and device. Larger ones (the qwen3-8b preset) draw on a CUDA `device`
/// with its own generator (a CPU draw of 8e9 values takes minutes): deterministic per seed
/// on that kind of device, not equal to the CPU's values.
CausalLM InitModel(const ModelConfig& config, uint64_t seed, torch::Dtype dtype,
                   const torch::Device& device = torch::kCPU);
inline constexpr int64_t kHostDrawParameters = int64_t{1} << 30;

/// Loads a Hugging Face model folder (config.json + safetensors) in `dtype` on `device`.
CausalLM LoadModel(const std::string& dir, torch::Dtype dtype,
                   const torch::Device& device = torch::kCPU);

/// Writes config.json + model.safetensors (HF names; each tensor in the model's dtype).
void SaveModel(const CausalLM& model, const std::string& dir);

/// The files of a model folder that travel with its weights so that a copy (a checkpoint,
/// an export) loads in transformers / vLLM as is: tokenizer.json, tokenizer_config.json,
/// special_tokens_map.json, generation_config.json, chat_template.jinja, vocab.json,
/// merges.txt.
const std::vector<std::string>& ModelSideFileNames();
/// Those of them present in `dir`, as (name, bytes), in the order above ({} for "").
std::vector<std::pair<std::string, std::string>> ReadModelSideFiles(const std::string& dir);
/// Writes side files into `dir` (atomically, each).
void WriteModelSideFiles(const std::vector<std::pair<std::string, std::string>>& files, const std::string& dir);
/// The ids that end a completion: config.json's eos_token_id(s) and generation_config.json's
/// (an id or a list), without repeats, in that order. `dir` "" = the config's only.
std::vector<int64_t> ModelEosTokenIds(const ModelConfig& config, const std::string& dir);

/// Where a model comes from: a Hugging Face folder, or the embedded preset made from a seed.
struct ModelSource {
  std::string dir;                ///< HF model folder; empty = the embedded preset
  std::string preset = "tiny";    ///< embedded preset when dir is empty: tiny | small
  std::string family = "qwen3";   ///< the preset's architecture: llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3
  uint64_t seed = 0;              ///< seed of the embedded preset
  std::string dtype = "float32";  ///< float32 | float64 | bfloat16 | float16
  std::string device = "cpu";     ///< cpu | cuda | cuda:N (as torch::Device parses it)

  /// "embedded tiny preset (seed 0)" (with its family when not qwen3) or the folder.
  std::string describe() const;
};

/// Checks a model source without loading its weights: the dtype and device names, a CUDA
/// device on a build or machine that has none, a dtype the device cannot compute in, the
/// folder and its config.json (an unsupported architecture or a config key that changes the
/// math). Throws InvalidArgument / NotFound naming what is wrong and what to do.
void CheckModelSource(const ModelSource& source);

/// The one way every program builds its model (server, followers, tools, bench): LoadModel
/// of source.dir, or InitModel of the preset, in source.dtype, moved to `device` (null:
/// source.device). Throws InvalidArgument / NotFound naming what is wrong.
CausalLM LoadOrInitModel(const ModelSource& source, const torch::Device* device = nullptr);

}  // namespace streambp
