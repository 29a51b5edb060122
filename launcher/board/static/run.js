// The run page (/run?path=): one run's header, charts and events, or a sweep's, compare's or scale sweep's
// charts and member table. Helpers (el, fmt, known, poll, ...) are board.js's, which loads after this file.
"use strict";

// Plotly shows its mode bar (zoom, pan, download) on hover in the top MODEBAR_PX of a chart; the title sits
// below that strip, so no title, however long on a narrow chart, is ever under the buttons. Every axis grows
// its margin to fit its tick labels and title (automargin): a sweep's member names are long.
const MODEBAR_PX = 30;
const LAYOUT = {margin: {l: 56, r: 16, t: 60, b: 40}, font: {size: 11}};
// Events drawn on every chart over steps (launcher/board/events.py MARKED): a dashed line and a short label.
const MARK = {restart: ["restart", "#c62828"], hang: ["hang", "#6a1b9a"], membership: ["membership", "#00838f"],
  resume: ["resume", "#2e7d32"], interrupt: ["interrupt", "#ef6c00"], preemption: ["preempted", "#ad1457"],
  straggler: ["straggler", "#5d4037"]};
// start-up and restart phases (launcher.runtime.goodput.PHASES), never the green of kept steps
const PHASE_COLOURS = {launch: "#ef6c00", process_group: "#8e24aa", build: "#d81b60", reload: "#6d4c41",
  first_step: "#fbc02d", other: "#78909c"};
const PHASES = [["data", "data loading"], ["forward", "forward"], ["backward", "backward (compute)"],
  ["comm", "all-reduce wait (in backward)"], ["optimizer", "optimizer"]];

function axis(title, extra) {
  return {title: {text: title}, automargin: true, ...(extra || {})};
}

// An axis of counts (steps, ranks, workers): whole-number ticks only, one per unit where plotly would halve them.
function countAxis(title, values) {
  const numbers = (values || []).filter(v => typeof v === "number");
  const span = numbers.length ? Math.max(...numbers) - Math.min(...numbers) : 0;
  return axis(title, {tickformat: "d", ...(span <= 8 ? {dtick: 1} : {})});
}

function plot(id, traces, title, xaxis, yaxis, extra) {
  Plotly.react(id, traces, {...LAYOUT, xaxis, yaxis, ...(extra || {}),
    title: {text: title, yref: "container", y: 1, yanchor: "top", pad: {t: MODEBAR_PX}}},
    {displaylogo: false, responsive: true});
}

// The run's events as a chart's shapes and labels, on its step axis; labels step down a row where they would meet.
function markLayout(events) {
  const marked = (events || []).filter(e => MARK[e.kind] && typeof e.step === "number");
  const shapes = [], annotations = [];
  let lastStep = null, row = 0;
  for (const e of [...marked].sort((a, b) => a.step - b.step)) {
    const [label, color] = MARK[e.kind];
    row = lastStep !== null && e.step === lastStep ? row + 1 : 0;
    lastStep = e.step;
    shapes.push({type: "line", xref: "x", yref: "paper", x0: e.step, x1: e.step, y0: 0, y1: 1,
      line: {color, width: 1.5, dash: "dash"}});
    annotations.push({xref: "x", yref: "paper", x: e.step, y: 1 - 0.09 * (row % 4), yanchor: "top", xanchor: "left",
      text: label, hovertext: `step ${e.step}: ${e.text}`, showarrow: false, font: {size: 10, color},
      bgcolor: "rgba(255,255,255,0.8)", captureevents: true});
  }
  return {shapes, annotations, meta: {marks: marked.length}};
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
  container.hidden = charts.length === 0;
  const heading = container.previousElementSibling;
  if (heading && heading.tagName === "H3") heading.hidden = charts.length === 0;
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

function clock(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const [h, m] = [Math.floor(s / 3600), Math.floor(s / 60) % 60];
  return (h ? `${h}:${String(m).padStart(2, "0")}` : `${m}`) + `:${String(s % 60).padStart(2, "0")}`;
}

function runSkeleton(view) {
  const path = params.get("path");
  const section = (id, title) => [el("h3", {class: "charts-title", hidden: ""}, title), el("div", {class: "charts", id, hidden: ""})];
  document.getElementById("main").replaceChildren(
    el("h2", {id: "title"}, view.run_id, el("span", {id: "what", class: "what"})),
    el("section", {id: "failure", hidden: ""}),
    el("div", {class: "facts"}, ...["status", "step", "rate", "eta", "restarts", "world-size", "figures"].map(id => el("span", {id})),
      el("a", {id: "logs-link", href: `/logs?path=${encodeURIComponent(path)}`}, "logs by rank")),
    el("p", {class: "straggler", id: "straggler", hidden: ""}),
    el("p", {class: "cmd", id: "command"}),
    el("div", {class: "charts", id: "run-charts"}),
    ...section("time-charts", "where the time went"),
    ...section("logged-charts", "launcher.log values, every call"),
    el("section", {id: "events-section", hidden: ""}));
}

function drawRun(view) {
  if (!document.getElementById("run-charts")) runSkeleton(view);
  drawFailure(view);
  document.getElementById("what").textContent = view.what ? ` · ${view.what}` : "";
  setFact("status", `status: ${view.status}` + (view.note ? ` (${view.note})` : ""));  // a preempted run: when, requeued
  document.getElementById("status").className = `status-${view.status}`;
  setFact("step", known(view.step) ? `step ${progress(view)}` : "");
  drawLive(view.live || {});
  setFact("restarts", `restarts: ${fmt(view.restarts)}`);
  const nodes = known(view.nodes) ? ` on ${fmt(view.nodes)} node${view.nodes === 1 ? "" : "s"}` : "";
  setFact("world-size", known(view.world_size) ? `world size ${fmt(view.world_size)}${nodes}` : "");
  const s = view.summary || {};
  const rate = known(s.samples_per_s) ? `${fmt(s.samples_per_s, 0)} samples/s` : known(s.steps_per_s) && `${fmt(s.steps_per_s, 1)} steps/s`;
  setFact("figures", [rate, known(s.final_loss) && `final loss ${fmt(s.final_loss, 4)}`,
    known(s.goodput) && `goodput ${Math.round(100 * s.goodput)}%`].filter(Boolean).join(", "));
  const ranks = (view.time || {}).ranks;
  setFact("straggler", ranks && ranks.straggler ? `straggler: ${ranks.straggler}` : "");
  setFact("command", view.command ? `next: ${view.command}` : "");
  const marks = markLayout(view.events);
  showCharts(document.getElementById("run-charts"), runCharts(view, marks));
  showCharts(document.getElementById("time-charts"), timeCharts(view.time || {}, marks));
  showCharts(document.getElementById("logged-charts"), loggedCharts(view.logged || {}, marks));
  const events = view.events.map(e => (e.at ? new Date(e.at * 1000).toLocaleTimeString() + " " : "") +
    (known(e.step) ? `(step ${e.step}) ` : "") + e.text);
  replaceIfChanged(document.getElementById("events-section"), JSON.stringify(events), events.length ? [
    el("h3", {}, "events: restarts, hang verdicts, membership changes, resumes, stragglers, warnings"),
    el("ul", {id: "events"}, ...view.events.map((e, i) => el("li", {class: `event-${e.kind}`}, events[i])))] : []);
}

// While it runs: the throughput of its newest record and when it ends, from its step rate past the first steps.
function drawLive(live) {
  const rate = known(live.samples_per_s) ? `${fmt(live.samples_per_s, 0)} samples/s`
    : known(live.steps_per_s) ? `${fmt(live.steps_per_s, 1)} steps/s` : "";
  setFact("rate", rate && `now ${rate}`);
  setFact("eta", known(live.eta_s)
    ? `ETA ${clock(live.eta_s)} (at ${fmt(live.step_rate, 2)} steps/s over the last ${fmt(live.rate_steps)} ` +
      `step${live.rate_steps === 1 ? "" : "s"})` : "");
}

function runCharts(view, marks) {
  const x = view.series.step;
  // a script whose DataLoader could not be read has steps/s only
  const samples = anyKnown(view.series.samples_per_s);
  const rate = samples ? view.series.samples_per_s : view.series.steps_per_s;
  const unit = samples ? "samples/s" : "steps/s";
  const st = view.step_times, mem = view.memory;
  const charts = [];
  const logged = (view.logged || {}).loss;  // a script's every call, where it logged "loss"
  if (logged && !logged.own_step) charts.push(["loss", id => loggedChart(id, "loss", logged, marks)]);
  else if (anyKnown(view.series.loss)) charts.push(["loss", id => plot(id,
    [{x, y: view.series.loss, mode: "lines+markers", name: "loss"}], "loss", countAxis("step", x), axis("loss"), marks)]);
  if (anyKnown(rate)) charts.push(["throughput", id => plot(id,
    [{x, y: rate, mode: "lines+markers", name: unit}], "throughput", countAxis("step", x), axis(unit), marks)]);
  if (anyKnown(st.z)) charts.push(["heatmap", id => drawHeatmap(id, st, marks)]);
  if (anyKnown(mem.mb)) charts.push(["memory", id => plot(id, [{type: "bar", x: mem.mb.map((_, r) => r), y: mem.mb, name: "MB"}],
    `memory per rank (${mem.kind})`, countAxis("rank", mem.mb.map((_, r) => r)), axis("MB"))]);
  return charts.concat(figureCharts(x, view.figures || [], marks));
}

// The step-record fields the schema declares for charts (launcher/runtime/schema.py): the job's line, each rank's.
function figureCharts(x, figures, marks) {
  return figures.filter(f => anyKnown(f.job) || anyKnown(f.per_rank)).map(f => [`figure-${f.name}`, id => {
    // a line of few points shows its points too: one point alone draws nothing as a line
    const mode = x.length > 50 ? "lines" : "lines+markers";
    const traces = (f.per_rank || []).map((y, r) => ({x, y, mode, name: `rank ${r}`}));
    if (f.job) traces.unshift({x, y: f.job, mode: "lines+markers", name: "job"});
    plot(id, traces, f.unit ? `${f.name} (${f.unit})` : f.name, countAxis("step", x), axis(f.unit || f.name), marks);
  }]);
}

function drawHeatmap(id, st, marks) {
  const ms = st.z.map(r => r.map(v => v === null ? null : v * 1000));
  // colours saturate at twice the median cell: one slow start-up step must not wash out a straggler
  const cells = ms.flat().filter(v => v !== null).sort((a, b) => a - b);
  const zmax = cells.length ? 2 * cells[Math.floor(cells.length / 2)] : undefined;
  plot(id, [{type: "heatmap", x: st.steps, y: st.ranks, z: ms, zmin: 0, zmax, colorscale: "YlOrRd", reversescale: true,
    colorbar: {title: {text: "ms"}}}], `${st.what || "step time"} per rank (ms): a straggler is a hot row`,
    countAxis("step", st.steps), countAxis("rank", st.ranks), marks);
}

// Where the time went: each step's phases (the built-in trainer), each rank's compute and wait (a script), and
// the run's wall time by cause and phase (summary.json's goodput and badput).
function timeCharts(time, marks) {
  const charts = [];
  const p = time.phases;
  if (p && anyKnown(p.forward)) charts.push(["time-phases", id => {
    const ms = values => values.map(v => v === null ? null : v * 1000);
    const traces = PHASES.filter(([key]) => anyKnown(p[key])).map(([key, name]) =>
      ({x: p.steps, y: ms(p[key]), name, mode: "lines", stackgroup: "phases", line: {width: 0.5}}));
    if (anyKnown(p.step)) traces.push({x: p.steps, y: ms(p.step), name: "step time", mode: "lines+markers",
      line: {color: "#222", dash: "dot"}});
    plot(id, traces, "each step's time (ms, mean over ranks)", countAxis("step", p.steps), axis("ms"), marks);
  }]);
  const r = time.ranks;
  if (r && anyKnown(r.compute)) charts.push(["time-ranks", id => {
    const ranks = r.compute.map((_, k) => k);
    const colours = ranks.map(k => k === r.straggler_rank ? "#c62828" : "#1f77b4");
    plot(id, [{type: "bar", x: ranks, y: r.compute.map(v => v * 1000), name: "compute", marker: {color: colours}},
      {type: "bar", x: ranks, y: r.wait.map(v => v * 1000), name: "wait in collectives", marker: {color: "#ffb74d"}}],
    `compute and wait per rank (ms per step, ${r.what})`, countAxis("rank", ranks), axis("ms"), {barmode: "stack"});
  }]);
  const b = time.badput;
  if (b && b.parts.some(part => part.s > 0)) charts.push(["time-badput", id => badputChart(id, b)]);
  return charts;
}

// One bar per cause (kept steps first), split by phase where the run recorded them (start-up, restart, membership).
function badputChart(id, badput) {
  const causes = [...new Set(badput.parts.map(p => p.cause))];
  const seconds = (cause, phase) => badput.parts.filter(p => p.cause === cause && p.phase === phase).reduce((s, p) => s + p.s, 0) || null;
  const phases = [...new Set(badput.parts.filter(p => p.phase).map(p => p.phase))];
  const traces = [{type: "bar", orientation: "h", name: "kept steps", y: causes, x: causes.map(c => c === "kept steps" ? seconds(c, "") : null),
    marker: {color: "#43a047"}},
  {type: "bar", orientation: "h", name: "lost (no phases)", y: causes, x: causes.map(c => c === "kept steps" ? null : seconds(c, "")),
    marker: {color: "#90a4ae"}},
  ...phases.map(phase => ({type: "bar", orientation: "h", name: phase.replace("_", " "), y: causes, x: causes.map(c => seconds(c, phase)),
    marker: {color: PHASE_COLOURS[phase] || "#546e7a"}}))];
  const share = known(badput.goodput) ? `: ${Math.round(100 * badput.goodput)}% kept` : "";
  document.getElementById(id).style.height = `${Math.max(320, 150 + 30 * causes.length)}px`;
  plot(id, traces.filter(t => t.x.some(known)), `the run's ${fmt(badput.wall_s, 1)} s by cause and phase${share}`,
    axis("s"), axis("", {type: "category", autorange: "reversed"}), {barmode: "stack", legend: {traceorder: "normal"}});
}

// A script's launcher.log() values, one chart each, every call (downsampled for display past 2,000 points).
function loggedCharts(logged, marks) {
  return Object.entries(logged).filter(([key, c]) => key !== "loss" || c.own_step)
    .filter(([, c]) => c.traces.some(t => anyKnown(t.y)))
    .map(([key, c], i) => [`logged-${i}`, id => loggedChart(id, key, c, marks)]);
}

function loggedChart(id, key, c, marks) {
  const traces = c.traces.map(t => ({x: t.x, y: t.y, mode: c.shown > 300 ? "lines" : "lines+markers", name: t.name}));
  const what = c.shown < c.calls ? `${fmt(c.shown)} of ${fmt(c.calls)} calls, downsampled` : `${fmt(c.calls)} calls`;
  plot(id, traces, `${key} (launcher.log: ${what})`, countAxis(c.own_step ? "step= given" : "step", c.traces[0].x),
    axis(key), c.own_step ? {} : marks);
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

// Error bars from a series' low and high (a scale sweep's slowest and fastest rounds), where it has them.
function errorBars(s) {
  if (!s.low || !s.high) return {};
  return {error_y: {type: "data", symmetric: false, array: s.y.map((y, i) => known(y) && known(s.high[i]) ? s.high[i] - y : null),
    arrayminus: s.y.map((y, i) => known(y) && known(s.low[i]) ? y - s.low[i] : null), thickness: 1.5, width: 6}};
}

// Bars run sideways: a member's name ("trainer.steps=20 optimizer.lr=0.001") reads whole on the left instead
// of turned under a chart it would crowd out; the chart grows a row per member.
function groupChart(id, chart) {
  const names = chart.x.map(String);
  if (chart.type !== "bar") {
    plot(id, chart.series.map(s => s.points
      ? {x: s.points.map(p => String(p[0])), y: s.points.map(p => p[1]), name: s.name, mode: "markers",
        marker: {color: "rgba(120,120,120,0.55)", size: 6}}
      : {x: names, y: s.y, name: s.name, mode: "lines+markers", ...errorBars(s)}), chart.title,
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
      el("p", {id: "notice"}), el("ul", {id: "verdict", hidden: ""}), el("div", {class: "charts", id: "group-charts"}),
      el("div", {id: "group-table"}));
  }
  setFact("notice", view.notice);
  replaceIfChanged(document.getElementById("verdict"), JSON.stringify(view.notes || []),
    (view.notes || []).map(line => el("li", {}, line)));
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
