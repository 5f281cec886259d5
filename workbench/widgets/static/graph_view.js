// GraphView front end: draws the layout computed in Python (workbench/widgets/layout.py) as SVG.
// Synced state: layout (nodes with x/y, edges, scope boxes), collapsed (scopes), states (node -> state),
// names (every op, for search), highlight (the op the search found), zoom and fit (to the view's width);
// the model's statistics: stat (which), step (0: the latest), stat_steps, stat_kinds, node_stats
// (visible node -> value) and stat_scale (lo, hi, log, signed, step, title), from graph_view.py.
const SVG = "http://www.w3.org/2000/svg";
const KIND_FILL = {
  placeholder: "#ddf4ff", variable: "#dafbe1", constant: "#eaeef2", update: "#fff1e5",
  group: "#f6f8fa", scope: "#fbefff", op: "#ffffff",
};
const KIND_STROKE = {
  placeholder: "#0969da", variable: "#1a7f37", constant: "#8c959f", update: "#bc4c00",
  group: "#6e7781", scope: "#8250df", op: "#57606a",
};
const STATE_COLOR = { waiting: "#afb8c1", running: "#bf8700", done: "#1a7f37", error: "#cf222e" };

function el(tag, attrs = {}, parent = null) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function shapeFor(node, g) {
  const { w, h } = node;
  const fill = KIND_FILL[node.kind] || "#fff";
  const stroke = KIND_STROKE[node.kind] || "#57606a";
  const common = { class: "wb-shape", fill, stroke, "stroke-width": 1.4 };
  if (node.kind === "placeholder") return el("rect", { ...common, width: w, height: h, rx: h / 2 }, g);
  if (node.kind === "constant") return el("rect", { ...common, width: w, height: h, rx: 4, "stroke-dasharray": "2 2" }, g);
  if (node.kind === "variable") return el("rect", { ...common, width: w, height: h, rx: 0, "stroke-width": 2 }, g);
  if (node.kind === "scope") {
    el("rect", { fill, stroke, width: w, height: h, rx: 6, x: 4, y: 4, opacity: 0.6 }, g);
    return el("rect", { ...common, width: w, height: h, rx: 6 }, g);
  }
  return el("rect", { ...common, width: w, height: h, rx: 6 }, g);
}

function subtitle(node) {
  if (node.kind === "scope" && node.control) return `${node.control} · ${node.members} ops · click to open`;
  if (node.kind === "scope") return `${node.members} ops · click to open`;
  return node.shape ? `${node.type} · ${node.shape}` : node.type;
}

function clip(text, n) {
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

function scopesOf(name) {
  const parts = name.split("/").slice(0, -1);
  return parts.map((_, i) => parts.slice(0, i + 1).join("/"));
}

// Names containing the text (case-insensitive), an exact match (whole name, then last part) first.
function search(names, text) {
  const needle = text.trim().toLowerCase();
  if (!needle) return [];
  const rank = (n) => (n.toLowerCase() === needle ? 0 : n.split("/").pop().toLowerCase() === needle ? 1 : 2);
  return names.filter((n) => n.toLowerCase().includes(needle)).sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : 1));
}

function button(label, title, onClick) {
  const b = document.createElement("button");
  b.className = "wb-button";
  b.textContent = label;
  b.title = title;
  b.addEventListener("click", onClick);
  return b;
}

// Fold/unfold all, zoom out/in, fit to width, and the search box.
function toolbar(model, zoomBy, fitWidth) {
  const bar = document.createElement("div");
  bar.className = "wb-toolbar";
  const setCollapsed = (list) => { model.set("collapsed", [...new Set(list)].sort()); model.save_changes(); };
  const allScopes = () => (model.get("names") || []).flatMap(scopesOf);
  const input = document.createElement("input");
  Object.assign(input, { type: "search", placeholder: "find an op…", className: "wb-search" });
  const found = document.createElement("span");
  found.className = "wb-muted wb-found";
  let matches = [], at = -1, last = "";
  input.addEventListener("keydown", (e) => {
    if (e.key !== "Enter") return;
    if (input.value !== last) { matches = search(model.get("names") || [], input.value); at = -1; last = input.value; }
    if (!matches.length) { found.textContent = input.value.trim() ? "no match" : ""; return; }
    at = (at + 1) % matches.length;
    const name = matches[at];
    const open = new Set(scopesOf(name));
    model.set("collapsed", (model.get("collapsed") || []).filter((s) => !open.has(s)));
    model.set("highlight", name);
    model.save_changes();
    found.textContent = `${at + 1} of ${matches.length}: ${name}`;
  });
  bar.append(
    button("fold all", "fold every name scope", () => setCollapsed(allScopes())),
    button("unfold all", "open every name scope", () => setCollapsed([])),
    button("−", "zoom out", () => zoomBy(1 / 1.25)),
    button("+", "zoom in", () => zoomBy(1.25)),
    button("fit width", "scale the drawing to the width of the view", fitWidth),
    input, found,
  );
  return bar;
}

// A statistic's fill: light to red with its size (log scale when asked); blue below 0, red above
// when the statistic has a sign; dark red for NaN or Inf.
function statColor(v, scale) {
  if (v === null || v === undefined || !isFinite(v)) return "#a40e26";
  const { lo = 0, hi = 0, log = false, signed = false } = scale || {};
  let t;
  if (signed) t = hi > 0 ? Math.abs(v) / hi : 0;
  else if (log) t = (Math.log10(Math.max(v, lo)) - Math.log10(lo)) / Math.max(Math.log10(hi) - Math.log10(lo), 1e-12);
  else t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
  t = Math.min(Math.max(t, 0), 1);
  const hue = signed && v < 0 ? 212 : 40 - 38 * t;
  return `hsl(${hue.toFixed(0)}, ${(70 + 20 * t).toFixed(0)}%, ${(95 - 50 * t).toFixed(0)}%)`;
}

function fmtStat(v) {
  if (v === null || v === undefined) return "–";
  if (!isFinite(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e4) ? v.toExponential(2) : v.toPrecision(3);
}

// The statistics bar: which statistic, the scrubber over the steps that have statistics, the scale.
function statsBar(model) {
  const bar = document.createElement("div");
  bar.className = "wb-toolbar wb-stats";
  const select = document.createElement("select");
  select.className = "wb-stat";
  const slider = document.createElement("input");
  Object.assign(slider, { type: "range", min: "0", step: "1", className: "wb-scrubber" });
  const at = document.createElement("span");
  at.className = "wb-stat-step";
  const scale = document.createElement("span");
  scale.className = "wb-muted wb-stat-scale";
  bar.append("colour by ", select, " step ", slider, at, scale);
  select.addEventListener("change", () => { model.set("stat", select.value); model.save_changes(); });
  slider.addEventListener("input", () => {
    const steps = model.get("stat_steps") || [];
    model.set("step", steps[Number(slider.value)] || 0);
    model.save_changes();
  });
  function show() {
    const steps = model.get("stat_steps") || [], kinds = model.get("stat_kinds") || [];
    const s = model.get("stat_scale") || {};
    bar.style.display = steps.length ? "" : "none";
    if ([...select.options].map((o) => o.value).join() !== ["", ...kinds].join()) {
      select.replaceChildren(...["", ...kinds].map((k) => {
        const o = document.createElement("option");
        o.value = k;
        o.textContent = k ? k.replace("_", " ") : "run state";
        return o;
      }));
    }
    select.value = model.get("stat") || "";
    const shown = s.step || steps[steps.length - 1] || 0;
    slider.max = String(Math.max(steps.length - 1, 0));
    slider.value = String(Math.max(steps.indexOf(shown), 0));
    at.textContent = ` ${shown} (${steps.length ? steps.indexOf(shown) + 1 : 0} of ${steps.length})`;
    at.setAttribute("data-step", shown);
    if (!s.title) { scale.replaceChildren(); return; }
    const swatch = (v) => {
      const b = document.createElement("span");
      b.className = "wb-swatch";
      b.style.background = statColor(v, s);
      return b;
    };
    scale.replaceChildren(` ${s.title}${s.log ? " (log scale)" : ""}: `, swatch(s.signed ? -s.hi : s.lo), ` ${fmtStat(s.signed ? -s.hi : s.lo)} … `,
                          swatch(s.hi), ` ${fmtStat(s.hi)}`);
  }
  return { bar, show };
}

function details(node, state, stat = null) {
  const div = document.createElement("div");
  const add = (label, value) => {
    const p = document.createElement("div");
    const b = document.createElement("b");
    b.textContent = label + ": ";
    p.appendChild(b);
    const c = document.createElement("code");
    c.textContent = value;
    p.appendChild(c);
    div.appendChild(p);
  };
  add("name", node.id);
  add("type", node.type);
  if (node.kind === "scope") add("ops", String(node.members));
  (node.outputs || []).forEach((o, i) => add(node.outputs.length > 1 ? `output ${i}` : "output", `${o.dtype} ${o.shape}`));
  if (node.inputs && node.inputs.length) add("inputs", node.inputs.join(", "));
  if (node.source) add("defined at", `line ${node.source.line}: ${node.source.code}`);
  if (state) add("state", state);
  if (stat && stat.value !== undefined) add(`${stat.title} at step ${stat.step}`, fmtStat(stat.value));
  return div;
}

function render({ model, el: root }) {
  root.classList.add("wb-view");
  const title = document.createElement("div");
  title.className = "wb-title";
  const legend = document.createElement("div");
  legend.className = "wb-legend";
  for (const [kind, label] of [["placeholder", "placeholder"], ["variable", "variable"], ["constant", "constant"],
                               ["op", "op"], ["scope", "folded scope"], ["update", "update"]]) {
    const s = document.createElement("span");
    s.style.setProperty("--c", KIND_FILL[kind]);
    s.textContent = label;
    legend.appendChild(s);
  }
  const wrap = document.createElement("div");
  wrap.className = "wb-graph";
  let svg = null;

  // The drawing's scale: with "fit", the largest (up to 1) that shows its whole width.
  function applyZoom() {
    const layout = model.get("layout") || {};
    if (!svg || !layout.width) return;
    let zoom = model.get("zoom") || 1;
    if (model.get("fit") && canvas.clientWidth > 0) {
      zoom = Math.max(0.01, Math.min(1, (canvas.clientWidth - 4) / layout.width));
      if (Math.abs(zoom - (model.get("zoom") || 1)) > 1e-3) { model.set("zoom", zoom); model.save_changes(); }
    }
    svg.setAttribute("width", Math.round(layout.width * zoom));
    svg.setAttribute("height", Math.round(layout.height * zoom));
    svg.setAttribute("data-zoom", zoom.toFixed(3));
  }
  const zoomBy = (factor) => {
    model.set("fit", false);  // first: a change of zoom while fitting would be fitted back
    model.set("zoom", Math.max(0.01, Math.min(4, (model.get("zoom") || 1) * factor)));
    model.save_changes();
    applyZoom();
  };
  const fitWidth = () => { model.set("fit", true); model.save_changes(); applyZoom(); };
  const tools = toolbar(model, zoomBy, fitWidth);
  const stats = statsBar(model);
  const canvas = document.createElement("div");
  canvas.className = "wb-canvas";
  const side = document.createElement("div");
  side.className = "wb-details";
  side.innerHTML = '<span class="wb-muted">Click a node for its dtype, shape and defining line; click a scope to open or fold it.</span>';
  wrap.append(canvas, side);
  root.append(title, tools, stats.bar, legend, wrap);
  let selected = null;
  const groups = new Map();

  function toggle(scope) {
    const folded = new Set(model.get("collapsed"));
    if (folded.has(scope)) folded.delete(scope); else folded.add(scope);
    model.set("collapsed", [...folded].sort());
    model.save_changes();
  }

  function paintStates() {
    const states = model.get("states") || {};
    for (const [id, g] of groups) {
      const state = states[id];
      const dot = g.querySelector(".wb-state");
      dot.setAttribute("fill", state ? STATE_COLOR[state] : "none");
      g.setAttribute("data-state", state || "");
      const shape = g.querySelector(".wb-shape");
      if (state === "error") shape.setAttribute("stroke", STATE_COLOR.error);
      else if (state === "running") shape.setAttribute("stroke", STATE_COLOR.running);
      else shape.setAttribute("stroke", KIND_STROKE[g.__node.kind] || "#57606a");
    }
    if (selected && groups.has(selected)) {
      const scale = model.get("stat_scale") || {};
      const stat = scale.title ? { ...scale, value: (model.get("node_stats") || {})[selected] } : null;
      side.replaceChildren(details(groups.get(selected).__node, states[selected], stat));
    }
  }

  // Fill each node by the statistic shown (its kind's colour when it has none).
  function paintStats() {
    const values = model.get("node_stats") || {}, scale = model.get("stat_scale") || {};
    for (const [id, g] of groups) {
      const shape = g.querySelector(".wb-shape");
      const has = Object.prototype.hasOwnProperty.call(values, id);
      const fill = has ? statColor(values[id], scale) : KIND_FILL[g.__node.kind] || "#fff";
      shape.setAttribute("fill", fill);
      const light = /, (\d+)%\)$/.exec(fill);  // white text on a dark fill
      g.classList.toggle("wb-dark", has && (!light || Number(light[1]) < 62));
      if (has) g.setAttribute("data-stat", String(values[id])); else g.removeAttribute("data-stat");
    }
    stats.show();
    paintStates();
  }

  function draw() {
    const layout = model.get("layout") || {};
    const nodes = layout.nodes || [];
    const byId = new Map(nodes.map((n) => [n.id, n]));
    title.textContent = `graph ${layout.name || ""} · ${nodes.length} nodes` +
      ((layout.collapsed || []).length ? ` · folded: ${layout.collapsed.join(", ")}` : "");
    svg = el("svg", { width: layout.width || 0, height: layout.height || 0, class: "wb-svg",
                      viewBox: `0 0 ${layout.width || 0} ${layout.height || 0}` });
    const defs = el("defs", {}, svg);
    const marker = el("marker", { id: "wb-arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
                                  markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" }, defs);
    el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8c959f" }, marker);
    for (const box of layout.boxes || []) {
      const g = el("g", { class: "wb-scope", "data-scope": box.scope }, svg);
      el("rect", { class: "wb-box", x: box.x, y: box.y, width: box.w, height: box.h, rx: 8 }, g);
      const t = el("text", { class: "wb-box-title", x: box.x + 6, y: box.y + 11 }, g);
      t.textContent = `▾ ${box.scope}`;
      t.addEventListener("click", () => toggle(box.scope));
      el("title", {}, t).textContent = "fold this scope";
    }
    for (const e of layout.edges || []) {
      const a = byId.get(e.source), b = byId.get(e.target);
      if (!a || !b) continue;
      const x1 = a.x + a.w / 2, y1 = a.y + a.h, x2 = b.x + b.w / 2, y2 = b.y;
      const dy = Math.max((y2 - y1) / 2, 20);
      // Edges into or out of a folded scope (mostly the backward pass) stay in the background.
      const faint = a.kind === "scope" || b.kind === "scope" ? " wb-faint" : "";
      el("path", { class: "wb-edge" + (e.control ? " wb-control" : "") + faint, "marker-end": "url(#wb-arrow)",
                   d: `M ${x1} ${y1} C ${x1} ${y1 + dy}, ${x2} ${y2 - dy}, ${x2} ${y2}` }, svg);
    }
    groups.clear();
    for (const n of nodes) {
      const g = el("g", { class: "wb-node", transform: `translate(${n.x},${n.y})`, "data-id": n.id, "data-kind": n.kind }, svg);
      g.__node = n;
      shapeFor(n, g);
      const name = el("text", { x: 8, y: 16 }, g);
      name.textContent = clip(n.label, 22);
      const sub = el("text", { x: 8, y: 31, class: "wb-sub" }, g);
      sub.textContent = clip(subtitle(n), 26);
      el("circle", { class: "wb-state", cx: n.w - 9, cy: 9, r: 5, fill: "none" }, g);
      const src = n.source ? `\nline ${n.source.line}: ${n.source.code}` : "";
      el("title", {}, g).textContent = `${n.id}\n${n.type} ${n.dtype || ""} ${n.shape || ""}${src}`;
      g.addEventListener("click", () => {
        if (n.kind === "scope") { toggle(n.id); return; }
        selected = n.id;
        for (const other of groups.values()) other.classList.toggle("wb-selected", other === g);
        paintStates();
      });
      if (n.id === selected) g.classList.add("wb-selected");
      groups.set(n.id, g);
    }
    canvas.replaceChildren(svg);
    applyZoom();
    paintStats();
    showHighlight();
  }

  // The node the search found: outlined, selected, and scrolled to the middle of the view.
  function showHighlight() {
    const name = model.get("highlight");
    for (const [id, g] of groups) g.classList.toggle("wb-highlight", id === name);
    const g = groups.get(name);
    if (!g) return;
    selected = name;
    for (const other of groups.values()) other.classList.toggle("wb-selected", other === g);
    paintStates();
    const n = g.__node, zoom = model.get("zoom") || 1;
    canvas.scrollLeft = Math.max(0, (n.x + n.w / 2) * zoom - canvas.clientWidth / 2);
    canvas.scrollTop = Math.max(0, (n.y + n.h / 2) * zoom - canvas.clientHeight / 2);
  }

  draw();
  model.on("change:layout", draw);
  model.on("change:states", paintStates);
  model.on("change:node_stats", paintStats);
  model.on("change:stat_scale", paintStats);
  model.on("change:stat_steps", stats.show);
  model.on("change:stat", stats.show);
  model.on("change:highlight", showHighlight);
  model.on("change:zoom", applyZoom);
  model.on("change:fit", applyZoom);
  if (typeof ResizeObserver !== "undefined") new ResizeObserver(() => applyZoom()).observe(canvas);
}

export default { render };
