#include "record_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "streambp/error.h"

namespace streambp::server {
namespace {

constexpr size_t kHeader = 8;
constexpr uint32_t kMaxRecord = 1u << 30;

const std::array<uint32_t, 256>& CrcTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

[[noreturn]] void Fail(const std::string& what, const std::string& path, int err) {
  if (err == ENOSPC || err == EDQUOT) {
    throw ResourceExhausted(what + " the rollout log: no space left on the device");
  }
  throw Error(ErrorCode::kInternal, what + " the rollout log " + path + ": " + std::strerror(err));
}

std::string Frame(const std::vector<std::string>& records) {
  std::string bytes;
  for (const auto& r : records) {
    if (r.size() > kMaxRecord) throw InvalidArgument("a rollout log record is larger than 1 GiB");
    PutU32(&bytes, static_cast<uint32_t>(r.size()));
    PutU32(&bytes, Crc32c(r));
    bytes += r;
  }
  return bytes;
}

void WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Fail("writing", path, errno);
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

uint32_t Crc32c(const std::string& data) {
  const auto& t = CrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = t[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::unique_ptr<RecordLog> RecordLog::Open(const std::string& path, std::vector<std::string>* records,
                                           int64_t* dropped_bytes) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) Fail("opening", path, errno);
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      Fail("reading", path, err);
    }
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  size_t pos = 0;
  while (bytes.size() - pos >= kHeader) {
    const uint32_t len = GetU32(bytes.data() + pos), crc = GetU32(bytes.data() + pos + 4);
    if (len > kMaxRecord || bytes.size() - pos - kHeader < len) break;  // incomplete: a torn append
    std::string payload = bytes.substr(pos + kHeader, len);
    if (Crc32c(payload) != crc) {
      // The last frame of the file may be a torn append; a bad frame with good data after
      // it is damage that cutting would hide: refuse to guess.
      if (pos + kHeader + len == bytes.size()) break;
      ::close(fd);
      throw Error(ErrorCode::kInternal, "the rollout log " + path + " is corrupt at byte " + std::to_string(pos) +
                                            " (a record that does not match its checksum, with records after it); "
                                            "move it aside to start without it");
    }
    records->push_back(std::move(payload));
    pos += kHeader + len;
  }
  if (dropped_bytes) *dropped_bytes = static_cast<int64_t>(bytes.size() - pos);
  if (pos != bytes.size()) {
    // A torn or corrupt tail: never acknowledged (an append is acknowledged only after its
    // fsync), so it is cut off and appends continue from the last good record.
    if (::ftruncate(fd, static_cast<off_t>(pos)) != 0 || ::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      Fail("truncating the torn tail of", path, err);
    }
  }
  if (::lseek(fd, 0, SEEK_END) < 0) {
    const int err = errno;
    ::close(fd);
    Fail("seeking", path, err);
  }
  return std::unique_ptr<RecordLog>(new RecordLog(path, fd, static_cast<int64_t>(pos)));
}

RecordLog::~RecordLog() {
  if (fd_ >= 0) ::close(fd_);
}

void RecordLog::append(const std::vector<std::string>& records) {
  if (records.empty()) return;
  const std::string bytes = Frame(records);
  try {
    WriteAll(fd_, bytes, path_);
    if (::fsync(fd_) != 0) Fail("syncing", path_, errno);
  } catch (...) {
    // Back to the last good record, so the next append does not land behind a torn one.
    const bool restored = ::ftruncate(fd_, static_cast<off_t>(size_)) == 0 &&
                          ::lseek(fd_, 0, SEEK_END) == static_cast<off_t>(size_) && ::fsync(fd_) == 0;
    if (!restored) {
      // The file may still end in a partial frame; reading cuts it off at the next start.
      ::lseek(fd_, static_cast<off_t>(size_), SEEK_SET);
    }
    throw;
  }
  size_ += static_cast<int64_t>(bytes.size());
}

void RecordLog::rewrite(const std::vector<std::string>& records) {
  const std::string bytes = Frame(records);
  const std::string tmp = path_ + ".rewrite";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail("rewriting", path_, errno);
  try {
    WriteAll(fd, bytes, path_);
    if (::fsync(fd) != 0) Fail("syncing", path_, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    Fail("renaming the rewritten", path_, err);
  }
  auto dir = std::filesystem::path(path_).parent_path();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  const int nfd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (nfd < 0) Fail("reopening", path_, errno);
  ::close(fd_);
  fd_ = nfd;
  size_ = static_cast<int64_t>(bytes.size());
}

}  // namespace streambp::server
