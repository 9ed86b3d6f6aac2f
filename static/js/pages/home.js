// templates/home.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const list = document.getElementById("activity");
  vclEvents.subscribe(list.dataset.topics.split(","), (event) => {
    const item = document.createElement("li");
    item.textContent = `${new Date(event.time).toLocaleTimeString()} · ${event.kind} · ${JSON.stringify(event.data)}`;
    list.prepend(item);
    while (list.children.length > 50) list.lastChild.remove();
  });
});
