#pragma once
// TensorBoard's event files, written without TensorFlow (docs/operations.md: Training
// history): a file of TFRecord frames — u64 length, u32 masked CRC-32C of the length, the
// payload, u32 masked CRC-32C of the payload, little endian — each payload an `Event`
// protobuf (wall_time = 1, step = 2, file_version = 3, summary = 5) whose Summary holds
// `Value { tag = 1, simple_value = 2 }` scalars. The first event names the format
// ("brain.Event:2"). Encoded by hand: these few fields need no generated code.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace streambp::server {

class TensorBoardWriter {
 public:
  /// Creates `dir` and a new events.out.tfevents.<unix seconds>.<host>.<pid> in it.
  /// Throws Error naming the path when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One event with these scalars, flushed. Returns false when the write failed.
  bool write_scalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  bool write_event(const std::string& payload);
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// The Event payload with these fields (exposed for tests).
std::string EncodeScalarEvent(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& scalars);
/// The TFRecord frame around `payload`.
std::string FrameRecord(const std::string& payload);

}  // namespace streambp::server
