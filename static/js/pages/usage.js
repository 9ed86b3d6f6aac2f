// templates/reservations/usage.html: the charts, drawn from the report in #usage-data.
document.addEventListener("DOMContentLoaded", () => {
  const report = JSON.parse(document.getElementById("usage-data").textContent);
  const bar = (id, labels, datasets, extra = {}) => {
    const canvas = document.getElementById(id);
    if (!canvas) return;
    new Chart(canvas, {
      type: "bar",
      data: { labels, datasets },
      options: { responsive: true, maintainAspectRatio: false, animation: false, ...extra },
    });
  };
  bar("usage-days", report.days.map((d) => d.day), [
    { label: "hours", data: report.days.map((d) => d.hours), yAxisID: "y" },
    { label: "peak at once", data: report.days.map((d) => d.peak), type: "line", yAxisID: "y1" },
  ], { scales: { y: { beginAtZero: true }, y1: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false } } } });
  bar("usage-images", report.images.map((r) => r.image), [{ label: "hours", data: report.images.map((r) => r.hours) }],
    { indexAxis: "y" });
  bar("usage-groups", report.groups.map((r) => r.group || "(no group)"), [{ label: "hours", data: report.groups.map((r) => r.hours) }],
    { indexAxis: "y" });
  bar("usage-refusals", report.refusals.map((r) => r.label), [{ label: "refusals", data: report.refusals.map((r) => r.count) }],
    { indexAxis: "y" });
});
