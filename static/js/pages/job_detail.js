// templates/jobs/job_detail.html: live updates over vclEvents (kept out of the page for the Content-Security-Policy).
// The status and progress bar are job_progress.js's; this adds the log's new lines.
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
    time.textContent = new Date(entry.time).toLocaleTimeString([], { timeZone: document.documentElement.dataset.timeZone || undefined });
    li.append(time, " " + entry.message);
    log.append(li);
    li.scrollIntoView({ block: "nearest" });
  }

  vclJobProgress.watch(box, (event) => {
    if (event.kind === "job.log") addLine(event.data);
  });
  // Lines written between rendering this page and subscribing come from the API.
  fetch(`${box.dataset.logUrl}?after=${lastId()}`, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.json() : []))
    .then((entries) => entries.forEach(addLine));
});
