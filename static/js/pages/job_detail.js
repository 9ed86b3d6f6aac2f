// templates/jobs/job_detail.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("job");
  const log = document.getElementById("log");
  const seen = new Set([...log.children].map((li) => Number(li.dataset.id)));
  const lastId = () => Math.max(0, ...seen);

  function addLine(entry) {
    if (seen.has(entry.id)) return;
    seen.add(entry.id);
    const li = document.createElement("li");
    li.dataset.id = entry.id;
    li.className = entry.level;
    const time = document.createElement("time");
    time.textContent = new Date(entry.time).toLocaleTimeString();
    li.append(time, " " + entry.message);
    log.append(li);
    li.scrollIntoView({ block: "nearest" });
  }

  function showStatus(d) {
    const badge = document.getElementById("job-status");
    badge.textContent = d.status;
    badge.className = `badge ${d.status}`;
    document.getElementById("job-waiting").textContent = d.waiting_for || "—";
    if (d.error_message) document.getElementById("job-error").textContent = `${d.error_kind}: ${d.error_message}`;
    showProgress(d.progress || {});
    if (["success", "error", "canceled"].includes(d.status) && !box.dataset.final) {
      box.dataset.final = "1";
      setTimeout(() => location.reload(), 800); // show the result and the retry button
    }
  }

  function showProgress(p) {
    const bar = document.getElementById("job-progress");
    if (p.total) bar.max = p.total;
    if (p.done !== undefined) bar.value = p.done;
    document.getElementById("job-progress-text").textContent =
      (p.total ? `${p.done}/${p.total}` : "") + (p.step ? ` · ${p.step}` : "");
  }

  vclEvents.subscribe([`job.${box.dataset.id}`], (event) => {
    if (event.kind === "job.log") addLine(event.data);
    else if (event.kind === "job.status") showStatus(event.data);
    else if (event.kind === "job.progress") showProgress(event.data.progress || {});
  });
  // Lines written between rendering this page and subscribing come from the API.
  fetch(`${box.dataset.logUrl}?after=${lastId()}`, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.json() : []))
    .then((entries) => entries.forEach(addLine));
});
