// ScalingView front end: samples/s and speedup against worker count (with the ideal line), efficiency table.
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, parent = null) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function fmt(v, digits = 2) {
  return v === null || v === undefined || !isFinite(v) ? "–" : Number(v).toFixed(digits);
}

const PREDICTED = { allreduce: "#1a7f37", parameter_server: "#bc4c00" };

// Chart of workers -> value, with an optional dashed ideal line (workers -> ideal(workers)) and
// dashed predicted curves ([{strategy, points: [{workers, value}]}]); log2 worker axis when predicting.
function chart(label, counts, rows, key, ideal, predicted = []) {
  const W = 300, H = 180, L = 46, R = 10, T = 20, B = 28;
  const svg = el("svg", { width: W, height: H, class: "wb-chart", "data-chart": key });
  el("text", { x: L, y: 13 }, svg).textContent = label;
  const xs = counts.length ? counts : rows.map((r) => r.workers);
  if (!xs.length) return svg;
  const at = predicted.length ? Math.log2 : (n) => n;
  const x0 = at(Math.min(...xs)), x1 = at(Math.max(...xs));
  const ys = rows.map((r) => r[key]).filter((v) => isFinite(v));
  if (ideal) xs.forEach((n) => ys.push(ideal(n)));
  predicted.forEach((p) => p.points.forEach((q) => isFinite(q.value) && ys.push(q.value)));
  const y1 = Math.max(1e-12, ...ys) * 1.1;
  const sx = (x) => L + (x1 === x0 ? 0.5 : (at(x) - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - y / y1) * (H - T - B);
  el("line", { class: "wb-axis", x1: L, y1: H - B, x2: W - R, y2: H - B }, svg);
  el("line", { class: "wb-axis", x1: L, y1: T, x2: L, y2: H - B }, svg);
  el("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, svg).textContent = fmt(y1, y1 >= 100 ? 0 : 1);
  el("text", { x: L - 4, y: H - B, "text-anchor": "end" }, svg).textContent = "0";
  for (const n of xs) el("text", { x: sx(n), y: H - B + 12, "text-anchor": "middle" }, svg).textContent = n;
  el("text", { x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle" }, svg).textContent = "workers";
  if (ideal) {
    const d = [...xs].sort((a, b) => a - b).map((n, i) => `${i ? "L" : "M"} ${sx(n)} ${sy(ideal(n))}`).join(" ");
    el("path", { d, class: "wb-line", stroke: "#8c959f", "stroke-dasharray": "5 4" }, svg);
  }
  for (const p of predicted) {
    const pts = p.points.filter((q) => isFinite(q.value));
    if (!pts.length) continue;
    const d = pts.map((q, i) => `${i ? "L" : "M"} ${sx(q.workers)} ${sy(q.value)}`).join(" ");
    el("path", { d, class: "wb-line wb-predicted", fill: "none", stroke: PREDICTED[p.strategy] || "#8250df", "stroke-dasharray": "5 4",
                 "data-strategy": p.strategy }, svg);
  }
  const pts = rows.filter((r) => isFinite(r[key]));
  if (pts.length) {
    const d = pts.map((r, i) => `${i ? "L" : "M"} ${sx(r.workers)} ${sy(r[key])}`).join(" ");
    el("path", { d, class: "wb-line", stroke: "#0969da" }, svg);
    for (const r of pts) el("circle", { cx: sx(r.workers), cy: sy(r[key]), r: 3.5, fill: "#0969da", class: "wb-point" }, svg);
  }
  return svg;
}

// The predicted rows as one curve per strategy of ``key``.
function curves(predicted, key) {
  const strategies = [...new Set(predicted.map((r) => r.strategy))];
  return strategies.map((strategy) => ({
    strategy,
    points: predicted.filter((r) => r.strategy === strategy).map((r) => ({ workers: r.workers, value: r[key] })),
  }));
}

function render({ model, el: root }) {
  root.classList.add("wb-view", "wb-scaling");
  const title = document.createElement("div");
  title.className = "wb-title";
  const row = document.createElement("div");
  row.className = "wb-row";
  root.append(title, row);

  const notes = document.createElement("div");
  notes.className = "wb-notes";
  root.append(notes);

  function cells(tr, values, color) {
    for (const c of values) {
      const td = document.createElement("td");
      td.textContent = c;
      if (color) td.style.color = color;
      tr.appendChild(td);
    }
  }

  function draw() {
    const s = model.get("state") || {};
    const rows = s.rows || [], planned = s.planned || [], predicted = s.predicted || [];
    title.textContent = `scaling study · ${s.status || "waiting"} · ${rows.length} of ${planned.length || rows.length} worker counts`;
    const counts = [...new Set([...planned, ...rows.map((r) => r.workers)])].sort((a, b) => a - b);
    const every = [...new Set([...counts, ...predicted.map((r) => r.workers)])].sort((a, b) => a - b);
    const base = counts.length ? counts[0] : 1;
    const baseRate = rows.length && rows[0].workers === base ? rows[0].samples_per_s : null;
    const table = document.createElement("table");
    table.className = "wb-table";
    table.innerHTML = "<tr><th>workers</th><th>samples/s</th><th>speedup</th><th>ideal</th><th>efficiency</th></tr>";
    for (const n of counts) {
      const r = rows.find((x) => x.workers === n);
      const tr = document.createElement("tr");
      cells(tr, r ? [n, fmt(r.samples_per_s, 0), `${fmt(r.speedup)}×`, `${fmt(n / base)}×`, `${Math.round(100 * r.efficiency)}%`]
                  : [n, "…", "…", `${fmt(n / base)}×`, "…"]);
      table.appendChild(tr);
    }
    for (const r of predicted.filter((x) => !counts.includes(x.workers))) {
      const tr = document.createElement("tr");
      tr.className = "wb-predicted";
      cells(tr, [`${r.workers} ${r.strategy}`, fmt(r.samples_per_s, 0), `${fmt(r.speedup)}×`, `${fmt(r.workers / base)}×`,
                 `${Math.round(100 * r.efficiency)}%`], PREDICTED[r.strategy]);
      table.appendChild(tr);
    }
    const rateIdeal = baseRate ? (n) => (baseRate * n) / base : null;
    row.replaceChildren(
      predicted.length  // the efficiency chart shows the ideal
        ? chart("samples/s (dashed: predicted)", every, rows, "samples_per_s", null, curves(predicted, "samples_per_s"))
        : chart("samples/s (dashed: ideal)", counts, rows, "samples_per_s", rateIdeal),
      predicted.length
        ? chart("efficiency (dashed: ideal, predicted)", every, rows, "efficiency", () => 1, curves(predicted, "efficiency"))
        : chart("speedup (dashed: ideal)", counts, rows, "speedup", (n) => n / base),
      table,
    );
    const strategies = [...new Set(predicted.map((r) => r.strategy))];
    const names = { allreduce: "green", parameter_server: "orange" };
    const lines = strategies.length ? [`predicted, dashed: ${strategies.map((x) => `${x} (${names[x] || "purple"})`).join(", ")}`] : [];
    notes.replaceChildren(...[...lines, ...(s.assumptions || []).map((a) => `assumes ${a}`)].map((text) => {
      const p = document.createElement("div");
      p.textContent = text;
      return p;
    }));
  }

  draw();
  model.on("change:state", draw);
}

export default { render };
