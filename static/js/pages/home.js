// templates/home.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const list = document.getElementById("activity");
  let timer = null;
  // A user's reservations, classes and runs: re-fetched (once per burst) when one of theirs changes.
  function refreshMine() {
    const panel = document.getElementById("home-panel");
    if (!panel) return;
    clearTimeout(timer);
    timer = setTimeout(() => htmx.ajax("GET", panel.dataset.url, { target: "#home-panel", swap: "outerHTML" }), 300);
  }
  vclEvents.subscribe(list.dataset.topics.split(","), (event) => {
    const item = document.createElement("li");
    item.textContent = `${new Date(event.time).toLocaleTimeString([], { timeZone: document.documentElement.dataset.timeZone || undefined })} · ${event.kind} · ${JSON.stringify(event.data)}`;
    list.prepend(item);
    while (list.children.length > 50) list.lastChild.remove();
    if (event.kind.startsWith("reservation.") || event.kind.startsWith("approval.") || event.kind === "run.changed") refreshMine();
  });
});
