#pragma once
// The training dashboard beside /metrics (docs/operations.md: Dashboard): a page that draws
// every session's curves (loss, reward, grad norm, learning rate, tokens/s, memory against
// step) from the training history, polling as steps land, and the two JSON reads it uses.
// With auth on, the JSON reads take the same bearer tokens as the gRPC port (a scoped token
// sees its sessions only); the page itself holds no data.
#include <map>
#include <memory>
#include <string>

#include "auth.h"
#include "http_endpoint.h"

namespace streambp::server {

class TrainingHost;

/// Whether metrics.dashboard ("auto" | "on" | "off") serves the dashboard ("auto": only
/// when no bearer tokens are configured).
bool DashboardEnabled(const ServerConfig& config);

/// "/dashboard" (the page), "/dashboard/sessions" and "/dashboard/history?session=&after=".
/// `host` must outlive the routes.
std::map<std::string, HttpEndpoint::Route> DashboardRoutes(TrainingHost* host, const ServerConfig& config);

/// The page (dashboard_page.cpp).
const std::string& DashboardPage();

}  // namespace streambp::server
