// TimelineView front end: one lane per worker, a bar per span coloured by phase, waits with an arrow
// to the worker waited for, a scroll back over the steps, hover details, a click selects a step.
// State (from widgets/timeline.py): workers, spans [lane, step, phase, start, end, waited lane or -1, bytes, part],
// steps [first, last], shown_steps, window, end_step (0: live), selected_step, stragglers, title, status.
const NS = "http://www.w3.org/2000/svg";
const COLORS = { compute: "#0969da", communicate: "#bf8700", wait: "#cf222e", update: "#1a7f37", idle: "#d0d7de" };
const PART_COLORS = { forward: "#0969da", backward: "#54aeff" };  // a compute span's parts
const LANE = 26, LABEL = 170, TOP = 8;

function el(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function div(className, text = "") {
  const d = document.createElement("div");
  d.className = className;
  d.textContent = text;
  return d;
}

function ms(seconds) {
  return seconds >= 1 ? `${seconds.toFixed(2)} s` : `${(seconds * 1000).toFixed(seconds < 0.01 ? 2 : 1)} ms`;
}

function clip(text, n) {
  return text.length <= n ? text : "…" + text.slice(text.length - n + 1);
}

function render({ model, el: root }) {
  root.classList.add("wb-view", "wb-timeline");
  const title = div("wb-title");
  const tools = div("wb-toolbar");
  const scroll = document.createElement("input");
  scroll.type = "range";
  scroll.min = "1";
  scroll.className = "wb-timeline-scroll";
  const at = document.createElement("span");
  at.className = "wb-muted wb-timeline-at";
  const live = document.createElement("button");
  live.className = "wb-button wb-timeline-live";
  live.textContent = "live";
  live.title = "follow the latest steps";
  tools.append("steps ", scroll, at, live);
  const canvas = div("wb-timeline-canvas");
  const svg = el("svg", { class: "wb-timeline-svg" });
  canvas.appendChild(svg);
  const hover = div("wb-timeline-hover wb-muted", "hover a span for its numbers; click it to select its step");
  const blame = div("wb-timeline-stragglers wb-muted");
  root.append(title, tools, canvas, hover, blame);

  scroll.addEventListener("input", () => {
    const last = (model.get("steps") || [0, 0])[1];
    const value = Number(scroll.value);
    model.set("end_step", value >= last ? 0 : value);
    model.save_changes();
  });
  live.addEventListener("click", () => { model.set("end_step", 0); model.save_changes(); });

  function describe(s, workers) {
    const [lane, step, phase, start, end, waited, bytes, part] = s;
    const what = part ? `${phase} (${part})` : phase;
    let text = `${workers[lane]} · step ${step} · ${what} ${ms(end - start)} (${start.toFixed(3)} – ${end.toFixed(3)} s)`;
    if (waited >= 0) text += ` · waiting for ${workers[waited]}`;
    if (bytes) text += ` · ${bytes.toLocaleString()} bytes`;
    return text;
  }

  function draw() {
    const workers = model.get("workers") || [], spans = model.get("spans") || [];
    const steps = model.get("steps") || [], shown = model.get("shown_steps") || [];
    const selected = model.get("selected_step") || 0, end = model.get("end_step") || 0;
    const status = model.get("status") || "";
    title.textContent = `${model.get("title")} · ${status} · ${workers.length} workers` +
      (shown.length ? ` · steps ${shown[0]}..${shown[1]}` : "");
    root.dataset.status = status;
    root.dataset.shown = shown.join("-");
    tools.style.display = steps.length ? "" : "none";
    if (steps.length) {
      scroll.min = String(steps[0]);
      scroll.max = String(steps[1]);
      scroll.value = String(end || steps[1]);
      at.textContent = end ? ` ${shown[0]}..${shown[1]} of ${steps[1]}` : ` latest (${steps[1]})`;
      live.disabled = !end;
    }
    const width = Math.max((canvas.clientWidth || 900) - 10, 400);
    const height = TOP + LANE * Math.max(workers.length, 1) + 24;
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.replaceChildren();
    const defs = el("defs", {}, svg);
    const marker = el("marker", { id: "wb-tl-arrow", markerWidth: 6, markerHeight: 6, refX: 5, refY: 3, orient: "auto" }, defs);
    el("path", { d: "M0,0 L6,3 L0,6 z", fill: COLORS.wait }, marker);
    if (!spans.length) {
      el("text", { x: 8, y: TOP + 16, class: "wb-muted" }, svg).textContent = "no spans yet: they come with each step";
      blame.textContent = "";
      return;
    }
    const lo = Math.min(...spans.map((s) => s[3])), hi = Math.max(...spans.map((s) => s[4]));
    const scale = (width - LABEL - 10) / Math.max(hi - lo, 1e-9);
    const x = (t) => LABEL + (t - lo) * scale;
    workers.forEach((w, i) => {
      const y = TOP + i * LANE;
      const t = el("text", { x: 4, y: y + LANE / 2 + 4 }, svg);
      t.textContent = clip(w, 26);
      el("title", {}, t).textContent = w;
      el("line", { x1: LABEL, x2: width - 10, y1: y + LANE - 2, y2: y + LANE - 2, stroke: "#d0d7de" }, svg);
    });
    const arrows = el("g", { class: "wb-timeline-arrows" }, svg);
    for (const s of spans) {
      const [lane, step, phase, start, stop, waited, , part] = s;
      const y = TOP + lane * LANE + 3;
      const rect = el("rect", {
        x: x(start).toFixed(2), y, width: Math.max((stop - start) * scale, 0.5).toFixed(2), height: LANE - 8,
        fill: PART_COLORS[part] || COLORS[phase] || "#8c959f",
        class: `wb-span wb-${phase}` + (part ? ` wb-${part}` : "") + (step === selected ? " wb-selected" : ""),
        "data-step": step, "data-phase": phase, "data-part": part || "", "data-worker": workers[lane],
      }, svg);
      el("title", {}, rect).textContent = describe(s, workers);
      rect.addEventListener("mouseenter", () => { hover.textContent = describe(s, workers); });
      rect.addEventListener("click", () => { model.set("selected_step", step); model.save_changes(); });
      if (waited >= 0 && waited !== lane) {
        el("line", {
          x1: x(stop).toFixed(2), y1: y + (LANE - 8) / 2, x2: x(stop).toFixed(2), y2: TOP + waited * LANE + LANE / 2,
          stroke: COLORS.wait, "stroke-width": 1, "marker-end": "url(#wb-tl-arrow)", class: "wb-wait-arrow",
        }, arrows);
      }
    }
    const axis = el("text", { x: width - 10, y: height - 6, "text-anchor": "end", class: "wb-muted" }, svg);
    axis.textContent = `${lo.toFixed(3)} – ${hi.toFixed(3)} s since the fit started`;
    let cursor = LABEL;
    const parts = new Set(spans.map((s) => s[7]).filter(Boolean));
    const legend = { ...COLORS, ...Object.fromEntries(Object.entries(PART_COLORS).filter(([p]) => parts.has(p))) };
    for (const [phase, color] of Object.entries(legend)) {
      el("rect", { x: cursor, y: height - 15, width: 10, height: 10, fill: color }, svg);
      el("text", { x: cursor + 13, y: height - 6, class: "wb-muted" }, svg).textContent = phase;
      cursor += 22 + 7 * phase.length;
    }
    const top = (model.get("stragglers") || []).filter((s) => s[1] > 0);
    blame.textContent = top.length
      ? "waited for most: " + top.map(([w, sec]) => `${w} (${ms(sec)} per step)`).join(", ")
      : "no worker held the others back in these steps";
  }
  for (const name of ["workers", "spans", "steps", "shown_steps", "selected_step", "end_step", "status", "stragglers"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

export default { render };
