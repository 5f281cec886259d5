// ComparisonView front end: the metric against time per run, and the k-th gradient arrival medians.
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
  return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(3) : v.toFixed(4);
}

// A chart of series [{label, color, points: [[x, y], ...]}] with an x-axis label.
function chart(title, series, xLabel, zero) {
  const W = 340, H = 200, L = 46, R = 10, T = 20, B = 28;
  const svg = el("svg", { width: W, height: H, class: "wb-chart", "data-chart": title });
  el("text", { x: L, y: 13 }, svg).textContent = title;
  const pts = series.flatMap((s) => s.points).filter((p) => isFinite(p[1]));
  if (!pts.length) return svg;
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = zero ? 0 : Math.min(...ys), y1 = Math.max(...ys) * (zero ? 1.1 : 1);
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = (x) => L + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  el("line", { class: "wb-axis", x1: L, y1: H - B, x2: W - R, y2: H - B }, svg);
  el("line", { class: "wb-axis", x1: L, y1: T, x2: L, y2: H - B }, svg);
  el("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, svg).textContent = fmt(y1);
  el("text", { x: L - 4, y: H - B, "text-anchor": "end" }, svg).textContent = fmt(y0);
  el("text", { x: W - R, y: H - 4, "text-anchor": "end" }, svg).textContent = `${xLabel} ${fmt(x1)}`;
  for (const s of series) {
    const p = s.points.filter((q) => isFinite(q[1]));
    if (!p.length) continue;
    const d = p.map((q, i) => `${i ? "L" : "M"} ${sx(q[0])} ${sy(q[1])}`).join(" ");
    el("path", { d, class: "wb-line", fill: "none", stroke: s.color, "data-run": s.label }, svg);
    if (s.mark) el("circle", { cx: sx(s.mark[0]), cy: sy(s.mark[1]), r: 3.5, fill: s.color, class: "wb-point" }, svg);
  }
  return svg;
}

function render({ model, el: root }) {
  root.classList.add("wb-view", "wb-comparison");
  const head = document.createElement("div");
  const row = document.createElement("div");
  row.style.display = "flex";
  row.style.gap = "12px";
  const legend = document.createElement("div");
  root.append(head, row, legend);

  function draw() {
    const s = model.get("state") || {};
    const runs = s.runs || [];
    const color = (i) => COLORS[i % COLORS.length];
    const unit = s.clock === "virtual" ? "virtual s" : "s";
    head.textContent = `strategy comparison · ${s.clock || ""} clock · ${s.status || ""}`;
    const curves = runs.map((r, i) => ({ label: r.label, color: color(i), points: r.points }));
    const arrivals = runs
      .map((r, i) => ({ label: r.label, color: color(i), points: r.kth, mark: r.needed && r.kth[r.needed - 1] }))
      .filter((r) => r.points.length);
    row.replaceChildren(chart(s.metric || "val_accuracy", curves, unit, false),
                        chart("k-th gradient arrival (median, s)", arrivals, "k", true));
    legend.replaceChildren(...runs.map((r, i) => {
      const span = document.createElement("span");
      span.style.marginRight = "16px";
      span.style.color = color(i);
      span.textContent = `■ ${r.label}: ${r.steps} steps, ${fmt(r.elapsed)} ${unit} (${r.status})`;
      return span;
    }));
  }

  draw();
  model.on("change:state", draw);
}

export default { render };
