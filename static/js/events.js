// Live events over /ws/events/: subscribe to topics, get each event once, in order.
// Reconnects with backoff and resumes from the last event id, so nothing is missed.
(function () {
  const handlers = new Map(); // topic -> [callback]
  let socket = null;
  let lastId = null;
  let retry = 0;

  function indicator(on) {
    const el = document.getElementById("live-indicator");
    if (el) { el.hidden = false; el.classList.toggle("on", on); }
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/events/`);
    socket.onopen = () => {
      retry = 0;
      indicator(true);
      if (handlers.size) send([...handlers.keys()]);
    };
    socket.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (data.type === "subscribed") {
        if (lastId === null) lastId = data.last_id;
        document.documentElement.dataset.live = "subscribed"; // for tests and styling
      }
      if (data.type !== "event") return;
      lastId = Math.max(lastId || 0, data.id);
      (handlers.get(data.topic) || []).forEach((fn) => fn(data));
    };
    socket.onclose = (ev) => {
      indicator(false);
      if (ev.code === 4401) return; // signed out: don't hammer the server
      retry = Math.min(retry + 1, 6);
      setTimeout(connect, 250 * 2 ** retry);
    };
  }

  function send(topics) {
    if (socket && socket.readyState === WebSocket.OPEN) {
      const msg = { action: "subscribe", topics };
      if (lastId !== null) msg.since = lastId;
      socket.send(JSON.stringify(msg));
    }
  }

  window.vclEvents = {
    subscribe(topics, fn) {
      const fresh = topics.filter((t) => !handlers.has(t));
      topics.forEach((t) => handlers.set(t, [...(handlers.get(t) || []), fn]));
      if (!socket) connect(); else if (fresh.length) send(fresh);
    },
  };
})();
