// The admin dashboard: renders the panels from /dashboard/data/ and refetches them when an
// event on the `admin` topic says the numbers changed, at most once a second (a burst of events
// costs one fetch, and the last event of a burst is never dropped).
(function () {
  const REFRESH_MS = 1000;
  // Event kinds that change a panel; job.log and job.progress don't.
  const PREFIXES = ["allocation.", "reservation.", "vm.", "hypervisor.", "bladecenter.", "nodegroup.", "queue.", "image."];
  const KINDS = new Set(["job.status"]);
  const SERIES = [
    ["running", "ready / ending", "#16a34a"],
    ["starting", "placing / provisioning", "#2563eb"],
    ["booked", "booked (future)", "#d97706"],
  ];
  let hours = []; // the timeline's hours as Dates (the axis callback reads the latest)
  let root, chart = null, timer = null, busy = false, again = false, lastFetch = 0, refreshes = 0;

  const relevant = (kind) => KINDS.has(kind) || PREFIXES.some((p) => kind.startsWith(p));

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => {
      if (k === "class") node.className = v; else if (k === "style") node.style.cssText = v; else node.setAttribute(k, v);
    });
    children.forEach((c) => node.append(c));
    return node;
  }

  const num = (v) => (Math.round(v * 10) / 10).toLocaleString();
  const FORMAT = {
    vcpus: (v) => num(v),
    memory_mib: (v) => num(v / 1024),
    disk_gib: (v) => num(v),
  };
  const UNIT = { vcpus: "", memory_mib: " GiB", disk_gib: " GiB" };
  const pct = (ratio) => `${Math.round(ratio * 100)}%`;

  function meter(name, use) {
    const width = Math.min(100, use.ratio * 100);
    const text = `${FORMAT[name](use.used)} / ${FORMAT[name](use.usable)}${UNIT[name]} (${pct(use.ratio)})`;
    return el("td", { "data-resource": name, class: "dash-meter" },
      el("div", { class: "meter" }, el("span", { style: `width:${width}%;background:${heat(use.ratio)}` })),
      el("small", { class: "amount" }, text));
  }

  function renderUtilisation(util) {
    const body = root.querySelector("#dash-utilisation tbody");
    const rows = [["All hosts", util.overall, "overall"], ...util.groups.map((g) => [g.name, g, g.name])];
    body.replaceChildren(...rows.map(([label, sums, key]) => {
      const states = Object.entries(sums.states).filter(([s, n]) => n && s !== "online").map(([s, n]) => `${n} ${s}`);
      return el("tr", { "data-group": key, class: key === "overall" ? "total" : "" },
        el("th", { scope: "row" }, label),
        el("td", { class: "num", title: states.join(", ") }, `${sums.hosts}${states.length ? ` (${states.join(", ")})` : ""}`),
        el("td", { class: "num", "data-vms": "" }, String(sums.vms)),
        meter("vcpus", sums.vcpus), meter("memory_mib", sums.memory_mib), meter("disk_gib", sums.disk_gib));
    }));
  }

  // Utilisation 0 → pale green, 1 → red (hue 140 → 0).
  function heat(ratio) {
    const r = Math.max(0, Math.min(1, ratio));
    return `hsl(${Math.round(140 - 140 * r)} ${Math.round(60 + 12 * r)}% ${Math.round(86 - 30 * r)}%)`;
  }

  function renderHeatmap(heatmap) {
    const hostUrl = root.dataset.hostUrl;
    const rows = heatmap.rows.map((row) => {
      const cells = row.slots.map((h, i) => {
        if (!h) return el("span", { class: "heat-cell empty", title: `${row.name} slot ${i + 1}: empty` }, String(i + 1));
        const r = h.ratios;
        const title = `${h.name}${h.slot ? ` · ${row.name} slot ${h.slot}` : ""} · ${h.state} · group ${h.group} · ` +
          `vCPU ${pct(r.vcpus)}, memory ${pct(r.memory_mib)}, disk ${pct(r.disk_gib)} · ${h.vms} VMs`;
        return el("a", {
          class: `heat-cell ${h.state}`, href: hostUrl.replace(/0\/$/, `${h.id}/`), title,
          "data-host": h.name, "data-utilisation": h.utilisation,
          style: h.state === "offline" ? "" : `background:${heat(h.utilisation)}`,
        }, h.slot ? String(h.slot) : "");
      });
      return el("div", { class: "heat-row", "data-chassis": row.name },
        el("div", { class: "heat-label" }, row.name, el("small", { class: "muted" }, row.site || "")),
        el("div", { class: "heat-cells" }, ...cells));
    });
    root.querySelector("#dash-heatmap").replaceChildren(...(rows.length ? rows : [el("p", { class: "muted" }, "No hosts yet.")]));
  }

  // Times in the page's zone (the user's, base.html), which may not be the browser's.
  const timeZone = document.documentElement.dataset.timeZone || undefined;
  const clock = new Intl.DateTimeFormat("en-GB", { hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZone });
  const hh = (d) => clock.format(d);
  const hourOf = (d) => Number(hh(d).slice(0, 2));
  const day = (d) => d.toLocaleDateString([], { weekday: "short", day: "numeric", timeZone });
  // Axis: the day at midnight, every sixth hour otherwise (tooltips show every label in full).
  const tick = (i) => (!hours[i] ? null : hourOf(hours[i]) === 0 ? day(hours[i]) : hourOf(hours[i]) % 6 === 0 ? hh(hours[i]) : null);

  function renderTimeline(timeline) {
    hours = timeline.hours.map((iso) => new Date(iso));
    const labels = hours.map((d) => `${day(d)} ${hh(d)}`); // tooltips
    const peak = Math.max(0, ...timeline.hours.map((_, i) => SERIES.reduce((n, [k]) => n + timeline.series[k][i], 0)));
    root.querySelector("#dash-timeline-now").textContent =
      `Now: ${timeline.now} reservation${timeline.now === 1 ? "" : "s"} · peak in the next 3 days: ${peak}`;
    const datasets = SERIES.map(([key, label, color]) => ({ label, data: timeline.series[key], backgroundColor: color, stack: "r" }));
    if (typeof Chart === "undefined") return;
    if (chart) {
      chart.data.labels = labels;
      chart.data.datasets.forEach((ds, i) => { ds.data = datasets[i].data; });
      chart.update("none");
      return;
    }
    chart = new Chart(root.querySelector("#dash-timeline"), {
      type: "bar",
      data: { labels, datasets },
      options: {
        animation: false, maintainAspectRatio: false, barPercentage: 1, categoryPercentage: 0.9,
        scales: { x: { stacked: true, ticks: { maxRotation: 0, autoSkip: false, callback: (_, i) => tick(i) } },
                  y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      },
    });
  }

  function renderJobs(jobs) {
    root.querySelectorAll("#dash-jobs [data-count]").forEach((b) => { b.textContent = String(jobs[b.dataset.count]); });
    const jobUrl = root.dataset.jobUrl;
    root.querySelector("#dash-latest-jobs tbody").replaceChildren(...jobs.latest.map((j) => el("tr", { "data-job": j.id },
      el("td", {}, el("a", { href: jobUrl.replace(/0\/$/, `${j.id}/`) }, `#${j.id}`)),
      el("td", {}, j.opcode),
      el("td", {}, el("span", { class: `badge ${j.status}`, title: j.error || "" }, j.status)),
      el("td", {}, j.submitter),
      el("td", {}, new Date(j.received).toLocaleTimeString([], { timeZone })))));
  }

  // Rows as home.html renders them on load; the empty-state line when no image pools.
  const POOL_COLUMNS = ["wanted", "ready", "building", "ahead", "in_use", "hits", "misses"];
  function renderWarmPools(pools) {
    root.querySelector("#dash-warm").hidden = !pools.length;
    root.querySelector("#dash-warm-empty").hidden = Boolean(pools.length);
    root.querySelector("#dash-warm tbody").replaceChildren(...pools.map((p) => el("tr", { "data-image": p.image },
      el("th", { scope: "row" }, p.image),
      el("td", { class: "num" }, `${p.min} / ${p.max}`),
      ...POOL_COLUMNS.map((key) => el("td", { class: "num" }, String(p[key]))))));
  }

  function render(data) {
    renderUtilisation(data.utilisation);
    renderHeatmap(data.heatmap);
    renderTimeline(data.timeline);
    renderJobs(data.jobs);
    renderWarmPools(data.warm_pools);
    root.querySelector("#dash-updated").textContent = new Date(data.generated).toLocaleTimeString([], { timeZone });
    root.dataset.refreshes = String(refreshes); // for tests: how many refetches were rendered
  }

  function fetchNow() {
    busy = true;
    lastFetch = Date.now();
    fetch(root.dataset.url, { headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`dashboard data: HTTP ${r.status}`))))
      .then((data) => { refreshes += 1; render(data); })
      .catch((err) => console.warn(err))
      .finally(() => {
        busy = false;
        if (again) { again = false; schedule(); }
      });
  }

  // Throttle with a trailing call: events during a fetch or within a second of the last one
  // collapse into one more fetch when the second is over.
  function schedule() {
    if (busy) { again = true; return; }
    if (timer) return;
    timer = setTimeout(() => { timer = null; fetchNow(); }, Math.max(0, REFRESH_MS - (Date.now() - lastFetch)));
  }

  document.addEventListener("DOMContentLoaded", () => {
    root = document.getElementById("admin-dashboard");
    if (!root) return;
    render(JSON.parse(document.getElementById("dashboard-data").textContent));
    window.vclEvents.subscribe(["admin"], (event) => { if (relevant(event.kind)) schedule(); });
  });
})();
