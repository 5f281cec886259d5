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

// Chart of workers -> value, with an optional dashed ideal line (workers -> ideal(workers)).
function chart(label, counts, rows, key, ideal) {
  const W = 300, H = 180, L = 46, R = 10, T = 20, B = 28;
  const svg = el("svg", { width: W, height: H, class: "wb-chart", "data-chart": key });
  el("text", { x: L, y: 13 }, svg).textContent = label;
  const xs = counts.length ? counts : rows.map((r) => r.workers);
  if (!xs.length) return svg;
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const ys = rows.map((r) => r[key]).filter((v) => isFinite(v));
  if (ideal) xs.forEach((n) => ys.push(ideal(n)));
  const y1 = Math.max(1e-12, ...ys) * 1.1;
  const sx = (x) => L + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - L - R);
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
  const pts = rows.filter((r) => isFinite(r[key]));
  if (pts.length) {
    const d = pts.map((r, i) => `${i ? "L" : "M"} ${sx(r.workers)} ${sy(r[key])}`).join(" ");
    el("path", { d, class: "wb-line", stroke: "#0969da" }, svg);
    for (const r of pts) el("circle", { cx: sx(r.workers), cy: sy(r[key]), r: 3.5, fill: "#0969da", class: "wb-point" }, svg);
  }
  return svg;
}

function render({ model, el: root }) {
  root.classList.add("wb-view", "wb-scaling");
  const title = document.createElement("div");
  title.className = "wb-title";
  const row = document.createElement("div");
  row.className = "wb-row";
  root.append(title, row);

  function draw() {
    const s = model.get("state") || {};
    const rows = s.rows || [], planned = s.planned || [];
    title.textContent = `scaling study · ${s.status || "waiting"} · ${rows.length} of ${planned.length || rows.length} worker counts`;
    const counts = [...new Set([...planned, ...rows.map((r) => r.workers)])].sort((a, b) => a - b);
    const base = counts.length ? counts[0] : 1;
    const baseRate = rows.length && rows[0].workers === base ? rows[0].samples_per_s : null;
    const table = document.createElement("table");
    table.className = "wb-table";
    table.innerHTML = "<tr><th>workers</th><th>samples/s</th><th>speedup</th><th>ideal</th><th>efficiency</th></tr>";
    for (const n of counts) {
      const r = rows.find((x) => x.workers === n);
      const tr = document.createElement("tr");
      const cells = r ? [n, fmt(r.samples_per_s, 0), `${fmt(r.speedup)}×`, `${fmt(n / base)}×`, `${Math.round(100 * r.efficiency)}%`]
                      : [n, "…", "…", `${fmt(n / base)}×`, "…"];
      for (const c of cells) {
        const td = document.createElement("td");
        td.textContent = c;
        tr.appendChild(td);
      }
      table.appendChild(tr);
    }
    row.replaceChildren(
      chart("samples/s (dashed: ideal)", counts, rows, "samples_per_s", baseRate ? (n) => (baseRate * n) / base : null),
      chart("speedup (dashed: ideal)", counts, rows, "speedup", (n) => n / base),
      table,
    );
  }

  draw();
  model.on("change:state", draw);
}

export default { render };
