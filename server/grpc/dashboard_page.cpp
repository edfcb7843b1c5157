// The dashboard page: plain HTML, CSS and JavaScript drawing SVG line charts, no library and
// no build step. It reads /dashboard/sessions and /dashboard/history (docs/operations.md:
// Dashboard) and polls every `poll` ms (default 2000; ?poll=N in the URL). A token for a
// server with auth goes in the URL's fragment, which browsers never send: /dashboard#token=T.
// Each chart is an <svg class="chart" data-session data-metric data-points> whose
// <polyline class="curve"> holds one point per recorded step that has the value.
#include "dashboard.h"

namespace streambp::server {

const std::string& DashboardPage() {
  static const std::string page = R"PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>streambp-server: training</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1d232b; }
  header { display: flex; align-items: baseline; gap: 16px; padding: 12px 20px; background: #1d232b; color: #fff; }
  header h1 { font-size: 18px; margin: 0; }
  #status { color: #c9d1d9; }
  #status.error { color: #ff9b8f; }
  section { margin: 16px 20px; padding: 12px 16px; background: #fff; border: 1px solid #dde1e6; border-radius: 6px; }
  section h2 { font-size: 16px; margin: 0 0 8px 0; }
  section h2 small { font-weight: normal; color: #5b6673; margin-left: 8px; }
  .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: 12px; }
  figure { margin: 0; }
  figcaption { display: flex; justify-content: space-between; color: #5b6673; font-size: 12px; }
  figcaption b { color: #1d232b; font-weight: 600; }
  svg.chart { width: 100%; height: 150px; background: #fbfcfd; border: 1px solid #eceff2; }
  svg .curve { fill: none; stroke: #2f6fdf; stroke-width: 1.6; vector-effect: non-scaling-stroke; }
  svg .axis { fill: #8a94a0; font-size: 10px; }
  svg .grid { stroke: #eceff2; stroke-width: 1; vector-effect: non-scaling-stroke; }
  .empty { color: #8a94a0; }
</style>
</head>
<body>
<header><h1>streambp-server</h1><span id="status">loading…</span></header>
<main id="sessions"></main>
<script>
"use strict";
const CHARTS = [
  ["loss", "loss", 1],
  ["reward_mean", "reward (mean)", 1],
  ["grad_norm", "grad norm", 1],
  ["learning_rate", "learning rate", 1],
  ["tokens_per_second", "tokens / s", 1],
  ["peak_memory_bytes", "peak memory (MiB)", 1 / 1048576],
];
const params = new URLSearchParams(location.search);
const POLL = Math.max(200, Number(params.get("poll")) || 2000);
const token = new URLSearchParams(location.hash.slice(1)).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
const sessions = new Map();  // name -> { records, last, section, charts }
let refreshes = 0;

async function get(url) {
  const r = await fetch(url, { headers, cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || (url + ": HTTP " + r.status));
  return body;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function fmt(v) {
  if (!Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return Number(v.toPrecision(4)).toString();
}

function addSession(name) {
  const section = document.createElement("section");
  section.dataset.session = name;
  const title = document.createElement("h2");
  title.textContent = name === "" ? "default session" : "session " + name;
  const info = document.createElement("small");
  title.appendChild(info);
  section.appendChild(title);
  const grid = document.createElement("div");
  grid.className = "charts";
  section.appendChild(grid);
  const charts = {};
  for (const [key, label] of CHARTS) {
    const figure = document.createElement("figure");
    const caption = document.createElement("figcaption");
    caption.innerHTML = "<span></span><b></b>";
    caption.firstChild.textContent = label;
    const chart = svg("svg", { class: "chart", viewBox: "0 0 320 150", preserveAspectRatio: "none",
                               "data-session": name, "data-metric": key, "data-points": "0" });
    figure.append(caption, chart);
    grid.appendChild(figure);
    charts[key] = { chart, value: caption.lastChild };
  }
  document.getElementById("sessions").appendChild(section);
  const s = { records: [], last: 0, section, info, charts };
  sessions.set(name, s);
  return s;
}

// One chart: the finite values of `key` against step, scaled into the box with margins.
function draw(s, key, scale) {
  const { chart, value } = s.charts[key];
  const points = [];
  for (const r of s.records) {
    const v = r[key];
    if (!r.skipped && typeof v === "number" && Number.isFinite(v)) points.push([r.step, v * scale]);
  }
  chart.replaceChildren();
  chart.setAttribute("data-points", String(points.length));
  value.textContent = points.length ? fmt(points[points.length - 1][1]) : "";
  if (points.length === 0) {
    const t = svg("text", { x: 160, y: 80, "text-anchor": "middle", class: "axis" });
    t.textContent = key === "reward_mean" ? "no rollout or GRPO steps yet" : "no steps yet";
    chart.appendChild(t);
    return;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
  const L = 44, R = 8, T = 8, B = 18, W = 320 - L - R, H = 150 - T - B;
  const X = (x) => L + (x - x0) / (x1 - x0) * W, Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * H;
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    chart.appendChild(svg("line", { x1: L, x2: L + W, y1: Y(y), y2: Y(y), class: "grid" }));
    const t = svg("text", { x: L - 4, y: Y(y) + 3, "text-anchor": "end", class: "axis" });
    t.textContent = fmt(y);
    chart.appendChild(t);
  }
  for (const [x, anchor] of [[x0, "start"], [x1, "end"]]) {
    const t = svg("text", { x: X(x), y: 146, "text-anchor": anchor, class: "axis" });
    t.textContent = "step " + Math.round(x);
    chart.appendChild(t);
  }
  const line = svg("polyline", { class: "curve",
                                 points: points.map(([x, y]) => X(x).toFixed(1) + "," + Y(y).toFixed(1)).join(" ") });
  chart.appendChild(line);
  if (points.length === 1) chart.appendChild(svg("circle", { cx: X(xs[0]), cy: Y(ys[0]), r: 2.5, fill: "#2f6fdf" }));
}

async function refresh() {
  const list = await get("/dashboard/sessions");
  for (const info of list.sessions) {
    const s = sessions.get(info.name) || addSession(info.name);
    for (;;) {
      const h = await get("/dashboard/history?session=" + encodeURIComponent(info.name) + "&after=" + s.last);
      if (h.records.length === 0) break;
      s.records.push(...h.records);
      s.last = h.records[h.records.length - 1].index;
      if (s.last >= h.last_index) break;
    }
    s.info.textContent = "step " + info.step + " · policy version " + info.policy_version + " · " +
                         s.records.length + " steps recorded";
    for (const [key, , scale] of CHARTS) draw(s, key, scale);
  }
  for (const [name, s] of sessions) {
    if (!list.sessions.some((x) => x.name === name)) { s.section.remove(); sessions.delete(name); }
  }
  if (list.sessions.length === 0 && !document.querySelector("#sessions .empty")) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = "No sessions yet.";
    document.getElementById("sessions").appendChild(p);
  } else if (list.sessions.length > 0) {
    document.querySelectorAll("#sessions .empty").forEach((e) => e.remove());
  }
}

async function loop() {
  const status = document.getElementById("status");
  try {
    await refresh();
    refreshes += 1;
    status.className = "";
    status.textContent = sessions.size + " session" + (sessions.size === 1 ? "" : "s") + " · updated " +
                         new Date().toLocaleTimeString();
  } catch (e) {
    status.className = "error";
    status.textContent = String(e.message || e);
  }
  document.body.dataset.refreshes = String(refreshes);
  setTimeout(loop, POLL);
}
loop();
</script>
</body>
</html>
)PAGE";
  return page;
}

}  // namespace streambp::server
