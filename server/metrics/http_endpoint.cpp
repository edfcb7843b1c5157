#include "http_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <list>
#include <vector>

#include "streambp/error.h"

namespace streambp::server {
namespace {

using Clock = std::chrono::steady_clock;

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    default: return "Error";
  }
}

std::string Serialize(const HttpAnswer& a, bool head, const char* extra_headers = "") {
  std::string out = "HTTP/1.1 " + std::to_string(a.status) + " " + Reason(a.status) + "\r\n";
  out += "Content-Type: " + a.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(a.body.size()) + "\r\n";
  out += extra_headers;
  out += a.headers;
  out += "Connection: close\r\n\r\n";
  if (!head) out += a.body;
  return out;
}

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string PercentDecoded(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && Hex(s[i + 1]) >= 0 && Hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(Hex(s[i + 1]) * 16 + Hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i] == '+' ? ' ' : s[i]);
    }
  }
  return out;
}

// The request head: "METHOD SP TARGET SP VERSION" and "Name: value" lines.
HttpRequest ParseRequest(const std::string& head, const std::string& target) {
  HttpRequest r;
  const auto q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) {
    const std::string query = target.substr(q + 1);
    size_t start = 0;
    while (start <= query.size()) {
      const auto end = std::min(query.find('&', start), query.size());
      const std::string pair = query.substr(start, end - start);
      const auto eq = pair.find('=');
      if (!pair.empty()) {
        r.query[PercentDecoded(pair.substr(0, eq))] = eq == std::string::npos ? "" : PercentDecoded(pair.substr(eq + 1));
      }
      start = end + 1;
    }
  }
  size_t pos = head.find('\n');
  while (pos != std::string::npos && pos + 1 < head.size()) {
    const auto end = head.find('\n', pos + 1);
    std::string line = head.substr(pos + 1, (end == std::string::npos ? head.size() : end) - pos - 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) break;
    const auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      const auto value = line.find_first_not_of(" \t", colon + 1);
      r.headers[name] = value == std::string::npos ? "" : line.substr(value);
    }
    pos = end;
  }
  return r;
}

void NonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

struct Connection {
  int fd = -1;
  Clock::time_point deadline;
  std::string in;        ///< the request head as received so far
  std::string out;       ///< the answer; writing when non-empty
  size_t written = 0;
  bool answered() const { return !out.empty(); }
};

}  // namespace

HttpEndpoint::HttpEndpoint(const std::string& listen, std::map<std::string, Route> routes, Options options)
    : routes_(std::move(routes)), options_(options) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) throw Error(ErrorCode::kInternal, "metrics: listen must be host:port, got " + listen);
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  const std::string port = listen.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5) {
    throw Error(ErrorCode::kInternal, "metrics: bad port in " + listen);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    throw Error(ErrorCode::kInternal, "metrics: could not resolve " + listen);
  }
  std::string why;
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) throw Error(ErrorCode::kInternal, "metrics: could not listen on " + listen + ": " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  NonBlocking(listen_fd_);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(listen_fd_);
    throw Error(ErrorCode::kInternal, std::string("metrics: pipe: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { run(); });
}

HttpEndpoint::~HttpEndpoint() {
  const char byte = 0;
  [[maybe_unused]] const auto n = write(wake_[1], &byte, 1);
  if (thread_.joinable()) thread_.join();
  close(wake_[0]);
  close(wake_[1]);
  close(listen_fd_);
}

void HttpEndpoint::run() {
  std::list<Connection> connections;  // oldest first
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.request_timeout_seconds));
  Clock::time_point accept_paused_until{};
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> owners;

  auto answer = [&](Connection& c) {
    // The request line: METHOD SP TARGET SP VERSION.
    const std::string line = c.in.substr(0, c.in.find("\r\n"));
    const auto sp1 = line.find(' ');
    const auto sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
    HttpAnswer a;
    bool head = false;
    const char* extra = "";
    if (sp1 == std::string::npos || sp2 == std::string::npos) {
      a.status = 400;
      a.body = "bad request line\n";
    } else {
      const std::string method = line.substr(0, sp1);
      const HttpRequest request = ParseRequest(c.in, line.substr(sp1 + 1, sp2 - sp1 - 1));
      head = method == "HEAD";
      auto route = routes_.find(request.path);
      if (method != "GET" && method != "HEAD") {
        a.status = 405;
        extra = "Allow: GET, HEAD\r\n";
        a.body = "only GET and HEAD\n";
      } else if (route == routes_.end()) {
        a.status = 404;
        a.body = "metrics are at /metrics\n";
      } else {
        try {
          a = route->second(request);
        } catch (const std::exception& e) {
          a = HttpAnswer{500, "text/plain; charset=utf-8", std::string(e.what()) + "\n"};
        }
      }
    }
    c.out = Serialize(a, head, extra);
    c.written = 0;
    c.deadline = Clock::now() + timeout;
  };
  auto refuse = [&](Connection& c, int status, const char* body) {
    c.out = Serialize(HttpAnswer{status, "text/plain; charset=utf-8", body}, false);
    c.written = 0;
    c.deadline = Clock::now() + timeout;
  };

  for (;;) {
    const auto now = Clock::now();
    // Ended or late connections go.
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->fd < 0 || now >= it->deadline) {
        if (it->fd >= 0) close(it->fd);
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
    fds.clear();
    owners.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool accepting = now >= accept_paused_until;
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    Clock::time_point next = now + std::chrono::seconds(1);
    if (!accepting) next = std::min(next, accept_paused_until);
    for (auto it = connections.begin(); it != connections.end(); ++it) {
      fds.push_back({it->fd, static_cast<short>(it->answered() ? POLLOUT : POLLIN), 0});
      owners.push_back(it);
      next = std::min(next, it->deadline);
    }
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    if (poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait_ms + 1, 1, 1000))) < 0 && errno != EINTR) {
      continue;
    }
    if (fds[0].revents != 0) break;  // stop
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Connection& c = *owners[i - 2];
      if (!c.answered()) {
        char buffer[4096];
        const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          close(c.fd);
          c.fd = -1;
          continue;
        }
        if (n < 0) continue;
        c.in.append(buffer, static_cast<size_t>(n));
        if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) {
          answer(c);
        } else if (c.in.size() > options_.max_request_bytes) {
          refuse(c, 431, "request head too large\n");
        }
      }
      if (c.answered() && c.fd >= 0) {
        const ssize_t n = send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
        if (n > 0) c.written += static_cast<size_t>(n);
        if ((n < 0 && errno != EAGAIN && errno != EINTR) || c.written == c.out.size()) {
          if (c.written == c.out.size()) shutdown(c.fd, SHUT_WR);
          close(c.fd);
          c.fd = -1;
        }
      }
    }
    if (accepting && fds[1].revents != 0) {
      for (int k = 0; k < 64; ++k) {  // a batch per turn: the connections above get their turn too
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            // Out of descriptors: wait for some to come back; the listener stays.
            accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
          }
          break;
        }
        if (static_cast<int>(connections.size()) >= options_.max_connections) {
          // Full: the oldest connection still sending its request goes (a scraper sends its
          // request at once; an idle or slow one holds a slot it does not use).
          auto victim = std::find_if(connections.begin(), connections.end(),
                                     [](const Connection& c) { return !c.answered() && c.fd >= 0; });
          if (victim == connections.end()) victim = connections.begin();
          if (victim->fd >= 0) close(victim->fd);
          connections.erase(victim);
        }
        Connection c;
        c.fd = fd;
        c.deadline = Clock::now() + timeout;
        connections.push_back(std::move(c));
      }
    }
  }
  for (auto& c : connections) {
    if (c.fd >= 0) close(c.fd);
  }
}

}  // namespace streambp::server
