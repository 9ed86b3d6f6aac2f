// templates/vms/vm_list.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("vms");
  const body = table.querySelector("tbody");
  const detailUrl = (id) => table.dataset.detailUrl.replace("/0/", `/${id}/`);
  const columns = table.querySelectorAll("thead th").length;

  function newRow(d) {
    // A VM made after this page was rendered: what the event says; the rest on reload.
    const row = document.createElement("tr");
    row.id = `vm-${d.id}`;
    const link = document.createElement("a");
    link.href = detailUrl(d.id);
    link.textContent = d.key;
    row.insertCell().append(link);
    row.insertCell();
    const badge = document.createElement("span");
    badge.dataset.field = "state";
    row.insertCell().append(badge);
    for (const field of ["host", "address"]) row.insertCell().dataset.field = field;
    while (row.cells.length < columns - 1) row.insertCell();
    const error = row.insertCell();
    error.className = "muted";
    error.dataset.field = "error";
    return row;
  }

  function update(row, d) {
    const badge = row.querySelector('[data-field="state"]');
    badge.textContent = d.state;
    badge.className = `badge vm-${d.state}`;
    const host = row.querySelector('[data-field="host"]');
    if (String(d.host ?? "") !== host.dataset.host) {
      host.dataset.host = d.host ?? "";
      host.textContent = d.host ? `host ${d.host}` : "—"; // the name comes with a reload
    }
    row.querySelector('[data-field="address"]').textContent = d.address || "—";
    row.querySelector('[data-field="error"]').textContent = (d.error || "").slice(0, 80);
  }

  vclEvents.subscribe(table.dataset.topics.split(","), (event) => {
    if (event.kind !== "vm.changed") return;
    const d = event.data;
    let row = document.getElementById(`vm-${d.id}`);
    if (!row) {
      if (!table.dataset.firstPage || (table.dataset.state && d.state !== table.dataset.state)) return;
      body.querySelector("tr.empty")?.remove();
      row = newRow(d);
      body.prepend(row);
    }
    update(row, d);
  });
});
