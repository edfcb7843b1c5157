#pragma once
// An append-only file of records that survives crashes and full disks (the rollout log).
// Each record is framed as [u32 length][u32 CRC-32C of the payload][payload], little endian.
// An append either lands whole or not at all: a failed write or fsync (disk full, I/O
// error) truncates the file back to its length before the append, so no torn record ever
// stays behind a good one; reading stops at the first frame that is torn or does not match
// its checksum (a crash mid-append) and cuts it off.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace streambp::server {

/// CRC-32C (Castagnoli) of `data`.
uint32_t Crc32c(const std::string& data);

class RecordLog {
 public:
  /// Opens (creating) `path` and reads its records into `records`. A torn tail (an
  /// incomplete last frame, or a last frame that fails its checksum) is cut off the file;
  /// its size goes to `dropped_bytes`. Throws Error naming the path when the file cannot be
  /// opened or truncated, or when a frame in the middle fails its checksum (damage).
  static std::unique_ptr<RecordLog> Open(const std::string& path, std::vector<std::string>* records,
                                         int64_t* dropped_bytes = nullptr);
  ~RecordLog();
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  /// Appends `records` and fsyncs once: all of them are durable when this returns. On
  /// failure the file is back to its previous length and ResourceExhausted ("no space
  /// left on the device") or Error(kInternal) is thrown; nothing was appended.
  void append(const std::vector<std::string>& records);
  /// Replaces the whole file by `records` (written beside it, fsynced, renamed over it).
  void rewrite(const std::vector<std::string>& records);

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  RecordLog(std::string path, int fd, int64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

}  // namespace streambp::server
