// The board's page: one shell, three views (/ run list, /run?path= a run or group, /logs?path= rank logs),
// each polling the JSON APIs. Text from runs goes in with textContent only: a log line is never markup.
"use strict";

const POLL_MS = 1500;
const params = new URLSearchParams(location.search);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) && digits === undefined ? String(value) : value.toFixed(digits ?? 3);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 120) return `${Math.round(seconds)}s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)}m`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)}h`;
  return `${Math.round(seconds / 86400)}d`;
}

function progress(row) {
  if (row.step === null || row.step === undefined) return "";
  return row.steps ? `${row.step}/${row.steps}` : String(row.step);
}

function runLink(row, text) {
  return row.rel ? el("a", {href: `/run?path=${encodeURIComponent(row.rel)}`}, text) : text;
}

async function getJSON(url) {
  const response = await fetch(url, {cache: "no-store"});
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

function poll(draw) {
  // the next poll waits POLL_MS, or twice as long as this one took: a slow disk or a large output
  // directory gets polled less often instead of continuously
  const tick = async () => {
    const started = performance.now();
    try { await draw(); document.getElementById("error")?.remove(); } catch (e) { showError(e); }
    setTimeout(tick, Math.max(POLL_MS, 2 * (performance.now() - started)));
  };
  tick();
}

function loadPlotly() {
  // only the run pages draw charts: the run list does not parse plotly.js's 4.8 MB
  if (window.Plotly) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const script = el("script", {src: "/static/plotly.min.js"});
    script.onload = resolve;
    script.onerror = () => reject(new Error("plotly.min.js did not load"));
    document.head.append(script);
  });
}

function showError(error) {
  let box = document.getElementById("error");
  if (!box) { box = el("p", {id: "error", class: "error"}); document.getElementById("main").prepend(box); }
  box.textContent = String(error.message || error);
}

// --- the run list -------------------------------------------------------------------------------------
const RUN_COLUMNS = ["run", "kind", "status", "progress", "samples/s", "goodput", "restarts", "age", "command"];

function runRow(row, member) {
  const goodput = row.goodput === null || row.goodput === undefined ? "" : `${Math.round(100 * row.goodput)}%`;
  const label = member && row.overrides ? Object.entries(row.overrides).map(([k, v]) => `${k}=${v}`).join(" ") : row.run_id;
  return el("tr", {"data-run-id": row.run_id, class: member ? "member" : "run"},
    el("td", {class: "run-id"}, runLink(row, label)), el("td", {class: "kind"}, row.kind),
    el("td", {class: `status status-${row.status}`}, row.status), el("td", {class: "progress"}, progress(row)),
    el("td", {class: "throughput"}, fmt(row.throughput, 0)), el("td", {class: "goodput"}, goodput),
    el("td", {class: "restarts"}, fmt(row.restarts)), el("td", {class: "age"}, age(row.age_s)),
    el("td", {class: "cmd"}, row.command || ""));
}

async function drawRunList() {
  const data = await getJSON("/api/runs");
  document.getElementById("where").textContent = data.root;
  const body = el("tbody");
  for (const row of data.runs) {
    body.append(runRow(row, false));
    for (const member of row.members || []) body.append(runRow(member, true));
  }
  const table = el("table", {id: "runs"}, el("thead", {}, el("tr", {}, ...RUN_COLUMNS.map(c => el("th", {}, c)))), body);
  const main = document.getElementById("main");
  main.replaceChildren(el("p", {id: "count"}, `${data.runs.length} runs`), table);
}

// --- one run ------------------------------------------------------------------------------------------
const LAYOUT = {margin: {l: 60, r: 20, t: 36, b: 44}, font: {size: 11}};

function plot(id, traces, title, xlabel, ylabel, extra) {
  Plotly.react(id, traces, {...LAYOUT, title: {text: title}, xaxis: {title: {text: xlabel}},
    yaxis: {title: {text: ylabel}}, ...(extra || {})}, {displaylogo: false, responsive: true});
}

function runSkeleton(view) {
  const path = params.get("path");
  const main = document.getElementById("main");
  main.replaceChildren(
    el("h2", {id: "title"}, view.run_id),
    el("div", {class: "facts"}, el("span", {id: "status"}), el("span", {id: "step"}), el("span", {id: "restarts"}),
      el("span", {id: "figures"}), el("a", {id: "logs-link", href: `/logs?path=${encodeURIComponent(path)}`}, "logs by rank")),
    el("p", {class: "cmd", id: "command"}),
    el("section", {id: "failure"}),
    el("div", {class: "charts"}, ...["loss", "throughput", "heatmap", "memory"].map(id => el("div", {id, class: "chart"}))),
    el("div", {class: "charts", id: "logged-charts"}),
    el("h3", {}, "restarts and hang verdicts, warnings"), el("ul", {id: "events"}));
}

function drawRun(view) {
  if (!document.getElementById("heatmap")) runSkeleton(view);
  const status = document.getElementById("status");
  status.textContent = `status: ${view.status}`;
  status.className = `status-${view.status}`;
  document.getElementById("step").textContent = `step ${progress(view) || "-"}`;
  document.getElementById("restarts").textContent = `restarts: ${view.restarts}`;
  const s = view.summary;
  document.getElementById("figures").textContent = s ? `${fmt(s.samples_per_s, 0)} samples/s, final loss ${fmt(s.final_loss, 4)}` +
    (s.goodput !== null && s.goodput !== undefined ? `, goodput ${Math.round(100 * s.goodput)}%` : "") + (s.error ? `; ${s.error}` : "") : "";
  document.getElementById("command").textContent = view.command ? `next: ${view.command}` : "";
  drawFailure(view.failure);
  const x = view.series.step;
  plot("loss", [{x, y: view.series.loss, mode: "lines+markers", name: "loss"}], "loss", "step", "loss");
  // a script whose DataLoader could not be read has steps/s only
  const samples = view.series.samples_per_s.some(v => v !== null && v !== undefined);
  const rate = samples ? view.series.samples_per_s : view.series.steps_per_s;
  const unit = samples ? "samples/s" : "steps/s";
  plot("throughput", [{x, y: rate, mode: "lines+markers", name: unit}], "throughput", "step", unit);
  drawLogged(x, view.logged || {});
  const st = view.step_times;
  const ms = st.z.map(r => r.map(v => v === null ? null : v * 1000));
  // colours saturate at twice the median cell: one slow start-up step must not wash out a straggler
  const cells = ms.flat().filter(v => v !== null).sort((a, b) => a - b);
  const zmax = cells.length ? 2 * cells[Math.floor(cells.length / 2)] : undefined;
  plot("heatmap", [{type: "heatmap", x: st.steps, y: st.ranks, z: ms, zmin: 0, zmax,
    colorscale: "YlOrRd", reversescale: true, colorbar: {title: {text: "ms"}}}], "step time per rank (ms): a straggler is a hot row",
    "step", "rank", {yaxis: {title: {text: "rank"}, dtick: 1}});
  const mem = view.memory;
  plot("memory", [{type: "bar", x: mem.mb.map((_, r) => r), y: mem.mb, name: "MB"}],
    `memory per rank (${mem.kind || "none recorded"})`, "rank", "MB", {xaxis: {title: {text: "rank"}, dtick: 1}});
  const events = document.getElementById("events");
  events.replaceChildren(...(view.events.length ? view.events.map(e =>
    el("li", {}, (e.at ? new Date(e.at * 1000).toLocaleTimeString() + " " : "") + e.text)) : [el("li", {}, "none")]));
}

// A script's launcher.log() values, one chart each (every rank's line for per_rank values).
function drawLogged(x, logged) {
  const charts = document.getElementById("logged-charts");
  Object.entries(logged).forEach(([key, values], i) => {
    const id = `logged-${i}`;
    if (!document.getElementById(id)) charts.append(el("div", {id, class: "chart logged"}));
    const traces = Array.isArray(values[0]) || (values.length && values.every(Array.isArray))
      ? values.map((y, r) => ({x, y, mode: "lines+markers", name: `rank ${r}`}))
      : [{x, y: values, mode: "lines+markers", name: key}];
    plot(id, traces, `${key} (launcher.log)`, "step", key);
  });
}

// A failed run leads with the rank that failed first and its traceback, not rank 0's knock-on error.
function drawFailure(failure) {
  const section = document.getElementById("failure");
  if (!failure) { section.replaceChildren(); return; }
  const logs = `/logs?path=${encodeURIComponent(params.get("path"))}&rank=${failure.rank}`;
  section.replaceChildren(
    el("h3", {class: "error"}, `root cause: rank ${failure.rank} failed first`),
    el("p", {id: "failure-error"}, failure.error || ""),
    el("pre", {id: "failure-traceback"}, failure.traceback || "(no traceback recorded)"),
    el("a", {href: logs}, `rank ${failure.rank}'s log`));
}

function drawGroup(view) {
  const main = document.getElementById("main");
  if (!document.getElementById("group-table")) {
    main.replaceChildren(el("h2", {id: "title"}, `${view.kind}: ${view.run_id}`),
      el("div", {class: "facts"}, el("span", {id: "status"}), el("span", {id: "step"}), el("span", {class: "cmd", id: "command"})),
      el("p", {id: "notice"}), el("div", {class: "charts", id: "group-charts"}), el("div", {id: "group-table"}));
  }
  document.getElementById("notice").textContent = view.notice || "";
  const status = document.getElementById("status");
  status.textContent = `status: ${view.status}`;
  status.className = `status-${view.status}`;
  document.getElementById("step").textContent = `members done: ${progress(view)}`;
  document.getElementById("command").textContent = view.command || "";
  const charts = document.getElementById("group-charts");
  view.charts.forEach((chart, i) => {
    const id = `chart-${i}`;
    if (!document.getElementById(id)) charts.append(el("div", {id, class: "chart"}));
    const traces = chart.series.map(s => ({x: chart.x.map(String), y: s.y, name: s.name,
      type: chart.type === "bar" ? "bar" : "scatter", mode: chart.type === "bar" ? undefined : "lines+markers"}));
    plot(id, traces, chart.title, chart.xlabel, chart.ylabel);
  });
  const t = view.table;
  const rows = t.rows.map((row, i) => el("tr", {}, ...row.map((cell, j) =>
    el("td", {}, j === 0 && t.links[i] ? runLink({rel: t.links[i]}, fmt(cell, 3)) : fmt(cell, 3)))));
  document.getElementById("group-table").replaceChildren(
    el("table", {}, el("thead", {}, el("tr", {}, ...t.columns.map(c => el("th", {}, c)))), el("tbody", {}, ...rows)));
}

async function drawRunPage() {
  const path = params.get("path");
  document.getElementById("where").textContent = path;
  const view = await getJSON(`/api/run?path=${encodeURIComponent(path)}`);
  if (view.view === "run") drawRun(view); else drawGroup(view);
}

// --- logs by rank -------------------------------------------------------------------------------------
let logRank = params.get("rank") || "all";

async function drawLogs() {
  const path = params.get("path");
  const main = document.getElementById("main");
  if (!document.getElementById("log")) {
    document.getElementById("where").textContent = `${path} logs`;
    main.replaceChildren(el("p", {}, el("a", {href: `/run?path=${encodeURIComponent(path)}`}, "back to the run")),
      el("div", {class: "ranks", id: "ranks"}),
      el("p", {}, "grep ", el("input", {id: "grep", size: 30}), " ", el("label", {}, el("input", {id: "follow", type: "checkbox", checked: ""}), " follow")),
      el("pre", {id: "log"}));
  }
  if (!document.getElementById("follow").checked && document.getElementById("log").textContent) return;
  const grep = document.getElementById("grep").value;
  const data = await getJSON(`/api/logs?path=${encodeURIComponent(path)}&rank=${logRank}&grep=${encodeURIComponent(grep)}`);
  const buttons = ["all", ...data.ranks.map(String)].map(r => {
    const b = el("button", {class: r === logRank ? "on" : "", "data-rank": r}, r === "all" ? "all ranks" : `rank ${r}`);
    b.onclick = () => { logRank = r; document.getElementById("log").textContent = ""; drawLogs(); };
    return b;
  });
  document.getElementById("ranks").replaceChildren(...buttons);
  const log = document.getElementById("log");
  const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.textContent = data.lines.join("\n");
  if (atBottom) log.scrollTop = log.scrollHeight;
}

if (location.pathname === "/run") loadPlotly().then(() => poll(drawRunPage), showError);
else poll(location.pathname === "/logs" ? drawLogs : drawRunList);
