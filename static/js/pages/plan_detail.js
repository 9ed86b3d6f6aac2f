// Plan page: the before/after utilisation chart, and live move statuses (plan.<id>, job.<id>).
(function () {
  const summary = document.querySelector("[data-plan]");
  if (!summary) return;
  const data = JSON.parse(document.getElementById("plan-utilisation").textContent || "{}");
  const canvas = document.getElementById("plan-chart");
  if (canvas && window.Chart && data.before) {
    const after = new Map((data.after || []).map((r) => [r.host, r.memory]));
    new window.Chart(canvas, {
      type: "bar",
      data: {
        labels: data.before.map((r) => r.host),
        datasets: [
          { label: "memory % before", data: data.before.map((r) => r.memory) },
          { label: "memory % after", data: data.before.map((r) => after.get(r.host) || 0) },
        ],
      },
      options: { animation: false, scales: { y: { min: 0, max: 100 } } },
    });
  }
  if (!window.vclEvents) return;
  const rows = new Map();
  document.querySelectorAll("tr[data-job]").forEach((tr) => { if (tr.dataset.job) rows.set(tr.dataset.job, tr); });
  const setStatus = (job, status) => {
    const tr = rows.get(String(job));
    if (tr) tr.querySelector(".move-status .badge").textContent = status;
  };
  const topics = [`plan.${summary.dataset.plan}`, ...[...rows.keys()].map((id) => `job.${id}`)];
  window.vclEvents.subscribe(topics, (event) => {
    if (event.kind === "plan.status") document.getElementById("plan-state").textContent = event.data.state;
    if (event.kind === "plan.move") setStatus(event.data.job, event.data.status);
    if (event.kind === "job.status") setStatus(event.data.id, event.data.status);
  });
})();
