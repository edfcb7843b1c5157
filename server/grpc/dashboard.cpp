#include "dashboard.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "host.h"
#include "streambp/error.h"

namespace streambp::server {
namespace {

// Records per answer: the page reads on with `after` until it has them all.
constexpr int64_t kPage = 2000;

HttpAnswer Json(int status, const nlohmann::json& body) {
  HttpAnswer a{status, "application/json", body.dump(), "Cache-Control: no-store\r\n"};
  if (status == 401) a.headers += "WWW-Authenticate: Bearer\r\n";
  return a;
}

int HttpStatus(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kUnauthenticated: return 401;
    case ErrorCode::kPermissionDenied: return 403;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kInvalidArgument: return 400;
    default: return 500;
  }
}

// Runs `read` as the request's caller; errors become JSON answers with their HTTP status.
template <class F>
HttpAnswer Answer(const Authorizer& auth, const HttpRequest& request, F read) {
  try {
    const auto it = request.headers.find("authorization");
    const Caller caller = auth.authorize(it == request.headers.end() ? nullptr : &it->second, Access::kRead);
    return Json(200, read(caller));
  } catch (const Error& e) {
    return Json(HttpStatus(e), {{"error", e.what()}});
  }
}

int64_t AfterOf(const HttpRequest& request) {
  const auto it = request.query.find("after");
  if (it == request.query.end() || it->second.empty()) return 0;
  try {
    size_t used = 0;
    const int64_t after = std::stoll(it->second, &used);
    if (used == it->second.size() && after >= 0) return after;
  } catch (const std::exception&) {
  }
  throw InvalidArgument("after must be a record index >= 0, got '" + it->second.substr(0, 40) + "'");
}

}  // namespace

bool DashboardEnabled(const ServerConfig& config) {
  if (config.metrics.dashboard == "on") return true;
  if (config.metrics.dashboard == "off") return false;
  return !Authorizer(config.auth).enabled();
}

std::map<std::string, HttpEndpoint::Route> DashboardRoutes(TrainingHost* host, const ServerConfig& config) {
  auto auth = std::make_shared<const Authorizer>(config.auth);
  std::map<std::string, HttpEndpoint::Route> routes;
  routes["/dashboard"] = [](const HttpRequest&) {
    return HttpAnswer{200, "text/html; charset=utf-8", DashboardPage(), "Cache-Control: no-store\r\n"};
  };
  routes["/dashboard/sessions"] = [host, auth](const HttpRequest& request) {
    return Answer(*auth, request, [&](const Caller& caller) {
      nlohmann::json sessions = nlohmann::json::array();
      auto add = [&](const std::string& name, int64_t step, int64_t version) {
        // After the newest record: no records copied, only the indexes and the file.
        const auto h = host->history(name, std::numeric_limits<int64_t>::max(), 1);
        sessions.push_back({{"name", name}, {"step", step}, {"policy_version", version},
                            {"last_index", h.last_index}, {"file", h.file}});
      };
      if (host->sessions_enabled()) {
        for (const auto& r : host->list_sessions()) {
          if (caller.sees(r.spec.name)) add(r.spec.name, r.step, r.policy_version);
        }
      } else {
        add("", host->step(), host->policy_version());
      }
      return nlohmann::json{{"sessions", sessions}};
    });
  };
  routes["/dashboard/history"] = [host, auth](const HttpRequest& request) {
    return Answer(*auth, request, [&](const Caller& caller) {
      const auto it = request.query.find("session");
      const std::string session = it == request.query.end() ? "" : it->second;
      caller.require(session, Access::kRead);
      const auto h = host->history(session, AfterOf(request), kPage);
      nlohmann::json records = nlohmann::json::array();
      for (const auto& r : h.records) records.push_back(r.ToJson());
      return nlohmann::json{{"session", session}, {"records", records}, {"last_index", h.last_index}};
    });
  };
  return routes;
}

}  // namespace streambp::server
