// templates/inventory/bladecenter_detail.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const chassis = document.getElementById("chassis");
  const hostUrl = (id) => chassis.dataset.hostUrl.replace(/0\/$/, `${id}/`);
  function draw(slot) {
    const item = chassis.querySelector(`[data-slot="${slot.slot}"]`);
    if (!item) return;
    item.className = `slot ${slot.state || "empty"}`;
    const host = document.createElement(slot.id ? "a" : "span");
    host.className = slot.id ? "slot-host" : "slot-host muted";
    host.textContent = slot.id ? slot.name : "empty";
    if (slot.id) host.href = hostUrl(slot.id);
    item.querySelector(".slot-host").replaceWith(host);
    item.querySelector(".slot-state").textContent = slot.state || "";
  }
  // Every event on a chassis topic carries the slots it changed.
  vclEvents.subscribe([chassis.dataset.topic], (event) => (event.data.slots || []).forEach(draw));
});
