// The live page: reads GET /admin/live every second and draws it with uPlot.
// Every chart is one value per whole second, x in seconds before now; null is a second with
// nothing to measure (a gap in the line). The admin token typed in the page is kept for the tab
// only (sessionStorage) and sent as a bearer token, as every /admin call needs.
"use strict";

const REFRESH_MS = 1000;
const CHART_HEIGHT = 170;
const COLORS = {
  mean: "#1f6feb", p99: "#8250df", sla: "#d1242f", served: "#1a7f37", violations: "#d1242f",
  refused: "#bc4c00", timeouts: "#6e4b00", gpu: "#0a8a8a", demanded: "#bc4c00", granted: "#1f6feb",
  used: "#1a7f37", node: "#57606a", queue: "#8250df", bad: "#d1242f", idle: "#57606a",
};
// What each tile counts: the "late", "refused" and "timed out" tiles add up the window shown.
const TILE_HELP = {
  late: "requests answered after their SLA, over the window shown",
  refused: "requests refused before running (queue full, or no device could meet the deadline), over the window shown",
  timeouts: "requests whose timeout passed (504), over the window shown",
};
const GPU_COLORS = ["#0a8a8a", "#8250df", "#bc4c00", "#1f6feb", "#1a7f37", "#d1242f", "#6e4b00", "#57606a"];

// The node's and the GPUs' charts, and each model's apart: a model may be named "node" or "gpus".
const state = { charts: {}, modelCharts: new Map(), models: [], gpus: [], last: null, draws: 0 };
window.gatewayLive = state;  // for whoever inspects the page (the tests do)

const $ = (selector, root = document) => root.querySelector(selector);
const token = $("#token");
token.value = sessionStorage.getItem("gateway-admin-token") || "";
token.addEventListener("change", () => sessionStorage.setItem("gateway-admin-token", token.value.trim()));

function headers(extra = {}) {
  const value = token.value.trim();
  return value ? { ...extra, Authorization: `Bearer ${value}` } : extra;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

function fmt(value, unit = "", digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const shown = Math.abs(value) >= 100 ? value.toFixed(0) : value.toFixed(digits);
  return unit ? `${shown} ${unit}` : shown;
}

function lastOf(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
  return null;
}

// One uPlot chart in `holder`: `lines` are {label, color, dash?, fill?, scale?}.
function chart(holder, title, yLabel, lines, options = {}) {
  const width = Math.max(240, holder.clientWidth || 400);
  const scales = { x: { time: false }, y: options.yRange ? { range: options.yRange } : { range: (u, min, max) => [0, Math.max(max, options.yMin || 1)] } };
  // Whole seconds on the time axis, however wide the chart.
  const axes = [{ label: "seconds ago", size: 34, labelSize: 14, incrs: [1, 2, 5, 10, 15, 30, 60, 120] },
    { label: yLabel, size: 48, labelSize: 14 }];
  if (options.y2) {
    scales.y2 = { range: (u, min, max) => [0, Math.max(max, 1)] };
    axes.push({ scale: "y2", side: 1, label: options.y2, size: 44, labelSize: 14, grid: { show: false } });
  }
  const series = [{ label: "s" }].concat(lines.map((line) => ({
    label: line.label, stroke: line.color, width: line.width || 1.5, dash: line.dash, spanGaps: line.spanGaps ?? false,
    fill: line.fill, scale: line.scale || "y", points: { show: false },
  })));
  const u = new uPlot({ title, width, height: CHART_HEIGHT, scales, axes, series, legend: { live: false } },
    [[], ...lines.map(() => [])], holder);
  u.holder = holder;
  // Follow the holder's width (the grid's columns change with the window and the scrollbar).
  new ResizeObserver(() => {
    const wanted = Math.max(240, holder.clientWidth);
    if (Math.abs(wanted - u.width) > 2) u.setSize({ width: wanted, height: CHART_HEIGHT });
  }).observe(holder);
  return u;
}

function bars(container, counts, caption) {
  container.replaceChildren();
  const entries = Object.entries(counts);
  const total = entries.reduce((sum, [, n]) => sum + n, 0);
  container.append(el("div", { class: "bars-caption" }, caption));
  if (!total) {
    container.append(el("div", { class: "muted" }, "no batches in this window"));
    return;
  }
  const most = Math.max(...entries.map(([, n]) => n));
  for (const [rows, n] of entries) {
    const bar = el("div", { class: "bar" });
    bar.style.width = `${(100 * n) / most}%`;
    container.append(el("div", { class: "bar-row", "data-rows": rows },
      el("span", { class: "bar-label" }, rows), el("span", { class: "bar-track" }, bar),
      el("span", { class: "bar-count" }, `${n} (${((100 * n) / total).toFixed(0)}%)`)));
  }
}

function tile(label, cls) {
  return el("div", { class: `tile ${cls}`, title: TILE_HELP[cls] || label }, el("div", { class: "tile-label" }, label), el("div", { class: "tile-value" }, "–"));
}

function setTile(root, cls, text, value) {
  const node = $(`.${cls}`, root);
  $(".tile-value", node).textContent = text;
  if (value !== undefined) node.dataset.value = value === null ? "" : String(value);
}

// -- the node and its GPUs -----------------------------------------------------------------
function buildNode(doc) {
  const panel = $("#node");
  panel.replaceChildren(el("h2", {}, "Node"), el("div", { class: "node-summary" }), el("div", { class: "chart node-cores" }));
  state.charts.node = {
    cores: chart($(".node-cores", panel), "Cores: in use and granted against the node's", "cores", [
      { label: "used", color: COLORS.used, fill: "rgba(26,127,55,0.12)", spanGaps: true },
      { label: "granted", color: COLORS.granted, spanGaps: true },
      { label: "node cores", color: COLORS.node, dash: [6, 4] },
    ], { yMin: doc.node.cpu_cores * 1.1 }),
  };
  const gpus = $("#gpus");
  gpus.hidden = doc.gpus.length === 0;
  if (!doc.gpus.length) return;
  gpus.replaceChildren(el("h2", {}, "GPUs"), el("div", { class: "advice" }),
    el("div", { class: "chart-grid" }, el("div", { class: "chart gpu-busy" }), el("div", { class: "chart gpu-signals" })),
    el("div", { class: "gpu-batches" }));
  state.charts.gpus = {
    busy: chart($(".gpu-busy", gpus), "Busy fraction per GPU", "busy", doc.gpus.map((g, i) => ({ label: g.id, color: GPU_COLORS[i % GPU_COLORS.length] })), { yRange: [0, 1] }),
    signals: chart($(".gpu-signals", gpus), "Symphony's signals (per control period)", "share", [
      { label: "bad rate", color: COLORS.bad, spanGaps: true },
      { label: "idle fraction", color: COLORS.idle, spanGaps: true },
    ], { yRange: [0, 1] }),
  };
}

function drawNode(doc) {
  const node = doc.node;
  const used = lastOf(node.used_cores);
  const granted = lastOf(node.granted_cores);
  $("#node .node-summary").textContent = node.controlled
    ? `${fmt(used, "cores", 2)} in use, ${fmt(granted, "granted", 2)} of ${node.cpu_cores} · policy ${node.policy}, period ${node.period_s ?? doc.period_s} s`
    : `cores are controlled on the workers (this gateway dispatches to them) · node cores ${node.cpu_cores}`;
  state.charts.node.cores.setData([doc.t, node.used_cores, node.granted_cores, doc.t.map(() => node.cpu_cores)]);
  if (!doc.gpus.length) return;
  const charts = state.charts.gpus;
  charts.busy.setData([doc.t, ...doc.gpus.map((g) => g.busy)]);
  const holder = $("#gpus .gpu-batches");
  holder.replaceChildren();
  for (const gpu of doc.gpus) {
    const box = el("div", { class: "bars" });
    bars(box, gpu.batch_sizes, `${gpu.id}: batch sizes`);
    holder.append(box);
  }
  const scaling = doc.scaling;
  if (scaling) {
    charts.signals.setData([doc.t, scaling.bad_rate_series, scaling.idle_fraction_series]);
    const add = scaling.gpus_to_add === null ? "∞ (nothing met its SLO)" : fmt(scaling.gpus_to_add, "", 2);
    $("#gpus .advice").replaceChildren(
      el("span", { class: "advice-title" }, "Symphony's advice (last 10 s): "),
      el("span", { class: "advice-add", "data-value": String(scaling.gpus_to_add) }, `add ${add} GPUs`), " · ",
      el("span", { class: "advice-release", "data-value": String(scaling.gpus_to_release) }, `release ${fmt(scaling.gpus_to_release, "", 2)} GPUs`), " · ",
      `bad rate ${fmt(100 * scaling.bad_rate, "%")} · idle ${fmt(100 * scaling.idle_fraction, "%")} of ${scaling.gpus} GPU(s)`);
  }
}

// -- models --------------------------------------------------------------------------------
function buildModel(model, doc) {
  const hasGpus = doc.gpus.length > 0;
  const card = el("section", { class: "model panel", "data-model": model.name });
  const form = el("form", { class: "sla-form" },
    el("label", {}, "SLA ", el("input", { type: "number", name: "sla_ms", min: "0.001", step: "any", required: true, value: model.sla_ms })),
    " ms ", el("button", { type: "submit" }, "Set SLA"), el("span", { class: "sla-result" }));
  form.addEventListener("submit", (event) => { event.preventDefault(); setSla(model.name, form); });
  card.append(
    el("div", { class: "model-head" }, el("h2", {}, model.name), form),
    el("div", { class: "tiles" }, tile("SLA", "sla"), tile("mean RT (last s)", "rt-mean"), tile("p99 RT (last s)", "rt-p99"),
      tile("req/s (last s)", "rps"), tile("late", "late"), tile("refused", "refused"),
      tile("timed out", "timeouts"), tile("queue now", "queue"), tile("cores now", "cores"), tile("served CPU · GPU", "share")),
    el("div", { class: "chart-grid" },
      el("div", { class: "chart chart-rt" }), el("div", { class: "chart chart-load" }),
      el("div", { class: "chart chart-cores" }), el("div", { class: "chart chart-queue" })),
    el("div", { class: "bars batch-sizes" }));
  $("#models").append(card);
  const charts = {
    rt: chart($(".chart-rt", card), "Response time per second against the SLA", "ms", [
      { label: "mean", color: COLORS.mean, width: 2 },
      { label: "p99", color: COLORS.p99 },
      { label: "SLA", color: COLORS.sla, dash: [8, 5], width: 2, spanGaps: true },
    ]),
    load: chart($(".chart-load", card), "Requests per second", "req/s", [
      { label: "served", color: COLORS.served, fill: "rgba(26,127,55,0.10)" },
      { label: "violations", color: COLORS.violations },
      { label: "refused", color: COLORS.refused },
      { label: "timeouts", color: COLORS.timeouts, dash: [3, 3] },
      ...(hasGpus ? [{ label: "on GPU", color: COLORS.gpu }] : []),
    ]),
    queue: chart($(".chart-queue", card), "Queue length (longest in each second)", "requests", [
      { label: "queue", color: COLORS.queue, fill: "rgba(130,80,223,0.10)" },
    ]),
  };
  if (model.cpu_executor && doc.node.controlled) {
    charts.cores = chart($(".chart-cores", card), "Cores per control period", "cores", [
      { label: "demanded", color: COLORS.demanded, spanGaps: true },
      { label: "granted", color: COLORS.granted, width: 2, spanGaps: true },
      { label: "used", color: COLORS.used, spanGaps: true },
    ]);
  } else {
    $(".chart-cores", card).append(el("div", { class: "muted note" }, model.cpu_executor
      ? "cores are controlled on the workers" : "served on the GPUs only: no CPU cores to control"));
  }
  state.modelCharts.set(model.name, charts);
}

function drawModel(model, doc) {
  const card = $(`section.model[data-model="${CSS.escape(model.name)}"]`);
  const s = model.series;
  const charts = state.modelCharts.get(model.name);
  const mean = lastOf(s.mean_rt_ms);
  const p99 = lastOf(s.p99_rt_ms);
  const shown = mean ?? model.mean_rt_ms;
  setTile(card, "sla", fmt(model.sla_ms, "ms"), model.sla_ms);
  setTile(card, "rt-mean", fmt(shown, "ms", 2), shown);
  $(".rt-mean", card).classList.toggle("over", shown !== null && shown > model.sla_ms);
  setTile(card, "rt-p99", fmt(p99 ?? model.p99_rt_ms, "ms", 2), p99 ?? model.p99_rt_ms);
  const n = s.requests.length;
  setTile(card, "rps", fmt(n ? s.requests[n - 1] : 0, "", 0));
  const sum = (values) => values.reduce((a, b) => a + (b || 0), 0);
  setTile(card, "late", String(sum(s.violations)), sum(s.violations));
  setTile(card, "refused", String(sum(s.refused)), sum(s.refused));
  setTile(card, "timeouts", String(sum(s.timeouts)), sum(s.timeouts));
  setTile(card, "queue", String(model.queue_length), model.queue_length);
  setTile(card, "cores", model.cpu_executor ? fmt(model.cores, "", 2) : "GPU only");
  const cpu = sum(s.on_cpu), gpu = sum(s.on_gpu);
  setTile(card, "share", cpu + gpu ? `${((100 * cpu) / (cpu + gpu)).toFixed(0)}% · ${((100 * gpu) / (cpu + gpu)).toFixed(0)}%` : "–");

  charts.rt.setData([doc.t, s.mean_rt_ms, s.p99_rt_ms, s.sla_ms]);
  const load = [doc.t, s.requests, s.violations, s.refused, s.timeouts];
  if (doc.gpus.length) load.push(s.on_gpu);
  charts.load.setData(load);
  charts.queue.setData([doc.t, s.queue_length]);
  if (charts.cores) charts.cores.setData([doc.t, s.demanded_cores, s.granted_cores, s.used_cores]);
  bars($(".batch-sizes", card), model.batch_sizes, `Batch sizes, last ${doc.seconds} s (rows: batches)`);
  card.dataset.drawn = "true";
  card.dataset.slaMs = String(model.sla_ms);
}

async function setSla(name, form) {
  const result = $(".sla-result", form);
  const value = Number(form.elements.sla_ms.value);
  result.textContent = "…";
  result.className = "sla-result";
  try {
    const response = await fetch(`/admin/models/${encodeURIComponent(name)}/sla`, {
      method: "PUT", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify({ sla_ms: value }),
    });
    const body = await response.json();
    if (response.ok) {
      result.textContent = `SLA set to ${body.sla_ms} ms`;
      result.classList.add("ok");
    } else {
      result.textContent = `${response.status}: ${body.error}`;
      result.classList.add("error");
    }
  } catch (error) {
    result.textContent = `not sent: ${error}`;
    result.classList.add("error");
  }
}

// -- the refresh loop ----------------------------------------------------------------------
function layoutChanged(doc) {
  const names = doc.models.map((m) => m.name).join("\n");
  const gpus = doc.gpus.map((g) => g.id).join("\n");
  return names !== state.models.join("\n") || gpus !== state.gpus.join("\n");
}

function draw(doc) {
  if (layoutChanged(doc)) {
    for (const group of [...Object.values(state.charts), ...state.modelCharts.values()]) {
      for (const u of Object.values(group)) if (u && u.destroy) u.destroy();
    }
    state.charts = {};
    state.modelCharts = new Map();
    $("#models").replaceChildren();
    doc.node.period_s = doc.period_s;
    buildNode(doc);
    for (const model of doc.models) buildModel(model, doc);
    state.models = doc.models.map((m) => m.name);
    state.gpus = doc.gpus.map((g) => g.id);
  }
  doc.node.period_s = doc.period_s;
  drawNode(doc);
  for (const model of doc.models) drawModel(model, doc);
  state.last = doc;
  state.draws += 1;
  document.body.dataset.draws = String(state.draws);
}

async function refresh() {
  const status = $("#status");
  try {
    const response = await fetch(`/admin/live?seconds=${$("#window").value}`, { headers: headers(), cache: "no-store" });
    const body = await response.json();
    if (response.status === 401) {
      status.textContent = "the admin API needs its token: type it above";
      status.className = "status error";
    } else if (!response.ok) {
      status.textContent = `${response.status}: ${body.error}`;
      status.className = "status error";
    } else {
      draw(body);
      status.textContent = `updated ${new Date().toLocaleTimeString()}`;
      status.className = "status ok";
    }
  } catch (error) {
    status.textContent = `gateway unreachable: ${error}`;
    status.className = "status error";
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();
