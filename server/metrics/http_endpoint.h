#pragma once
// A small HTTP/1.1 server for the scrape endpoint (and the pages beside it): one thread, poll(),
// one request per connection. It is built to stay up when the port is unauthenticated and
// exposed: at most `max_connections` sockets are held (a new connection evicts the oldest one
// that has not finished its request, so idle or slow-header floods cannot lock scrapers out);
// a connection gets `request_timeout_seconds` to send its request head and as long to read the
// answer; heads over `max_request_bytes` are refused; there is no Range, keep-alive or body
// handling, so no request can make the answer larger than a route's own output; accept()
// failing for lack of descriptors pauses accepting briefly instead of ending it.
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

namespace streambp::server {

struct HttpAnswer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::string headers;  ///< extra header lines, each ending in \r\n
};

/// What a route sees of a request.
struct HttpRequest {
  std::string path;
  std::map<std::string, std::string> query;    ///< ?a=b&c=d, percent-decoded (a repeated key: the last)
  std::map<std::string, std::string> headers;  ///< names in lower case
};

class HttpEndpoint {
 public:
  struct Options {
    int max_connections = 64;              ///< sockets held at once (the listener's backlog aside)
    double request_timeout_seconds = 5.0;  ///< to receive the request head, and again to send the answer
    size_t max_request_bytes = 16 << 10;   ///< request line + headers
  };
  /// GET/HEAD of an exact path; anything the route throws becomes a 500 with its message.
  using Route = std::function<HttpAnswer(const HttpRequest&)>;

  /// Binds `listen` (host:port, port 0 = any) and starts serving; throws Error(kInternal)
  /// when it cannot be bound.
  HttpEndpoint(const std::string& listen, std::map<std::string, Route> routes, Options options);
  /// Stops and joins; open connections are closed.
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }

 private:
  struct Loop;
  void run();

  std::map<std::string, Route> routes_;
  Options options_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  ///< a pipe that ends the loop
  int port_ = 0;
  std::thread thread_;
};

}  // namespace streambp::server
