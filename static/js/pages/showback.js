// templates/reservations/showback.html: hours per row (the top 25), drawn from #showback-data.
document.addEventListener("DOMContentLoaded", () => {
  const canvas = document.getElementById("showback-chart");
  if (!canvas) return;
  const report = JSON.parse(document.getElementById("showback-data").textContent);
  const rows = report.rows.slice(0, 25);
  new Chart(canvas, {
    type: "bar",
    data: {
      labels: rows.map((r) => r.label),
      datasets: [
        { label: "hours", data: rows.map((r) => r.hours) },
        { label: "vCPU-hours", data: rows.map((r) => r.vcpu_hours) },
      ],
    },
    options: { responsive: true, maintainAspectRatio: false, animation: false, indexAxis: "y" },
  });
});
