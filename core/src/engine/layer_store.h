#pragma once
// Where the stream engine keeps the stored layer inputs and the final hidden states
// (internal to streambp_core): on the device, or in a second tier (issue 17) — a scratch
// file on the CPU, pinned host memory on a GPU — with the copies in the background.
#include <cstdint>
#include <memory>
#include <string>

#include <torch/types.h>

namespace streambp::engine {

/// Slots of [B, T, d] tensors, written whole and read back by ranges of positions.
/// Single-threaded use (the engine's thread); an implementation may copy in the background.
class LayerStore {
 public:
  /// On the device: put() keeps the tensor, read() returns views of it (no copy).
  static std::unique_ptr<LayerStore> OnDevice(int64_t slots);
  /// The second tier for `slots` tensors shaped and typed as `like` ([B, T, d]): pinned
  /// host memory with copies on a side stream for a CUDA tensor (CUDA builds), else a
  /// scratch file in `dir` (empty: $TMPDIR or /tmp), created, unlinked and its space
  /// reserved at once, written and read by a background thread. Throws FailedPrecondition
  /// when the folder cannot hold a file, ResourceExhausted when the space is not there.
  static std::unique_ptr<LayerStore> Offloaded(const std::string& dir, int64_t slots, const torch::Tensor& like);

  virtual ~LayerStore() = default;
  /// Keeps x ([B, T, d]) as slot i; the caller may drop its reference. The second tier
  /// copies it out in the background, one tensor at a time: put() first waits for the
  /// previous copy (so no more than one tensor waits on the device), and reports its error.
  virtual void put(int64_t i, torch::Tensor x) = 0;
  /// Positions [s, e) of slot i: [B, e - s, d] (a view on the device; read back otherwise,
  /// from the prefetch when it was the one announced).
  virtual torch::Tensor read(int64_t i, int64_t s, int64_t e) = 0;
  /// Announces the next read(i, s, e): the second tier starts the copy in the background.
  virtual void prefetch(int64_t i, int64_t s, int64_t e) = 0;
  /// Slot i is not read again.
  virtual void drop(int64_t i) = 0;
  /// Bytes this store keeps in the second tier (0 on the device).
  virtual int64_t offloaded_bytes() const = 0;
  /// read() returns views of the tensors put (which may then be overwritten in place).
  virtual bool on_device() const = 0;
};

/// Positions [s, e) of a slot (slot -1: none).
struct ChunkRef {
  int64_t slot = -1, s = 0, e = 0;
};

/// Reads of one slot chunk by chunk in `passes` passes over [0, T) (the last one from the
/// end backwards if `last_reversed`), each read prefetched while the previous chunk is in
/// use; after the last, `then` (if any) is prefetched.
class ChunkReader {
 public:
  using Next = ChunkRef;
  ChunkReader(LayerStore& store, int64_t slot, int64_t T, int64_t chunk, int passes, Next then = Next{},
              bool last_reversed = false);
  /// The next chunk's positions [s, e) and its rows.
  torch::Tensor next(int64_t* s, int64_t* e);

 private:
  Next at(int64_t index) const;
  LayerStore& store_;
  int64_t slot_, T_, chunk_, per_pass_, total_, index_ = 0;
  Next then_;
  bool last_reversed_;
};

}  // namespace streambp::engine
