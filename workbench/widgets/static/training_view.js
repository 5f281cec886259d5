// TrainingView front end: progress bar with ETA, one small chart per curve, worker utilization.
// Synced state: title, state (see TrainingModel.snapshot in training_view.py).
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#bf3989"];

function el(tag, attrs = {}, parent = null) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function fmt(v) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e4) return new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 }).format(v);
  if (a !== 0 && a < 1e-3) return v.toExponential(2);
  return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(3) : v.toFixed(4);
}

function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

// Exponential moving average, debiased as TensorBoard does (the first points are not pulled to 0).
function smooth(points, weight) {
  if (!(weight > 0)) return points;
  let avg = 0, n = 0;
  return points.map(([x, y]) => {
    avg = avg * weight + (1 - weight) * y;
    n += 1;
    return [x, avg / (1 - Math.pow(weight, n))];
  });
}

// A line chart of [[x, y], ...] points, 260 x 130 px, with min/max labels; the raw curve faint
// behind its smoothed one; a log10 y axis when asked and every value is positive. ``val``: the
// validation curve drawn over it (dashed, with points and a legend); ``pick(step)``: called with
// the step nearest a click; ``selected``: the step marked by a vertical line.
function chart(label, points, color, steps, { log = false, smoothing = 0, val = null, pick = null, selected = 0 } = {}) {
  const W = 260, H = 130, L = 44, R = 8, T = 18, B = 18;
  const svg = el("svg", { width: W, height: H, class: "wb-chart", "data-curve": label });
  const t = el("text", { x: L, y: 12 }, svg);
  const last = points.length ? points[points.length - 1][1] : null;
  t.textContent = `${label}: ${fmt(last)}`;
  const vals = val || [];
  if (vals.length) t.textContent += ` · val ${fmt(vals[vals.length - 1][1])}`;
  if (!points.length) return svg;
  const all = points.concat(vals);
  const logY = log && all.every((p) => p[1] > 0);
  svg.setAttribute("data-scale", logY ? "log" : "linear");
  const f = logY ? Math.log10 : (y) => y;
  const xs = all.map((p) => p[0]), ys = all.map((p) => f(p[1]));
  const x0 = Math.min(...xs), x1 = Math.max(steps || 0, ...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = (x) => L + ((x - x0) / Math.max(x1 - x0, 1e-12)) * (W - L - R);
  const sy = (y) => T + (1 - (f(y) - y0) / (y1 - y0)) * (H - T - B);
  const shown = (v) => fmt(logY ? Math.pow(10, v) : v);
  el("line", { class: "wb-axis", x1: L, y1: H - B, x2: W - R, y2: H - B }, svg);
  el("line", { class: "wb-axis", x1: L, y1: T, x2: L, y2: H - B }, svg);
  el("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, svg).textContent = shown(y1);
  el("text", { x: L - 4, y: H - B, "text-anchor": "end" }, svg).textContent = shown(y0);
  el("text", { x: L, y: H - 4 }, svg).textContent = logY ? "log scale" : "";
  el("text", { x: W - R, y: H - 4, "text-anchor": "end" }, svg).textContent = `step ${Math.round(x1)}`;
  const path = (pts) => pts.map((p, i) => `${i ? "L" : "M"} ${sx(p[0]).toFixed(1)} ${sy(p[1]).toFixed(1)}`).join(" ");
  if (smoothing > 0 && points.length > 2) {
    el("path", { class: "wb-line wb-raw", d: path(points), stroke: color }, svg);
    el("path", { class: "wb-line wb-smooth", d: path(smooth(points, smoothing)), stroke: color }, svg);
  } else {
    el("path", { class: "wb-line", d: path(points), stroke: color }, svg);
  }
  if (vals.length) {
    const vc = "#bc4c00";
    el("path", { class: "wb-line wb-val", d: path(vals), stroke: vc, "stroke-dasharray": "4 2" }, svg);
    for (const [x, y] of vals) el("circle", { class: "wb-val-point", cx: sx(x), cy: sy(y), r: 2.2, fill: vc }, svg);
    const legend = el("g", { class: "wb-chart-legend" }, svg);
    el("rect", { x: W - R - 74, y: T - 2, width: 72, height: 24, rx: 3, class: "wb-legend-box" }, legend);
    [["train", color, ""], ["validation", vc, "4 2"]].forEach(([name, c, dash], i) => {
      const y = T + 6 + i * 11, x = W - R - 70;
      el("line", { x1: x, y1: y - 3, x2: x + 14, y2: y - 3, stroke: c, "stroke-width": 2, "stroke-dasharray": dash }, legend);
      el("text", { x: x + 18, y, class: "wb-legend-item" }, legend).textContent = name;
    });
  }
  if (selected) {
    const x = sx(Math.min(Math.max(selected, x0), x1));
    el("line", { class: "wb-marker", x1: x, y1: T, x2: x, y2: H - B, "data-step": selected }, svg);
  }
  if (pick) {
    svg.classList.add("wb-pickable");
    svg.addEventListener("click", (e) => {
      const box = svg.getBoundingClientRect();
      const at = x0 + ((e.clientX - box.left) * (W / box.width) - L) / (W - L - R) * (x1 - x0);
      let best = points[0][0];
      for (const [x] of points) if (Math.abs(x - at) < Math.abs(best - at)) best = x;
      pick(best);
    });
  }
  return svg;
}

// The log-scale checkbox and the smoothing slider, bound to the synced traits of the same names.
function controls(model, redraw) {
  const row = document.createElement("div");
  row.className = "wb-controls";
  const logLabel = document.createElement("label");
  const logBox = document.createElement("input");
  logBox.type = "checkbox";
  logBox.className = "wb-log";
  logLabel.append(logBox, " log scale");
  const smoothLabel = document.createElement("label");
  const slider = document.createElement("input");
  Object.assign(slider, { type: "range", min: "0", max: "0.99", step: "0.01", className: "wb-smoothing" });
  const value = document.createElement("span");
  smoothLabel.append("smoothing ", slider, value);
  row.append(logLabel, smoothLabel);
  const show = () => {
    logBox.checked = !!model.get("log_scale");
    slider.value = String(model.get("smoothing") || 0);
    value.textContent = ` ${Number(model.get("smoothing") || 0).toFixed(2)}`;
  };
  logBox.addEventListener("change", () => { model.set("log_scale", logBox.checked); model.save_changes(); redraw(); });
  slider.addEventListener("input", () => { model.set("smoothing", Number(slider.value)); model.save_changes(); redraw(); });
  return { row, show };
}

function render({ model, el: root }) {
  root.classList.add("wb-view", "wb-training");
  const title = document.createElement("div");
  title.className = "wb-title";
  const bar = document.createElement("div");
  bar.className = "wb-progress";
  const fill = document.createElement("div");
  fill.className = "wb-bar";
  const text = document.createElement("div");
  text.className = "wb-progress-text";
  bar.append(fill, text);
  const charts = document.createElement("div");
  charts.className = "wb-row";
  charts.style.marginTop = "8px";
  const workers = document.createElement("div");
  workers.className = "wb-workers";
  const ctl = controls(model, () => draw());
  // Stop: the fit ends cleanly after its current step (TrainingView.request_stop in Python)
  const stop = document.createElement("button");
  stop.className = "wb-stop";
  stop.textContent = "Stop";
  stop.title = "end the fit after the current step, keeping that step's variables";
  stop.addEventListener("click", () => { stop.disabled = true; model.send({ event: "stop" }); });
  ctl.row.prepend(stop);
  root.append(title, bar, ctl.row, charts, workers);

  function draw() {
    const s = model.get("state") || {};
    const steps = s.steps || 0, step = s.step || 0;
    const frac = steps ? Math.min(step / steps, 1) : 0;
    title.textContent = `${model.get("title")} · ${s.outcome || s.status || "waiting"}` + (s.batch_size ? ` · batch ${s.batch_size}` : "");
    fill.style.width = `${(100 * frac).toFixed(1)}%`;
    bar.classList.toggle("wb-failed", s.status === "failed");
    bar.classList.toggle("wb-interrupted", s.status === "interrupted");
    bar.classList.toggle("wb-stopped", s.status === "stopped");
    stop.hidden = s.status !== "running";
    stop.disabled = !!s.stopping;
    let line = `step ${step} / ${steps} (${Math.round(100 * frac)}%) · ${duration(s.elapsed)} elapsed`;
    if (s.status === "running") line += ` · ETA ${duration(s.eta)}`;
    // The median over the run: one slow step (the first compiles its plan) does not move it.
    const rate = s.median_samples_per_s || s.samples_per_s || 0;
    line += ` · ${Math.round(rate).toLocaleString("en-US")} samples/s (median)`;
    if (s.replicas) line += ` · ${s.replicas} replicas`;
    if (s.dropped) line += ` · ${s.dropped} dropped`;
    if (s.restarts) line += ` · ${s.restarts} restarts`;
    if (s.start) line += ` · resumed at step ${s.start}`;
    if (s.status === "failed") line += ` · failed at ${s.error}`;
    text.textContent = line;
    bar.setAttribute("data-status", s.status || "");
    ctl.show();
    const pick = (step) => { model.set("selected_step", step); model.save_changes(); draw(); };
    const options = { log: !!model.get("log_scale"), smoothing: Number(model.get("smoothing") || 0),
                      pick, selected: model.get("selected_step") || 0 };
    const children = [], curves = s.curves || {};
    // The charts in their order with their colours, as the state lists them (a saved notebook's widget
    // state has its keys sorted); a validation curve (val_<label>) is drawn in its metric's chart.
    const shown = s.charts || Object.keys(curves)
      .filter((label) => !(label.startsWith("val_") && label.slice(4) in curves))
      .map((label, i) => ({ label, color: COLORS[i % COLORS.length], validation: `val_${label}` in curves ? `val_${label}` : null }));
    for (const { label, color, validation } of shown)
      children.push(chart(label, curves[label] || [], color, steps, { ...options, val: validation ? curves[validation] : null }));
    children.push(chart("samples/s", s.throughput || [], "#57606a", steps));
    charts.replaceChildren(...children);
    const util = Object.entries(s.workers || {});
    workers.replaceChildren();
    if (util.length) {
      const h = document.createElement("div");
      h.className = "wb-muted";
      h.textContent = "worker utilization (busy time / training time)";
      workers.appendChild(h);
      for (const [address, u] of util) {
        const row = document.createElement("div");
        row.className = "wb-worker";
        const b = document.createElement("span");
        b.className = "wb-wbar";
        const f = document.createElement("div");
        f.style.width = `${(100 * u).toFixed(0)}%`;
        b.appendChild(f);
        row.append(b, ` ${(100 * u).toFixed(0)}%  ${address}`);
        workers.appendChild(row);
      }
    }
  }

  draw();
  model.on("change:state", draw);
  model.on("change:title", draw);
  model.on("change:log_scale", draw);
  model.on("change:smoothing", draw);
  model.on("change:selected_step", draw);
}

export default { render };
