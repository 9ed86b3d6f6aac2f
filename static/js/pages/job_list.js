// templates/jobs/job_list.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("jobs");
  const body = table.querySelector("tbody");
  const onlyStatus = table.dataset.status;
  const detailUrl = (id) => table.dataset.detailUrl.replace("/0/", `/${id}/`);

  function cell(text, cls, field) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    if (field) td.dataset.field = field;
    td.textContent = text;
    return td;
  }

  function newRow(d) {
    const row = document.createElement("tr");
    row.id = `job-${d.id}`;
    const link = document.createElement("a");
    link.href = detailUrl(d.id);
    link.textContent = d.id;
    const first = cell(""); first.append(link);
    const status = cell(""); const badge = document.createElement("span");
    badge.dataset.field = "status"; status.append(badge);
    row.append(first, cell(d.opcode), status, cell("", null, "progress"), cell("", "muted", "why"),
               cell(d.submitter ? "" : "system"), cell(new Date(d.received).toLocaleString([], { timeZone: document.documentElement.dataset.timeZone || undefined })));
    return row;
  }

  function update(row, d) {
    const badge = row.querySelector('[data-field="status"]');
    if (d.status && badge) { badge.textContent = d.status; badge.className = `badge ${d.status}`; }
    const p = d.progress || {};
    const progress = row.querySelector('[data-field="progress"]');
    if (progress && p.done !== undefined) progress.textContent = p.total ? `${p.done}/${p.total}` : (p.done || "");
    const why = row.querySelector('[data-field="why"]');
    if (why && (d.error_message !== undefined || d.waiting_for !== undefined)) {
      why.textContent = (d.error_message || d.waiting_for || "").slice(0, 120);
    }
  }

  vclEvents.subscribe(table.dataset.topics.split(","), (event) => {
    if (event.kind !== "job.status" && event.kind !== "job.progress") return;
    const d = event.data;
    let row = document.getElementById(`job-${d.id}`);
    if (!row) {
      if (event.kind !== "job.status" || !table.dataset.firstPage) return;
      if (onlyStatus && d.status !== onlyStatus) return;
      body.querySelector("tr.empty")?.remove();
      row = newRow(d);
      body.prepend(row);
    }
    update(row, d);
  });
});
