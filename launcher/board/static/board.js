// The board's page: one shell, three views (/ run list, /run?path= a run or group: run.js, /logs?path= rank logs),
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

// A whole number prints whole (a count is never "0.000"); digits apply to fractions only.
function fmt(value, digits) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? String(value) : value.toFixed(digits ?? 3);
}

function known(value) {
  return value !== null && value !== undefined && value !== "";
}

function anyKnown(values) {
  return (values || []).some(v => Array.isArray(v) ? anyKnown(v) : known(v));
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
const RUN_COLUMNS = ["run", "kind", "what", "status", "progress", "loss", "samples/s", "goodput", "restarts", "age",
  "command"];

// samples/s, or steps/s (said) for a script whose DataLoader could not be read
function throughput(row) {
  if (known(row.throughput)) return fmt(row.throughput, 0);
  return known(row.steps_per_s) ? `${fmt(row.steps_per_s, 1)} steps/s` : "";
}

function runRow(row, member) {
  const goodput = row.goodput === null || row.goodput === undefined ? "" : `${Math.round(100 * row.goodput)}%`;
  return el("tr", {"data-run-id": row.run_id, class: member ? "member" : "run"},
    el("td", {class: "run-id"}, runLink(row, (member && row.label) || row.run_id)), el("td", {class: "kind"}, row.kind),
    el("td", {class: "what"}, row.what || ""),
    el("td", {class: `status status-${row.status}`, title: row.note || ""}, row.status),
    el("td", {class: "progress"}, progress(row)), el("td", {class: "loss"}, fmt(row.loss, 4)),
    el("td", {class: "throughput"}, throughput(row)), el("td", {class: "goodput"}, goodput),
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
  main.replaceChildren(el("p", {id: "count"}, `${data.runs.length} runs, newest first`), table);
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
