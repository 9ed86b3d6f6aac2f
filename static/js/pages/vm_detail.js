// templates/vms/vm_detail.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("vm");
  vclEvents.subscribe([`vm.${box.dataset.id}`], (event) => {
    if (event.kind !== "vm.changed") return;
    const d = event.data;
    const badge = document.getElementById("vm-state");
    badge.textContent = d.state;
    badge.className = `badge vm-${d.state}`;
    document.getElementById("vm-address").textContent = d.address || "—";
    document.getElementById("vm-error").textContent = d.error || "—";
    if (d.state !== box.dataset.state) {
      box.dataset.state = d.state;
      setTimeout(() => location.reload(), 800); // the actions, host and history of the new state
    }
  });
});
