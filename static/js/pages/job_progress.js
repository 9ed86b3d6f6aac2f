// A job's live status and progress bar (templates/jobs/_progress.html) over vclEvents, kept out
// of the pages for the Content-Security-Policy. Used by the job page (which adds its log) and by
// the capture card of the VM and reservation pages: an element with data-job-progress is
// watched on its own. A job that ends reloads the page, which shows its result.
window.vclJobProgress = (function () {
  function showProgress(p) {
    const bar = document.getElementById("job-progress");
    if (p.total) bar.max = p.total;
    if (p.done !== undefined) bar.value = p.done;
    document.getElementById("job-progress-text").textContent =
      (p.total ? `${p.done}/${p.total}` : "") + (p.step ? ` · ${p.step}` : "");
  }

  function showStatus(box, d) {
    const badge = document.getElementById("job-status");
    badge.textContent = d.status;
    badge.className = `badge ${d.status}`;
    const waiting = document.getElementById("job-waiting");
    if (waiting) waiting.textContent = d.waiting_for || "—";
    if (d.error_message) document.getElementById("job-error").textContent = `${d.error_kind}: ${d.error_message}`;
    showProgress(d.progress || {});
    if (["success", "error", "canceled"].includes(d.status) && !box.dataset.final) {
      box.dataset.final = "1";
      setTimeout(() => location.reload(), 800); // show the result (and the job page's retry button)
    }
  }

  function watch(box, more) {
    vclEvents.subscribe([`job.${box.dataset.id}`], (event) => {
      if (event.kind === "job.status") showStatus(box, event.data);
      else if (event.kind === "job.progress") showProgress(event.data.progress || {});
      if (more) more(event);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-job-progress]").forEach((box) => watch(box));
  });
  return { watch };
})();
