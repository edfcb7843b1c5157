#include "tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "record_log.h"
#include "streambp/error.h"

namespace streambp::server {
namespace {

void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

template <class T>
void LittleEndian(T v, std::string* out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // the hosts this builds for are little endian
  out->append(bytes, sizeof(T));
}

void LengthDelimited(int field, const std::string& bytes, std::string* out) {
  Varint(static_cast<uint64_t>(field) << 3 | 2, out);
  Varint(bytes.size(), out);
  out->append(bytes);
}

// TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant.
uint32_t Masked(const std::string& bytes) {
  const uint32_t crc = Crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string EventHeader(int64_t step, double wall_time) {
  std::string e;
  Varint(1 << 3 | 1, &e);  // wall_time: fixed64 double
  LittleEndian(wall_time, &e);
  Varint(2 << 3 | 0, &e);  // step: varint
  Varint(static_cast<uint64_t>(step), &e);
  return e;
}

}  // namespace

std::string EncodeScalarEvent(int64_t step, double wall_time,
                              const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    LengthDelimited(1, tag, &v);  // Value.tag
    Varint(2 << 3 | 5, &v);       // Value.simple_value: fixed32 float
    LittleEndian(static_cast<float>(value), &v);
    LengthDelimited(1, v, &summary);  // Summary.value
  }
  std::string e = EventHeader(step, wall_time);
  LengthDelimited(5, summary, &e);  // Event.summary
  return e;
}

std::string FrameRecord(const std::string& payload) {
  std::string length;
  LittleEndian(static_cast<uint64_t>(payload.size()), &length);
  std::string frame = length;
  LittleEndian(Masked(length), &frame);
  frame += payload;
  LittleEndian(Masked(payload), &frame);
  return frame;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." +
                                         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) +
                                         "." + host + "." + std::to_string(::getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "ab");
  if (file_ == nullptr) throw Error(ErrorCode::kInternal, "cannot create " + path_ + ": " + std::strerror(errno));
  std::string first = EventHeader(0, std::chrono::duration<double>(now).count());
  LengthDelimited(3, "brain.Event:2", &first);  // Event.file_version
  write_event(first);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

bool TensorBoardWriter::write_event(const std::string& payload) {
  const std::string frame = FrameRecord(payload);
  const bool ok = std::fwrite(frame.data(), 1, frame.size(), file_) == frame.size();
  return std::fflush(file_) == 0 && ok;
}

bool TensorBoardWriter::write_scalars(int64_t step, double wall_time,
                                      const std::vector<std::pair<std::string, double>>& scalars) {
  return write_event(EncodeScalarEvent(step, wall_time, scalars));
}

}  // namespace streambp::server
