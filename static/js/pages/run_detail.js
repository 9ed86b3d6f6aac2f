// templates/runs/run_detail.html: the live log over vclEvents (kept out of the page for the
// Content-Security-Policy). Output events carry the chunk's seq; a gap (missed events, a
// reconnect) is filled from the API's log pages (after=), so each chunk is shown once, in order.
document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("run");
  const log = document.getElementById("run-log");
  let after = Number(box.dataset.after);
  let fetching = false;

  function append(seq, text) {
    if (seq !== after + 1) return false;
    log.append(text);
    after = seq;
    log.scrollTop = log.scrollHeight;
    return true;
  }

  function catchUp() {
    if (fetching) return;
    fetching = true;
    fetch(`${box.dataset.logUrl}?after=${after}`, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : null))
      .then((page) => {
        fetching = false;
        if (!page) return;
        page.chunks.forEach((c) => append(c.seq, c.text));
        document.getElementById("run-note").textContent = page.note;
        if (page.chunks.length) catchUp();
      })
      .catch(() => { fetching = false; });
  }

  function showState(d) {
    const badge = document.getElementById("run-state");
    badge.textContent = d.state;
    badge.className = `badge ${d.state}`;
    if (d.exit_status !== null && d.exit_status !== undefined) document.getElementById("run-exit").textContent = d.exit_status;
    if (d.error) document.getElementById("run-error").textContent = d.error;
    if (["success", "error", "canceled"].includes(d.state) && !box.dataset.final) {
      box.dataset.final = "1";
      catchUp();
      setTimeout(() => location.reload(), 1500); // show the artifacts and the trail
    }
  }

  vclEvents.subscribe([`run.${box.dataset.id}`], (event) => {
    if (event.kind === "run.output") {
      if (event.data.more || !append(event.data.seq, event.data.text)) catchUp();
    }
    else if (event.kind === "run.changed") showState(event.data);
  });
  catchUp(); // what came between rendering the page and subscribing
});
