// templates/inventory/hypervisor_detail.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const badge = document.getElementById("host-state");
  vclEvents.subscribe([badge.dataset.topic], (event) => {
    if (event.data.state) { badge.textContent = event.data.state; badge.className = `badge ${event.data.state}`; }
    if (event.kind === "hypervisor.state") {
      document.getElementById("host-state-reason").textContent = `${event.data.state_reason} — ${event.data.by || ""}`;
    }
  });
});
