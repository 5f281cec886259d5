// ClusterView front end: workers with threads, memory and GPUs, totals, and the dashboard link.
function bytes(n) {
  if (!n) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(n >= 10 ? 0 : 1)} ${units[i]}`;
}

function render({ model, el: root }) {
  root.classList.add("wb-view", "wb-cluster");
  function draw() {
    const info = model.get("info");
    const message = model.get("message");
    root.replaceChildren();
    const title = document.createElement("div");
    title.className = "wb-title";
    root.appendChild(title);
    if (!info) {
      title.textContent = message || "no default cluster";
      return;
    }
    if (info.closed) {
      title.textContent = `Dask cluster ${info.scheduler} · ${typeof info.closed === "string" ? info.closed : "closed"}`;
      root.dataset.closed = "true";
      if (message) {
        const m = document.createElement("div");
        m.className = "wb-muted";
        m.textContent = message;
        root.appendChild(m);
      }
      return;
    }
    const ws = info.workers || [];
    const sum = (k) => ws.reduce((a, w) => a + (w[k] || 0), 0);
    title.textContent = `Dask cluster ${info.scheduler} · ${ws.length} workers · ${sum("threads")} threads · ` +
      `${bytes(sum("memory"))}` + (sum("gpus") ? ` · ${sum("gpus")} GPUs` : "");
    if (message) {
      const m = document.createElement("div");
      m.className = "wb-muted";
      m.textContent = message;
      root.appendChild(m);
    }
    if (info.dashboard) {
      const a = document.createElement("a");
      a.href = info.dashboard;
      a.target = "_blank";
      a.rel = "noopener";
      a.textContent = `dashboard: ${info.dashboard}`;
      a.style.color = "var(--wb-accent)";
      root.appendChild(a);
    }
    if (info.workbench_page) {
      const a = document.createElement("a");
      a.href = info.workbench_page;
      a.target = "_blank";
      a.rel = "noopener";
      a.className = "wb-workbench-page";
      a.textContent = "training page";
      a.style.color = "var(--wb-accent)";
      a.style.marginLeft = "12px";
      root.appendChild(a);
    }
    if (info.dashboard_note) {
      const n = document.createElement("div");
      n.className = "wb-muted wb-dashboard-note";
      n.textContent = info.dashboard_note;
      root.appendChild(n);
    }
    const table = document.createElement("table");
    table.className = "wb-table";
    table.innerHTML = "<tr><th>worker</th><th>address</th><th>threads</th><th>memory</th><th>GPUs</th></tr>";
    for (const w of ws) {
      const tr = document.createElement("tr");
      for (const c of [w.name, w.address, w.threads, bytes(w.memory), w.gpus]) {
        const td = document.createElement("td");
        td.textContent = c;
        tr.appendChild(td);
      }
      table.appendChild(tr);
    }
    root.appendChild(table);
  }
  draw();
  model.on("change:info", draw);
  model.on("change:message", draw);
}

export default { render };
