#include "bpe.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <deque>

#include "byte_level.h"
#include "unicode.h"
#include "streambp/error.h"
#include "streambp/interrupt.h"

namespace streambp::text {

/// Word -> ids, split into shards with a mutex each so that concurrent encodes rarely wait.
/// A full shard is emptied (the words that matter come back at once).
class BpeModel::WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 128;
  static constexpr size_t kShards = 32;
  static constexpr size_t kMaxEntriesPerShard = 8192;

  bool lookup(std::string_view word, size_t hash, std::vector<int64_t>& out) {
    Shard& shard = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(word);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view word, size_t hash, const int64_t* ids, size_t n) {
    Shard& shard = shards_[hash % kShards];
    std::vector<int32_t> value(ids, ids + n);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= kMaxEntriesPerShard) shard.map.clear();
    shard.map.emplace(std::string(word), std::move(value));
  }

  void clear() {
    for (Shard& shard : shards_) {
      std::lock_guard<std::mutex> lock(shard.mu);
      shard.map.clear();
    }
  }

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards_;
};

void BpeModel::MergeTable::reserve(size_t entries) {
  // A power of two at least twice the entries: short probe runs.
  int bits = 4;
  while ((size_t{1} << bits) < 2 * entries) ++bits;
  slots_.assign(size_t{1} << bits, Slot{});
  mask_ = (size_t{1} << bits) - 1;
  shift_ = 64 - bits;
}

void BpeModel::MergeTable::insert_or_assign(uint64_t key, MergeTarget target) {
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    if (slots_[i].key == key || slots_[i].key == kEmpty) {
      slots_[i].key = key;
      slots_[i].target = target;
      return;
    }
  }
}

namespace {

// Bytes in the UTF-8 sequence that starts with `lead` (the text is valid UTF-8).
size_t Utf8Length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

// HF's spelling of a byte-fallback token: "<0x0A>".
std::string FallbackSpelling(int b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

}  // namespace

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(options), cache_(std::make_unique<WordCache>()) {
  fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = options_.byte_level ? vocab_.find(ByteToUtf8()[b])
              : b < 0x80          ? vocab_.find(std::string(1, static_cast<char>(b)))
                                  : vocab_.end();
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    if (!options_.byte_level && options_.byte_fallback) {
      auto f = vocab_.find(FallbackSpelling(b));
      fallback_ids_[b] = f == vocab_.end() ? -1 : f->second;
    }
  }
  int32_t size = 0;
  for (const auto& [token, id] : vocab_) size = std::max(size, id + 1);
  span_.assign(static_cast<size_t>(size), 0);
  for (const auto& [token, id] : vocab_) {
    uint32_t span = 0;
    if (options_.byte_level) {
      // One byte per character of the byte alphabet; 0 (not fixed) for anything else.
      for (size_t i = 0; i < token.size();) {
        if (CharToByte(NextCodePoint(token, i)) < 0) {
          span = 0;
          break;
        }
        ++span;
      }
    } else {
      span = static_cast<uint32_t>(token.size());
    }
    span_[static_cast<size_t>(id)] = span;
  }
  for (int b = 0; b < 256; ++b) {
    if (fallback_ids_[b] >= 0) span_[static_cast<size_t>(fallback_ids_[b])] = 1;
  }
  if (options_.unk_id && *options_.unk_id < size) span_[static_cast<size_t>(*options_.unk_id)] = 0;
  merges_.reserve(merges.size());
  by_rank_.assign(merges.size(), RankedMerge{~uint64_t{0}, -1});
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto id_of = [&](const std::string& token) {
      auto it = vocab_.find(token);
      if (it == vocab_.end()) {
        throw InvalidArgument("model.merges[" + std::to_string(rank) + "]: '" + token +
                              "' is not in the vocabulary");
      }
      return it->second;
    };
    const int32_t l = id_of(left), r = id_of(right);
    joined = left;
    joined += right;
    const int32_t merged = id_of(joined);
    merges_.insert_or_assign(PairKey(l, r), MergeTarget{static_cast<uint32_t>(rank), merged});
    by_rank_[rank] = RankedMerge{PairKey(l, r), merged};  // a pair listed twice: the table keeps the later rank
  }
}

BpeModel::~BpeModel() = default;

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::clear_cache() const { cache_->clear(); }

void BpeModel::encode_word(std::string_view word, std::vector<int64_t>& out,
                           std::vector<uint32_t>* starts) const {
  if (word.empty()) return;
  const size_t first = out.size();
  if (word.size() == 1 && byte_ids_[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
  } else {
    const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
    const size_t hash = cacheable ? StringHash{}(word) : 0;
    if (!cacheable || !cache_->lookup(word, hash, out)) {
      merge_word(word, out, starts);
      if (cacheable) cache_->insert(word, hash, out.data() + first, out.size() - first);
      return;
    }
  }
  if (!starts) return;
  // Where each token begins, from what each stands for; when that is not fixed (an unk, a
  // dropped byte) the word is merged again, keeping its symbols' positions.
  const size_t first_start = starts->size();
  uint32_t at = 0;
  for (size_t k = first; k < out.size(); ++k) {
    const auto id = static_cast<size_t>(out[k]);
    const uint32_t span = id < span_.size() ? span_[id] : 0;
    if (span == 0) {
      at = UINT32_MAX;
      break;
    }
    starts->push_back(at);
    at += span;
  }
  if (at != word.size()) {
    out.resize(first);
    starts->resize(first_start);
    merge_word(word, out, starts);
  }
}

void BpeModel::initial_symbols(std::string_view word, Symbols& symbols) const {
  auto push = [&](int32_t id, size_t start, size_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, static_cast<uint32_t>(len), static_cast<uint32_t>(start)});
    if (n > 0) symbols[static_cast<size_t>(n) - 1].next = n;
  };
  if (options_.byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      int32_t id = byte_ids_[static_cast<unsigned char>(word[i])];
      if (id < 0) {
        if (!options_.unk_id) continue;  // no unk token: the byte is dropped, as HF does
        id = *options_.unk_id;
      }
      push(id, i, 1);
    }
    return;
  }
  // Characters. Unknown ones wait in `unk` so that consecutive ones can be fused.
  size_t unk_start = 0, unk_len = 0;
  auto flush_unk = [&] {
    if (unk_len > 0) push(*options_.unk_id, unk_start, unk_len);
    unk_len = 0;
  };
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(Utf8Length(static_cast<unsigned char>(word[i])), word.size() - i);
    int32_t id = -1;
    if (n == 1) {
      id = byte_ids_[static_cast<unsigned char>(word[i])];
    } else if (auto it = vocab_.find(word.substr(i, n)); it != vocab_.end()) {
      id = it->second;
    }
    if (id >= 0) {
      flush_unk();
      push(id, i, n);
    } else if (options_.byte_fallback &&
               std::all_of(word.begin() + static_cast<std::ptrdiff_t>(i),
                           word.begin() + static_cast<std::ptrdiff_t>(i + n),
                           [&](char c) { return fallback_ids_[static_cast<unsigned char>(c)] >= 0; })) {
      flush_unk();
      for (size_t k = i; k < i + n; ++k) push(fallback_ids_[static_cast<unsigned char>(word[k])], k, 1);
    } else if (options_.unk_id) {
      if (unk_len > 0 && !options_.fuse_unk) flush_unk();
      if (unk_len == 0) unk_start = i;
      unk_len += n;
    }  // no unk token: the character is dropped, as HF does
    i += n;
  }
  flush_unk();
}

void BpeModel::merge_word(std::string_view word, std::vector<int64_t>& out, std::vector<uint32_t>* starts) const {
  if (options_.ignore_merges) {
    Vocab::const_iterator it;
    if (options_.byte_level) {
      thread_local std::string mapped;
      mapped.clear();
      for (char c : word) mapped += ByteToUtf8()[static_cast<unsigned char>(c)];
      it = vocab_.find(mapped);
    } else {
      it = vocab_.find(word);
    }
    if (it != vocab_.end()) {
      out.push_back(it->second);
      if (starts) starts->push_back(0);
      return;
    }
  }

  thread_local Symbols symbols;
  symbols.clear();
  symbols.reserve(word.size());  // at most one symbol per byte: one allocation, not a doubling chain
  initial_symbols(word, symbols);
  if (symbols.size() > kLongWord) {
    merge_long(symbols);
  } else {
    merge_short(symbols);
  }
  for (int32_t pos = symbols.empty() ? -1 : 0; pos >= 0; pos = symbols[pos].next) {
    out.push_back(symbols[pos].id);
    if (starts) starts->push_back(symbols[pos].start);
  }
  if (symbols.capacity() > (size_t{1} << 16)) symbols = {};  // a huge word: do not keep its buffer
}

// Both merge loops apply the merge of lowest rank first and, among equal ranks, the leftmost
// occurrence, as Hugging Face's BPE does; they differ only in their queue.

void BpeModel::merge_short(Symbols& symbols) const {
  struct Candidate {
    uint32_t rank;
    int32_t pos, id;
  };
  // Lowest rank first; among equal ranks the leftmost.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<Candidate> queue;
  queue.clear();
  auto push_pair = [&](int32_t pos) {
    if (pos < 0 || symbols[pos].next < 0) return;
    const MergeTarget* merge = merges_.find(PairKey(symbols[pos].id, symbols[symbols[pos].next].id));
    if (!merge) return;
    queue.push_back({merge->rank, pos, merge->id});
    std::push_heap(queue.begin(), queue.end(), later);
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);

  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), later);
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale when either side has changed since the candidate was queued.
    const MergeTarget* merge = merges_.find(PairKey(left.id, right.id));
    if (!merge || merge->id != top.id) continue;
    left.id = top.id;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
}

// A long word (a run of one letter, of CJK, of punctuation or marks: up to the request's whole
// text) in time linear in its length. The candidates are kept in one bucket per rank (a rank
// names one merge), and a small heap holds the ranks that have candidates. A merge of rank r
// makes a token that BPE's training learned at r, so the pairs it forms have higher ranks in
// every real merges list: the buckets are then drained in rank order, each once, and its
// positions sorted once (they arrive mostly in order already). A merges list where a new pair
// ranks below the bucket being drained still gives the same result: that bucket is left, the
// lower rank is taken first, and the rest of the bucket is sorted again when it comes back.
void BpeModel::merge_long(Symbols& symbols) const {
  struct Bucket {
    std::vector<int32_t, LargeBufferAllocator<int32_t>> positions;
    size_t next = 0;      ///< positions before it were applied or found stale
    bool sorted = true;   ///< positions[next..] are in increasing order
    bool queued = false;  ///< its rank is in the heap
  };
  // Buckets by rank through a dense index (ranks are < the number of merges), kept per thread
  // and reset after each word: no hashing per candidate. A deque keeps references to buckets
  // valid while new ones are added.
  thread_local std::vector<int32_t> slot_of_rank;
  thread_local std::deque<Bucket> pool;
  thread_local std::vector<uint32_t> touched;
  size_t used = 0;
  touched.clear();
  struct Reset {  // the index is clean again however the word ends (an interrupt throws)
    ~Reset() {
      for (uint32_t rank : touched) slot_of_rank[rank] = -1;
      size_t kept = 0;
      for (const Bucket& b : pool) kept += b.positions.capacity();
      if (kept > (size_t{1} << 20)) pool.clear();  // a huge word: do not keep its buffers
    }
  } reset;
  if (slot_of_rank.size() < by_rank_.size()) slot_of_rank.resize(by_rank_.size(), -1);
  auto bucket = [&](uint32_t rank) -> Bucket& {
    int32_t& slot = slot_of_rank[rank];
    if (slot < 0) {
      slot = static_cast<int32_t>(used++);
      if (pool.size() < used) pool.emplace_back();
      Bucket& fresh = pool[static_cast<size_t>(slot)];
      fresh.positions.clear();
      fresh.next = 0;
      fresh.sorted = true;
      fresh.queued = false;
      touched.push_back(rank);
    }
    return pool[static_cast<size_t>(slot)];
  };
  std::vector<uint32_t> ranks;  // min-heap of the ranks with queued candidates
  auto push_pair = [&](int32_t pos) -> uint32_t {
    if (pos < 0 || symbols[pos].next < 0) return UINT32_MAX;
    const MergeTarget* merge = merges_.find(PairKey(symbols[pos].id, symbols[symbols[pos].next].id));
    if (!merge) return UINT32_MAX;
    Bucket& b = bucket(merge->rank);
    if (!b.queued) {
      b.queued = true;
      ranks.push_back(merge->rank);
      std::push_heap(ranks.begin(), ranks.end(), std::greater<>());
    }
    if (b.positions.size() > b.next && b.positions.back() > pos) b.sorted = false;
    b.positions.push_back(pos);
    return merge->rank;
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);

  while (!ranks.empty()) {
    const uint32_t rank = ranks.front();
    Bucket& b = bucket(rank);
    if (!b.sorted) {
      std::sort(b.positions.begin() + static_cast<std::ptrdiff_t>(b.next), b.positions.end());
      b.sorted = true;
    }
    // Every candidate in this bucket was queued for the rank's one pair; one whose sides have
    // changed since is stale.
    const RankedMerge merge = by_rank_[rank];
    while (b.next < b.positions.size()) {
      if ((b.next & 1023) == 0) PollInterrupt(1024);
      const int32_t pos = b.positions[b.next++];
      Symbol& left = symbols[pos];
      if (left.len == 0 || left.next < 0) continue;
      Symbol& right = symbols[left.next];
      if (PairKey(left.id, right.id) != merge.pair) continue;  // stale: a side has changed
      left.id = merge.id;
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (left.next >= 0) symbols[left.next].prev = pos;
      const uint32_t a = push_pair(left.prev);
      const uint32_t c = push_pair(pos);
      if (a <= rank || c <= rank) break;  // a pair of this rank or lower appeared: order again
    }
    if (b.next >= b.positions.size() && ranks.front() == rank) {
      b.positions.clear();
      b.next = 0;
      b.sorted = true;
      b.queued = false;
      std::pop_heap(ranks.begin(), ranks.end(), std::greater<>());
      ranks.pop_back();
    }
  }
}

}  // namespace streambp::text
