// Self-service reservation pages: live status badges, provisioning steps, the end warning,
// the reserve form's "use the earliest start", copy and reveal buttons. Events come from
// vclEvents (events.js); the detail page re-fetches its panel (an htmx fragment) on a change.
(function () {
  const STEPS = ["staging", "defining", "starting", "running"];

  function setBadge(el, status) {
    if (!el) return;
    el.textContent = status;
    el.className = `badge res-${status}`;
  }

  // An ISO time as the pages show it, "2027-03-22 14:00 CET", in the page's zone (the user's:
  // base.html's data-time-zone), which may not be the browser's.
  function localText(iso) {
    const format = new Intl.DateTimeFormat("en-GB", {
      timeZone: document.documentElement.dataset.timeZone || undefined,
      year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
      hourCycle: "h23", timeZoneName: "short",
    });
    const p = Object.fromEntries(format.formatToParts(new Date(iso)).map((part) => [part.type, part.value]));
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute} ${p.timeZoneName}`;
  }

  // --- my reservations: a badge per row -----------------------------------------------
  function liveList(table) {
    vclEvents.subscribe(table.dataset.topics.split(","), (event) => {
      const d = event.data;
      if (event.kind === "reservation.changed") {
        const row = document.getElementById(`reservation-${d.id}`);
        if (!row) return;
        setBadge(row.querySelector('[data-field="status"]'), d.status);
        if (d.vm) row.dataset.vm = d.vm;
        if (d.end) row.querySelector('[data-field="end"]').textContent = localText(d.end);
      } else if (event.kind === "vm.changed") {
        const row = table.querySelector(`tr[data-vm="${d.id}"]`);
        if (row) row.querySelector('[data-field="vm"]').textContent = d.state;
      }
    });
  }

  // --- one reservation: steps, panel refresh, end warning ------------------------------
  function showSteps(state) {
    const list = document.getElementById("steps");
    if (!list) return;
    list.dataset.vmState = state;
    const reached = STEPS.indexOf(state);
    list.querySelectorAll("li").forEach((li, i) => {
      li.className = reached < 0 ? (state === "failed" ? "todo failed" : "todo") : i < reached ? "done" : i === reached ? "current" : "todo";
    });
    const line = document.querySelector('#vm-line [data-field="vm-state"]');
    if (line) line.textContent = state;
  }

  function warn(minutes) {
    const banner = document.getElementById("ending-warning");
    if (!banner) return;
    banner.hidden = false;
    if (minutes) banner.querySelector('[data-field="minutes"]').textContent = ` (in about ${minutes} min)`;
  }

  function liveDetail() {
    const panel = () => document.getElementById("reservation-panel");
    const id = Number(panel().dataset.id);
    let timer = null;
    function refresh() { // many events in a burst: one fetch
      clearTimeout(timer);
      timer = setTimeout(() => {
        htmx.ajax("GET", panel().dataset.panelUrl, { target: "#reservation-panel", swap: "outerHTML" }).then(() => {
          const status = panel().dataset.status; // the heading's badge, outside the panel
          setBadge(document.getElementById("reservation-status"), status);
          if (status !== "ready") document.getElementById("ending-warning").hidden = true;
        });
      }, 150);
    }
    vclEvents.subscribe(panel().dataset.topics.split(","), (event) => {
      const d = event.data;
      if (event.kind === "reservation.changed" && d.id === id) {
        setBadge(document.getElementById("reservation-status"), d.status);
        setBadge(panel().querySelector('[data-field="status"]'), d.status);
        if (d.status !== "ready") document.getElementById("ending-warning").hidden = true;
        (d.machines || []).forEach((m) => { // an environment suspended, resumed, reverted: every machine's state
          const cell = panel().querySelector(`#machines tr[data-id="${m.id}"] [data-field="machine-vm"]`);
          if (cell && m.vm_state) cell.textContent = m.vm_state;
        });
        refresh();
      } else if (event.kind === "reservation.changed") { // an environment's machine: its row
        const row = panel().querySelector(`#machines tr[data-id="${d.id}"]`);
        if (row) setBadge(row.querySelector('[data-field="machine-status"]'), d.status);
      } else if (event.kind === "vm.changed") {
        const vm = panel().dataset.vm;
        const machine = panel().querySelector(`#machines tr[data-vm="${d.id}"] [data-field="machine-vm"]`);
        if (machine) machine.textContent = d.state; // each machine's state, as it is suspended, resumed, reverted
        if (vm && Number(vm) === d.id) showSteps(d.state);
        else if (!vm && ["placing", "provisioning"].includes(panel().dataset.status)) refresh(); // its VM is new
      } else if (event.kind === "reservation.ending" && d.id === id) {
        warn(d.minutes);
      } else if (event.kind === "reservation.idle" && d.id === id) {
        refresh(); // the idle warning: the panel shows it as a banner with its countdown
      }
    });
    // What changed between rendering this page and the subscription is not replayed: fetch
    // the panel once subscribed (and again after each reconnect).
    new MutationObserver(() => {
      if (document.documentElement.dataset.live === "subscribed") refresh();
    }).observe(document.documentElement, { attributes: true, attributeFilter: ["data-live"] });
    // The warning also comes without an event: when the end is near by the clock.
    setInterval(() => {
      const p = panel();
      const left = (Date.parse(p.dataset.end) - Date.now()) / 60000;
      const banner = document.getElementById("ending-warning");
      if (p.dataset.status === "ready" && left > 0 && left <= Number(banner.dataset.warnMinutes)) warn(Math.ceil(left));
    }, 20000);
  }

  // --- the reserve form ---------------------------------------------------------------
  function reserveForm(form) {
    const start = form.querySelector("#id_start");
    const later = form.querySelector('input[name="when"][value="later"]');
    // A start time means nothing while "now" is chosen: show its field for "later" only.
    const field = form.querySelector("#start-later");
    const showStart = () => { field.hidden = !later.checked; };
    form.querySelectorAll('input[name="when"]').forEach((radio) => radio.addEventListener("change", showStart));
    showStart();
    start.addEventListener("input", () => { if (start.value) later.checked = true; });
    form.addEventListener("click", (ev) => {
      const button = ev.target.closest("button.use-earliest");
      if (!button) return;
      later.checked = true;
      showStart();
      start.value = button.dataset.start;
      start.dispatchEvent(new Event("change", { bubbles: true })); // re-checks the fit
    });
  }

  // --- copy and reveal ----------------------------------------------------------------
  function secretText(el) { return el.dataset.secret !== undefined ? el.dataset.secret : el.textContent.trim(); }

  async function copy(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (err) { // no clipboard API (plain http on a non-local host): select a temporary field
      const area = document.createElement("textarea");
      area.value = text;
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    const label = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1200);
  }

  document.addEventListener("click", (ev) => {
    const copyButton = ev.target.closest("button.copy");
    if (copyButton) copy(secretText(document.querySelector(copyButton.dataset.copy)), copyButton);
    const reveal = ev.target.closest("button.reveal");
    if (reveal) {
      const el = document.querySelector(reveal.dataset.reveal);
      const shown = reveal.textContent === "Hide";
      el.textContent = shown ? "••••••••••••" : el.dataset.secret;
      reveal.textContent = shown ? "Show" : "Hide";
    }
  });

  document.addEventListener("DOMContentLoaded", () => {
    const table = document.getElementById("reservations");
    if (table) liveList(table);
    if (document.getElementById("reservation-panel")) liveDetail();
    const form = document.getElementById("reserve-form");
    if (form) reserveForm(form);
  });
})();
