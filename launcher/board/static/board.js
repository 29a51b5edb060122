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
// Plotly shows its mode bar (zoom, pan, download) on hover in the top MODEBAR_PX of a chart; the title sits
// below that strip, so no title, however long on a narrow chart, is ever under the buttons. Every axis grows
// its margin to fit its tick labels and title (automargin): a sweep's member names are long.
const MODEBAR_PX = 30;
const LAYOUT = {margin: {l: 56, r: 16, t: 60, b: 40}, font: {size: 11}};

function axis(title, extra) {
  return {title: {text: title}, automargin: true, ...(extra || {})};
}

// An axis of counts (steps, ranks, workers): whole-number ticks only, one per unit where plotly would halve them.
function countAxis(title, values) {
  const numbers = (values || []).filter(v => typeof v === "number");
  const span = numbers.length ? Math.max(...numbers) - Math.min(...numbers) : 0;
  return axis(title, {tickformat: "d", ...(span <= 8 ? {dtick: 1} : {})});
}

function plot(id, traces, title, xaxis, yaxis) {
  Plotly.react(id, traces, {...LAYOUT, xaxis, yaxis,
    title: {text: title, yref: "container", y: 1, yanchor: "top", pad: {t: MODEBAR_PX}}},
    {displaylogo: false, responsive: true});
}

// The charts that have data, in their order ([id, draw(id)] each); a chart without any is removed, never drawn empty.
function showCharts(container, charts) {
  const wanted = new Set(charts.map(([id]) => id));
  for (const div of [...container.children]) {
    if (!wanted.has(div.id)) { Plotly.purge(div); div.remove(); }
  }
  charts.forEach(([id, draw], i) => {
    const div = document.getElementById(id) || el("div", {id, class: "chart"});
    if (container.children[i] !== div) container.insertBefore(div, container.children[i] || null);
    draw(id);
  });
}

// Rebuilt only when what it shows changed: a poll must not swap a link out from under a click.
function replaceIfChanged(node, key, children) {
  if (node.dataset.key === key) return;
  node.dataset.key = key;
  node.replaceChildren(...children);
  node.hidden = children.length === 0;
}

function setFact(id, text) {
  const node = document.getElementById(id);
  node.textContent = text || "";
  node.hidden = !text;  // a fact the run has not recorded is left out, not shown blank
}

function runSkeleton(view) {
  const path = params.get("path");
  document.getElementById("main").replaceChildren(
    el("h2", {id: "title"}, view.run_id),
    el("section", {id: "failure", hidden: ""}),
    el("div", {class: "facts"}, ...["status", "step", "restarts", "world-size", "figures"].map(id => el("span", {id})),
      el("a", {id: "logs-link", href: `/logs?path=${encodeURIComponent(path)}`}, "logs by rank")),
    el("p", {class: "cmd", id: "command"}),
    el("div", {class: "charts", id: "run-charts"}),
    el("div", {class: "charts", id: "logged-charts"}),
    el("section", {id: "events-section", hidden: ""}));
}

function drawRun(view) {
  if (!document.getElementById("run-charts")) runSkeleton(view);
  drawFailure(view);
  setFact("status", `status: ${view.status}`);
  document.getElementById("status").className = `status-${view.status}`;
  setFact("step", known(view.step) ? `step ${progress(view)}` : "");
  setFact("restarts", `restarts: ${fmt(view.restarts)}`);
  const nodes = known(view.nodes) ? ` on ${fmt(view.nodes)} node${view.nodes === 1 ? "" : "s"}` : "";
  setFact("world-size", known(view.world_size) ? `world size ${fmt(view.world_size)}${nodes}` : "");
  const s = view.summary || {};
  setFact("figures", [known(s.samples_per_s) && `${fmt(s.samples_per_s, 0)} samples/s`,
    known(s.final_loss) && `final loss ${fmt(s.final_loss, 4)}`,
    known(s.goodput) && `goodput ${Math.round(100 * s.goodput)}%`].filter(Boolean).join(", "));
  setFact("command", view.command ? `next: ${view.command}` : "");
  showCharts(document.getElementById("run-charts"), runCharts(view));
  showCharts(document.getElementById("logged-charts"), loggedCharts(view.series.step, view.logged || {}));
  const events = view.events.map(e => (e.at ? new Date(e.at * 1000).toLocaleTimeString() + " " : "") + e.text);
  replaceIfChanged(document.getElementById("events-section"), JSON.stringify(events), events.length ? [
    el("h3", {}, "restarts, hang verdicts, membership changes, warnings"), el("ul", {id: "events"}, ...events.map(t => el("li", {}, t)))] : []);
}

function runCharts(view) {
  const x = view.series.step;
  // a script whose DataLoader could not be read has steps/s only
  const samples = anyKnown(view.series.samples_per_s);
  const rate = samples ? view.series.samples_per_s : view.series.steps_per_s;
  const unit = samples ? "samples/s" : "steps/s";
  const st = view.step_times, mem = view.memory;
  const charts = [];
  if (anyKnown(view.series.loss)) charts.push(["loss", id => plot(id,
    [{x, y: view.series.loss, mode: "lines+markers", name: "loss"}], "loss", countAxis("step", x), axis("loss"))]);
  if (anyKnown(rate)) charts.push(["throughput", id => plot(id,
    [{x, y: rate, mode: "lines+markers", name: unit}], "throughput", countAxis("step", x), axis(unit))]);
  if (anyKnown(st.z)) charts.push(["heatmap", id => drawHeatmap(id, st)]);
  if (anyKnown(mem.mb)) charts.push(["memory", id => plot(id, [{type: "bar", x: mem.mb.map((_, r) => r), y: mem.mb, name: "MB"}],
    `memory per rank (${mem.kind})`, countAxis("rank", mem.mb.map((_, r) => r)), axis("MB"))]);
  return charts;
}

function drawHeatmap(id, st) {
  const ms = st.z.map(r => r.map(v => v === null ? null : v * 1000));
  // colours saturate at twice the median cell: one slow start-up step must not wash out a straggler
  const cells = ms.flat().filter(v => v !== null).sort((a, b) => a - b);
  const zmax = cells.length ? 2 * cells[Math.floor(cells.length / 2)] : undefined;
  plot(id, [{type: "heatmap", x: st.steps, y: st.ranks, z: ms, zmin: 0, zmax, colorscale: "YlOrRd", reversescale: true,
    colorbar: {title: {text: "ms"}}}], "step time per rank (ms): a straggler is a hot row",
    countAxis("step", st.steps), countAxis("rank", st.ranks));
}

// A script's launcher.log() values, one chart each (every rank's line for per_rank values).
function loggedCharts(x, logged) {
  return Object.entries(logged).filter(([, values]) => anyKnown(values)).map(([key, values], i) => [`logged-${i}`, id => {
    const traces = values.length && values.every(Array.isArray)
      ? values.map((y, r) => ({x, y, mode: "lines+markers", name: `rank ${r}`}))
      : [{x, y: values, mode: "lines+markers", name: key}];
    plot(id, traces, `${key} (launcher.log)`, countAxis("step", x), axis(key));
  }]);
}

// A failed run leads with its error: the rank that failed first (summary.json's root_cause) and its traceback,
// not rank 0's knock-on error; a failure without a root cause (a hang verdict) with summary.json's error line.
function drawFailure(view) {
  const failure = view.failure;
  const error = failure ? failure.error : view.error;
  const parts = [];
  if (failure) {
    const logs = `/logs?path=${encodeURIComponent(params.get("path"))}&rank=${failure.rank}`;
    parts.push(el("h3", {class: "error", id: "failure-head"}, `root cause: rank ${failure.rank} failed first`),
      ...(known(error) ? [el("p", {id: "failure-error"}, error)] : []),
      el("pre", {id: "failure-traceback"}, failure.traceback || "(no traceback recorded)"),
      el("a", {href: logs}, `rank ${failure.rank}'s log`));
  } else if (known(error)) {
    parts.push(el("h3", {class: "error", id: "failure-head"}, view.status), el("p", {id: "failure-error"}, error));
  }
  replaceIfChanged(document.getElementById("failure"), JSON.stringify([failure, error]), parts);
}

const COLUMN_DIGITS = {"samples/s": 0, "final loss": 4};

// Bars run sideways: a member's name ("trainer.steps=20 optimizer.lr=0.001") reads whole on the left instead
// of turned under a chart it would crowd out; the chart grows a row per member.
function groupChart(id, chart) {
  const names = chart.x.map(String);
  if (chart.type !== "bar") {
    plot(id, chart.series.map(s => ({x: names, y: s.y, name: s.name, mode: "lines+markers"})), chart.title,
      axis(chart.xlabel, {type: "category"}), axis(chart.ylabel));
    return;
  }
  document.getElementById(id).style.height = `${Math.max(320, 130 + 26 * names.length)}px`;
  plot(id, chart.series.map(s => ({type: "bar", orientation: "h", y: names, x: s.y, name: s.name})), chart.title,
    axis(chart.ylabel), axis(chart.xlabel, {type: "category", autorange: "reversed", ticklabelstandoff: 4}));
}

function drawGroup(view) {
  const main = document.getElementById("main");
  if (!document.getElementById("group-table")) {
    main.replaceChildren(el("h2", {id: "title"}, `${view.kind}: ${view.run_id}`),
      el("div", {class: "facts"}, el("span", {id: "status"}), el("span", {id: "step"}), el("span", {class: "cmd", id: "command"})),
      el("p", {id: "notice"}), el("div", {class: "charts", id: "group-charts"}), el("div", {id: "group-table"}));
  }
  setFact("notice", view.notice);
  setFact("status", `status: ${view.status}`);
  document.getElementById("status").className = `status-${view.status}`;
  setFact("step", known(view.step) ? `members done: ${progress(view)}` : "");
  setFact("command", view.command);
  const charts = view.charts.map((chart, i) => [chart, `chart-${i}`]).filter(([chart]) => anyKnown(chart.series.map(s => s.y)));
  showCharts(document.getElementById("group-charts"), charts.map(([chart, id]) => [id, () => groupChart(id, chart)]));
  const t = view.table;
  const cell = (value, j) => fmt(value, COLUMN_DIGITS[t.columns[j]]);
  const rows = t.rows.map((row, i) => el("tr", {}, ...row.map((value, j) =>
    el("td", {}, j === 0 && t.links[i] ? runLink({rel: t.links[i]}, cell(value, j)) : cell(value, j)))));
  const table = document.getElementById("group-table");
  replaceIfChanged(table, JSON.stringify(t), [
    el("table", {}, el("thead", {}, el("tr", {}, ...t.columns.map(c => el("th", {}, c)))), el("tbody", {}, ...rows))]);
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
