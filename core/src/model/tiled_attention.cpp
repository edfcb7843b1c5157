// Tiled attention with an online softmax and a recomputing backward (the FlashAttention
// recurrences; the products are LibTorch ops). Forward, per query block and key tile j with
// scores S_j (q pre-scaled):
//   m' = max(m, rowmax S_j);  l = l e^(m - m') + rowsum e^(S_j - m');  acc = acc e^(m - m') + e^(S_j - m') V_j
// and out = acc / l, lse = m + log l. Backward with P_j = e^(S_j - lse) and D = rowsum(dO * out):
//   dV_j += P_j^T dO;  dS_j = P_j * (dO V_j^T - D);  dQ += dS_j K_j * scale;  dK_j += dS_j^T Q * scale.
// A tile's elementwise steps (max, exp, sums, rescaling; P and dS in the backward) are
// OnlineSoftmaxStep and SoftmaxGradStep: one pass per row on the CPU (softmax_rows.h).
// Products accumulate in place (baddbmm_) into their destinations; every tensor is viewed
// as [B*KVH, rows, hd], so a block of queries or a tile of keys is a view, never a copy.
// On the CPU the B*KVH slices of a query block are split among the intra-op threads, each
// running its slices' tiles with one-thread products (ForSlices): the same ops per slice,
// so the same values, without every small product of a tile waiting for all threads.
// A tile masked in part (the diagonal) is visited in pieces of query rows (RowPieces), each
// against only the keys its rows may see.
// With AttentionTiling::kept a call writes its out and lse there, or (replay, the stream
// engine's backward with EngineOptions::keep_attention) takes them from there instead of
// running the forward's tiles: the backward is the same from the same out and lse.
#include "tiled_attention.h"

#include <algorithm>
#include <limits>
#include <optional>

#include <torch/torch.h>

#include "cpu_threads.h"
#include "softmax_rows.h"

namespace streambp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

torch::Dtype ComputeDtypeOf(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// [B, KVH, rows, hd] -> [B*KVH, rows, hd]: a view when B and KVH merge (contiguous
// tensors, and prefixes [0, e) of contiguous K/V, as the stream engine passes them), else a
// copy. A grad sink must be a view, since the backward writes into it.
torch::Tensor Flat(const torch::Tensor& t, bool must_view = false) {
  const bool merges = t.size(0) == 1 || t.stride(0) == t.size(1) * t.stride(1);
  TORCH_CHECK(merges || !must_view, "TiledAttention: the K/V gradient sink must be contiguous");
  return (merges ? t : t.contiguous()).view({-1, t.size(-2), t.size(-1)});
}

// out += alpha * a @ b: the product in `dtype` (the model's precision), the sum in out's.
void AddProduct(torch::Tensor out, const torch::Tensor& a, const torch::Tensor& b, double alpha,
                torch::Dtype dtype) {
  if (out.scalar_type() == dtype && a.scalar_type() == dtype && b.scalar_type() == dtype) {
    out.baddbmm_(a, b, 1.0, alpha);
  } else {
    out.add_(torch::bmm(a.to(dtype), b.to(dtype)).to(out.scalar_type()), alpha);
  }
}

// a @ b in `dtype`, returned in the compute dtype cd.
torch::Tensor Product(const torch::Tensor& a, const torch::Tensor& b, torch::Dtype dtype, torch::Dtype cd) {
  return torch::bmm(a.to(dtype), b.to(dtype)).to(cd);
}

// One product of a block's visit: the queries [q0, q1) (the block's, or a piece of them)
// against the keys [k0, k1).
struct Tile {
  int64_t k0, k1;
  bool full;  // every (query, key) pair is allowed: no masking needed
  torch::Tensor mask;  // its mask where the plan built it (else built when needed)
  int64_t q0, q1;
};

// A tile that the pattern masks in part over many query rows (the causal diagonal, a
// window's edge) is visited in pieces of rows, each against the keys some row of the piece
// may see: the diagonal's masked half is mostly not computed. In kRowPieces pieces, a
// query block x its diagonal tile computes 5/8 of the square instead of all of it (the
// masked pairs computed for chunks of c in a T-long row fall from c/T of the causal pairs to
// c/4T: 6.25% -> 1.56% at 512 of 8192).
// Taken where the pieces save an eighth of the tile or more, and where the products run in
// the compute dtype (float32, float64): a bfloat16 product rounds its sum once, and four
// pieces' dK/dV products would round four partial sums (EngineBfloat16.* saw q_norm's
// gradient error grow from within 1.25x autograd's to 1.5x). The pieces of a tile follow
// each other in row order, so each row still meets its keys in order.
constexpr int64_t kRowPieces = 4;

std::vector<Tile> RowPieces(const AttentionPattern& pattern, int64_t q0, int64_t q1, const Tile& t,
                            bool pieces_allowed) {
  const int64_t rows = q1 - q0, step = (rows + kRowPieces - 1) / kRowPieces;
  if (!pieces_allowed || t.full || rows < 2) return {};
  std::vector<Tile> pieces;
  int64_t area = 0;
  for (int64_t s0 = q0; s0 < q1; s0 += step) {
    const int64_t s1 = std::min(q1, s0 + step);
    const int64_t k0 = std::max(t.k0, pattern.key_start(s0, s1));
    const int64_t k1 = std::min(t.k1, pattern.key_limit(s0, s1));
    if (k0 >= k1) continue;
    pieces.push_back({k0, k1, false, torch::Tensor(), s0, s1});
    area += (s1 - s0) * (k1 - k0);
  }
  if (8 * area > 7 * rows * (t.k1 - t.k0)) return {};
  return pieces;
}

// PlanTiles for the causal rule over sequence ids held on the CPU, without a mask for the
// tiles that need none (building every tile's mask to ask any() and all() of it took 1.3 s
// of a 32.8 s CPU step at T = 4096, ~4%): a tile inside the causal band (and window) whose
// batch rows' keys and queries each belong to one sequence is allowed entirely; a tile the
// band does not reach is skipped; the others (the diagonal, a window's edge, a document or
// padding boundary) get their mask, kept for the scores, and are skipped where it allows
// nothing, or split by RowPieces (before any mask is built) as PlanTiles splits them. The same tiles, pieces and
// flags as the masks give: the same output and gradients, bit for bit. nullopt: not such a rule.
std::optional<std::vector<Tile>> PlanTilesOnHost(const AttentionPattern& pattern, int64_t q0, int64_t q1,
                                                 int64_t tile, bool pieces_allowed) {
  const auto& ids = pattern.sequence_ids;
  if (pattern.mask.defined() || !ids.defined() || !ids.device().is_cpu() || ids.scalar_type() != torch::kInt64 ||
      ids.dim() != 2 || !ids.is_contiguous()) {
    return std::nullopt;
  }
  const int64_t w = pattern.window, B = ids.size(0), T = ids.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  std::vector<Tile> tiles;
  // Queries [s0, s1) x keys [k0, k1), appended to `tiles`: nothing where no pair is in the
  // band, whole where it is allowed entirely, else (split) its row pieces, each visited the
  // same way, where RowPieces takes it, or whole with its mask where that allows something.
  auto visit = [&](const auto& self, int64_t s0, int64_t s1, int64_t k0, int64_t k1, bool split) -> void {
    const int64_t qa = pattern.q_start + s0, qb = pattern.q_start + s1;
    // Some pair is in the band: the closest one (query qa, key k1 - 1) within the window, and
    // a key at or before the last query.
    if (k0 > qb - 1 || (w > 0 && qa - (k1 - 1) >= w)) return;
    // Whether each batch row's queries and keys all belong to the sequence of its first query.
    auto one_sequence = [&] {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t* row = id + b * T;
        for (int64_t j = qa; j < qb; ++j) {
          if (row[j] != row[qa]) return false;
        }
        for (int64_t j = k0; j < k1; ++j) {
          if (row[j] != row[qa]) return false;
        }
      }
      return true;
    };
    if (k1 - 1 <= qa && (w == 0 || (qb - 1) - k0 < w) && one_sequence()) {
      tiles.push_back({k0, k1, true, torch::Tensor(), s0, s1});
      return;
    }
    const auto pieces = split ? RowPieces(pattern, s0, s1, Tile{k0, k1, false, torch::Tensor(), s0, s1},
                                          pieces_allowed)
                              : std::vector<Tile>{};
    for (const auto& piece : pieces) self(self, piece.q0, piece.q1, piece.k0, piece.k1, false);
    if (!pieces.empty()) return;
    auto mask = pattern.block(s0, s1, k0, k1);
    if (mask.any().item<bool>()) tiles.push_back({k0, k1, false, std::move(mask), s0, s1});
  };
  const int64_t limit = pattern.key_limit(q0, q1);
  for (int64_t k0 = pattern.key_start(q0, q1); k0 < limit; k0 += tile) {
    visit(visit, q0, q1, k0, std::min(limit, k0 + tile), true);
  }
  return tiles;
}

// The key tiles that some query row of [q0, q1) may attend to, which of them need no mask,
// and the row pieces of those masked in part (RowPieces). Read back once per block (one
// device sync on a GPU, not one per tile). Tiles run from the first key any query of the
// block may see (its window's oldest key, its sequence's start: AttentionPattern::key_start),
// so no tile is spent on keys all of them mask.
std::vector<Tile> PlanTiles(const AttentionPattern& pattern, int64_t q0, int64_t q1, int64_t tile,
                            bool pieces_allowed) {
  if (auto planned = PlanTilesOnHost(pattern, q0, q1, tile, pieces_allowed)) return *std::move(planned);
  const int64_t limit = pattern.key_limit(q0, q1);
  // Every tile and every candidate piece (RowPieces of the tile as if it were masked),
  // flagged together; a tile's pieces replace it where the tile is masked in part.
  std::vector<Tile> candidates;
  std::vector<std::pair<size_t, size_t>> pieces_of;  // per tile: its pieces' range in candidates
  std::vector<torch::Tensor> flags;
  auto add = [&](const Tile& t) {
    auto m = pattern.block(t.q0, t.q1, t.k0, t.k1);
    flags.push_back(m.any());
    flags.push_back(m.all());
    candidates.push_back(t);
  };
  std::vector<size_t> tile_at;
  for (int64_t k0 = pattern.key_start(q0, q1); k0 < limit; k0 += tile) {
    const Tile t{k0, std::min(limit, k0 + tile), false, torch::Tensor(), q0, q1};
    tile_at.push_back(candidates.size());
    add(t);
    const size_t first = candidates.size();
    for (const auto& piece : RowPieces(pattern, q0, q1, t, pieces_allowed)) add(piece);
    pieces_of.emplace_back(first, candidates.size());
  }
  if (candidates.empty()) return {};
  const auto read = torch::stack(flags).to(torch::kCPU).contiguous();
  const bool* f = read.data_ptr<bool>();
  auto keep = [&](size_t i, std::vector<Tile>& out) {
    if (!f[2 * i]) return;
    auto t = candidates[i];
    t.full = f[2 * i + 1];
    out.push_back(std::move(t));
  };
  std::vector<Tile> kept;
  for (size_t n = 0; n < tile_at.size(); ++n) {
    const size_t i = tile_at[n];
    const auto [first, last] = pieces_of[n];
    if (!f[2 * i]) continue;
    if (f[2 * i + 1] || first == last) {
      keep(i, kept);
      continue;
    }
    for (size_t j = first; j < last; ++j) keep(j, kept);
  }
  return kept;
}

// What a call needs besides q, k, v: the block structure and where dK/dV go.
struct Plan {
  int64_t B, KVH, G, C, L, query_tile, key_tile;
  torch::Dtype dtype, cd;
  bool pieces;  // RowPieces may split masked tiles: the products run in the compute dtype
};

Plan MakePlan(const torch::Tensor& q, const torch::Tensor& k, int64_t groups, const AttentionTiling& tiling) {
  Plan p;
  p.B = q.size(0);
  p.KVH = q.size(1);
  p.G = groups;
  p.C = q.size(2) / groups;
  p.L = k.size(2);
  p.query_tile = tiling.query_tile > 0 ? std::min(tiling.query_tile, p.C) : p.C;
  p.key_tile = tiling.key_tile > 0 ? std::min(tiling.key_tile, p.L) : p.L;
  p.dtype = q.scalar_type();
  p.cd = ComputeDtypeOf(q);
  p.pieces = p.dtype == p.cd;
  return p;
}

// Scores of tile t's query positions [t.q0, t.q1) against its keys for the slices [b0, b1) of
// B*KVH that q3 and k3 hold: [b1-b0, (t.q1-t.q0)*G, t.k1-t.k0] in the compute dtype, -inf
// where the pattern masks (q is pre-scaled).
torch::Tensor Scores(const Plan& p, const torch::Tensor& q3, const torch::Tensor& k3, const AttentionPattern& pattern,
                     const Tile& t, int64_t b0, int64_t b1) {
  const int64_t q0 = t.q0, q1 = t.q1;
  auto s = Product(q3.slice(1, q0 * p.G, q1 * p.G), k3.slice(1, t.k0, t.k1).transpose(1, 2), p.dtype, p.cd);
  if (!t.full) {
    const int64_t rows = q1 - q0, keys = t.k1 - t.k0;
    auto masked = (t.mask.defined() ? t.mask : pattern.block(q0, q1, t.k0, t.k1)).logical_not();
    if (b0 == 0 && b1 == p.B * p.KVH) {
      s.view({p.B, p.KVH, rows, p.G, keys}).masked_fill_(masked.reshape({p.B, 1, rows, 1, keys}), kNegInf);
    } else {
      // Slice i of B*KVH belongs to batch row i / KVH.
      auto batch = torch::arange(b0, b1, torch::TensorOptions().dtype(torch::kLong).device(masked.device()))
                       .div_(p.KVH, "floor");
      s.view({b1 - b0, rows, p.G, keys})
          .masked_fill_(masked.index_select(0, batch).reshape({b1 - b0, rows, 1, keys}), kNegInf);
    }
  }
  return s;
}

// Runs f(b0, b1) over the B*KVH slices: split among TiledAttentionThreads threads (OnRanges),
// else f(0, B*KVH) on this thread.
template <typename F>
void ForSlices(const Plan& p, const torch::Tensor& like, const F& f) {
  const int64_t n = p.B * p.KVH;
  if (TiledAttentionThreads(n, like.device()) == 1) {
    f(0, n);
    return;
  }
  OnRanges(n, f);
}

void SavePattern(AutogradContext* ctx, const AttentionPattern& m) {
  ctx->saved_data["mask"] = m.mask;
  ctx->saved_data["sequence_ids"] = m.sequence_ids;
  ctx->saved_data["pattern"] = std::vector<int64_t>{m.q_start, m.q_end, m.k_end, m.window};
  // The runs, so that the backward's tiles start where the forward's did: each row's length,
  // then its starts (empty where unknown).
  std::vector<int64_t> runs;
  if (m.runs) {
    for (const auto& row : *m.runs) runs.push_back(static_cast<int64_t>(row.size()));
    for (const auto& row : *m.runs) runs.insert(runs.end(), row.begin(), row.end());
  }
  ctx->saved_data["runs"] = runs;
  ctx->saved_data["rows"] = static_cast<int64_t>(m.runs ? m.runs->size() : 0);
}

AttentionPattern LoadPattern(AutogradContext* ctx) {
  AttentionPattern m;
  m.mask = ctx->saved_data["mask"].toTensor();
  m.sequence_ids = ctx->saved_data["sequence_ids"].toTensor();
  const auto ints = ctx->saved_data["pattern"].toIntVector();
  m.q_start = ints[0];
  m.q_end = ints[1];
  m.k_end = ints[2];
  m.window = ints[3];
  const int64_t rows = ctx->saved_data["rows"].toInt();
  if (rows > 0) {
    const auto flat = ctx->saved_data["runs"].toIntVector();
    auto runs = std::make_shared<std::vector<std::vector<int64_t>>>(rows);
    size_t at = static_cast<size_t>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const auto n = static_cast<size_t>(flat[static_cast<size_t>(r)]);
      (*runs)[static_cast<size_t>(r)].assign(flat.begin() + at, flat.begin() + at + n);
      at += n;
    }
    m.runs = std::move(runs);
  }
  return m;
}

struct TiledAttentionFunction : public torch::autograd::Function<TiledAttentionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const AttentionPattern& pattern, int64_t groups,
                               double scale, const AttentionTiling& tiling) {
    const Plan p = MakePlan(q, k, groups, tiling);
    const auto qs = (q * scale).contiguous();
    const auto q3 = Flat(qs), k3 = Flat(k), v3 = Flat(v);
    const int64_t BK = q3.size(0), R = q3.size(1), hd = q3.size(2);
    auto opts = q.options().dtype(p.cd);
    const AttentionKept* kept = tiling.kept;
    if (kept != nullptr) {
      const bool shapes =
          kept->out.sizes() == torch::IntArrayRef({BK, R, hd}) && kept->lse.sizes() == torch::IntArrayRef({BK, R, 1});
      TORCH_CHECK(shapes && kept->out.scalar_type() == p.cd && kept->lse.scalar_type() == p.cd,
                  "TiledAttention: the kept output must be [", BK, ", ", R, ", ", hd, "] and its log-sum-exp [", BK,
                  ", ", R, ", 1], in ", c10::toString(p.cd));
    }
    const bool replay = kept != nullptr && kept->replay;
    torch::Tensor out, lse;
    if (replay) {
      // The forward's own output and log-sum-exp (copies: the call's output is its own
      // tensor): no tile runs again.
      out = kept->out.clone(at::MemoryFormat::Contiguous);
      lse = kept->lse.clone(at::MemoryFormat::Contiguous);
    } else {
      out = torch::empty({BK, R, hd}, opts);
      lse = torch::empty({BK, R, 1}, opts);
      for (int64_t q0 = 0; q0 < p.C; q0 += p.query_tile) {
        const int64_t q1 = std::min(p.C, q0 + p.query_tile), r0 = q0 * p.G, r1 = q1 * p.G;
        const auto tiles = PlanTiles(pattern, q0, q1, p.key_tile, p.pieces);
        TORCH_CHECK(!tiles.empty(), "attention: a block of query rows allows no key");
        ForSlices(p, q3, [&](int64_t b0, int64_t b1) {
          const auto qs3 = q3.slice(0, b0, b1), ks3 = k3.slice(0, b0, b1), vs3 = v3.slice(0, b0, b1);
          torch::Tensor m, l, acc;
          for (const auto& t : tiles) {
            auto s = Scores(p, qs3, ks3, pattern, t, b0, b1);
            const bool whole = t.q0 == q0 && t.q1 == q1;
            if (!m.defined()) {
              if (whole) {  // first tile: nothing to rescale
                m = torch::empty({b1 - b0, r1 - r0, 1}, s.options());
                l = torch::empty({b1 - b0, r1 - r0, 1}, s.options());
                OnlineSoftmaxStep(s, m, l, torch::Tensor(), /*first=*/true);
                acc = Product(s, vs3.slice(1, t.k0, t.k1), p.dtype, p.cd);
                continue;
              }
              // The block starts with row pieces: every row starts from no key seen.
              m = torch::full({b1 - b0, r1 - r0, 1}, kNegInf, s.options());
              l = torch::zeros({b1 - b0, r1 - r0, 1}, s.options());
              acc = torch::zeros({b1 - b0, r1 - r0, vs3.size(2)}, s.options());
            }
            // A piece updates its rows' running max, sum and output (views of the block's).
            const int64_t ra = (t.q0 - q0) * p.G, rb = (t.q1 - q0) * p.G;
            auto accr = acc.slice(1, ra, rb);
            OnlineSoftmaxStep(s, m.slice(1, ra, rb), l.slice(1, ra, rb), accr, /*first=*/false);
            AddProduct(accr, s, vs3.slice(1, t.k0, t.k1), 1.0, p.dtype);
          }
          out.slice(0, b0, b1).slice(1, r0, r1).copy_(acc.div_(l));
          lse.slice(0, b0, b1).slice(1, r0, r1).copy_(m + l.log());
        });
      }
      if (kept != nullptr) {  // for the backward's replay
        kept->out.copy_(out);
        kept->lse.copy_(lse);
      }
    }
    // The backward's D = rowsum(dO * out) is subtracted from dO V^T: keep out in the
    // compute dtype for it (a bfloat16-rounded out would make that difference inexact).
    ctx->save_for_backward({qs, k, v, out, lse});
    SavePattern(ctx, pattern);
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["tiles"] = std::vector<int64_t>{tiling.query_tile, tiling.key_tile};
    if (tiling.grad_sink) {
      ctx->saved_data["sink_k"] = tiling.grad_sink->k;
      ctx->saved_data["sink_v"] = tiling.grad_sink->v;
    }
    return out.to(p.dtype).view(q.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &qs = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto pattern = LoadPattern(ctx);
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto tiles = ctx->saved_data["tiles"].toIntVector();
    const Plan p = MakePlan(qs, k, ctx->saved_data["groups"].toInt(), AttentionTiling{tiles[1], tiles[0]});
    const bool sink = ctx->saved_data.count("sink_k") > 0;
    const auto q3 = Flat(qs), k3 = Flat(k), v3 = Flat(v);
    auto d_out = Flat(grad_outputs[0].to(p.dtype).contiguous());
    auto D = (d_out.to(p.cd) * out).sum(-1, /*keepdim=*/true);
    auto dq = torch::zeros(q3.sizes(), q3.options().dtype(p.cd));
    torch::Tensor dk, dv;
    if (sink) {
      dk = Flat(ctx->saved_data["sink_k"].toTensor(), /*must_view=*/true);
      dv = Flat(ctx->saved_data["sink_v"].toTensor(), /*must_view=*/true);
    } else {
      dk = torch::zeros(k3.sizes(), k3.options().dtype(p.cd));
      dv = torch::zeros(v3.sizes(), v3.options().dtype(p.cd));
    }
    for (int64_t q0 = 0; q0 < p.C; q0 += p.query_tile) {
      const int64_t q1 = std::min(p.C, q0 + p.query_tile), r0 = q0 * p.G, r1 = q1 * p.G;
      const auto tiles = PlanTiles(pattern, q0, q1, p.key_tile, p.pieces);
      ForSlices(p, q3, [&](int64_t b0, int64_t b1) {
        const auto qs3 = q3.slice(0, b0, b1), ks3 = k3.slice(0, b0, b1), vs3 = v3.slice(0, b0, b1);
        const auto dks = dk.slice(0, b0, b1), dvs = dv.slice(0, b0, b1);
        auto qb = qs3.slice(1, r0, r1), dob = d_out.slice(0, b0, b1).slice(1, r0, r1);
        auto dqb = dq.slice(0, b0, b1).slice(1, r0, r1);
        auto lseb = lse.slice(0, b0, b1).slice(1, r0, r1), Db = D.slice(0, b0, b1).slice(1, r0, r1);
        for (const auto& t : tiles) {
          auto kt = ks3.slice(1, t.k0, t.k1), vt = vs3.slice(1, t.k0, t.k1);
          // The tile's rows of the block (all of them, or a piece's).
          const int64_t ra = (t.q0 - q0) * p.G, rb = (t.q1 - q0) * p.G;
          auto qr = qb.slice(1, ra, rb), dor = dob.slice(1, ra, rb), dqr = dqb.slice(1, ra, rb);
          // The scores become the probabilities (masked entries: 0), dO V^T becomes dS.
          auto prob = Scores(p, qs3, ks3, pattern, t, b0, b1);
          auto ds = Product(dor, vt.transpose(1, 2), p.dtype, p.cd);
          SoftmaxGradStep(prob, ds, lseb.slice(1, ra, rb), Db.slice(1, ra, rb));
          AddProduct(dvs.slice(1, t.k0, t.k1), prob.transpose(1, 2), dor, 1.0, p.dtype);
          prob = torch::Tensor();
          AddProduct(dqr, ds, kt, scale, p.dtype);
          // q is pre-scaled: dS^T (scale Q) is already dK's product.
          AddProduct(dks.slice(1, t.k0, t.k1), ds.transpose(1, 2), qr, 1.0, p.dtype);
        }
      });
    }
    torch::Tensor grad_k, grad_v;
    if (!sink) {
      grad_k = dk.to(k.scalar_type()).view(k.sizes());
      grad_v = dv.to(v.scalar_type()).view(v.sizes());
    }
    return {dq.to(p.dtype).view(qs.sizes()), grad_k, grad_v, torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

std::vector<TiledVisit> TiledAttentionPlan(const AttentionPattern& pattern, int64_t q0, int64_t q1,
                                           int64_t key_tile) {
  std::vector<TiledVisit> visits;
  for (const auto& t : PlanTiles(pattern, q0, q1, key_tile, /*pieces_allowed=*/true)) {
    visits.push_back({t.q0, t.q1, t.k0, t.k1, !t.full});
  }
  return visits;
}

int64_t TiledAttentionThreads(int64_t slices, const torch::Device& device) {
  const int64_t threads = CpuSplitThreads(device);
  // Uneven shares (3 slices on 2 threads) would leave a thread idle for a third of the call.
  const bool split = threads > 1 && slices >= threads && (slices % threads == 0 || slices >= 4 * threads);
  return split ? threads : 1;
}

torch::Tensor TiledAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionPattern& mask, int64_t groups, double scale,
                             const AttentionTiling& tiling) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) % groups == 0,
              "TiledAttention: q [B, KVH, C*G, hd], k and v [B, KVH, L, hd] expected");
  TORCH_CHECK(mask.queries() == q.size(2) / groups && mask.keys() == k.size(2), "TiledAttention: the mask covers ",
              mask.queries(), " queries x ", mask.keys(), " keys, the call ", q.size(2) / groups, " x ", k.size(2));
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "TiledAttention: k and v need unit stride in head_dim");
  return TiledAttentionFunction::apply(q, k, v, mask, groups, scale, tiling);
}

}  // namespace streambp
