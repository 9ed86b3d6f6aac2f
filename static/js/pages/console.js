// templates/console/console.html: the VM's screen (noVNC, vendored) and its serial console, each
// through a websocket opened with a one-time ticket the page asks for right before connecting.
import RFB from "../../vendor/novnc-1.7.0/core/rfb.js";

const box = document.getElementById("console");
const form = document.getElementById("console-ticket");

function state(kind, text, flag) {
  document.getElementById(`${kind}-state`).textContent = text;
  box.dataset[kind] = flag;
}

async function ticket(kind) {
  const body = new FormData(form);
  body.append("kind", kind);
  const response = await fetch(form.action, { method: "POST", body, credentials: "same-origin", cache: "no-store" });
  const answer = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(answer.error || `HTTP ${response.status}`);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${answer.url}`;
}

// --- the screen ---------------------------------------------------------------------------
let rfb = null;

async function openScreen() {
  if (rfb) rfb.disconnect();
  state("vnc", "connecting…", "connecting");
  let url;
  try {
    url = await ticket("vnc");
  } catch (error) {
    state("vnc", `no screen: ${error.message}`, "refused");
    return;
  }
  const screen = document.getElementById("vnc-screen");
  screen.replaceChildren();
  rfb = new RFB(screen, url, { wsProtocols: ["binary"], shared: true });
  rfb.scaleViewport = true;
  rfb.addEventListener("connect", () => state("vnc", "connected", "connected"));
  rfb.addEventListener("disconnect", (event) =>
    state("vnc", event.detail.clean ? "disconnected" : "connection lost (reconnect for a new ticket)", "disconnected"));
  rfb.addEventListener("securityfailure", (event) => state("vnc", `refused: ${event.detail.reason || ""}`, "refused"));
}

// --- the serial console (plain text: escape sequences are dropped, not drawn) ------------
const view = document.getElementById("serial-view");
let serial = null;
const ESCAPES = /\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[@-_])/g;

function show(text) {
  let current = view.textContent;
  for (const ch of text.replace(ESCAPES, "")) {
    if (ch === "\b" || ch === "\x7f") current = current.slice(0, -1);
    else if (ch === "\r" || ch === "\x07") continue; // lines end with \r\n; bells are not drawn
    else current += ch;
  }
  view.textContent = current.slice(-100000);
  view.scrollTop = view.scrollHeight;
}

async function openSerial() {
  if (serial) serial.close();
  state("serial", "connecting…", "connecting");
  let url;
  try {
    url = await ticket("serial");
  } catch (error) {
    state("serial", `no serial console: ${error.message}`, "refused");
    return;
  }
  const socket = new WebSocket(url);
  serial = socket;
  socket.addEventListener("open", () => state("serial", "connected", "connected"));
  socket.addEventListener("message", (event) => { if (typeof event.data === "string") show(event.data); });
  socket.addEventListener("close", (event) => {
    if (serial !== socket) return;
    if (event.code === 4403 || event.code === 4404) state("serial", "refused (the reason is in the view)", "refused");
    else state("serial", "disconnected", "disconnected");
  });
}

const KEYS = { Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", ArrowUp: "\x1b[A", ArrowDown: "\x1b[B",
  ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D" };

view.addEventListener("keydown", (event) => {
  if (!serial || serial.readyState !== WebSocket.OPEN || event.metaKey || event.altKey) return;
  let data = KEYS[event.key];
  if (!data && event.ctrlKey && event.key.length === 1) data = String.fromCharCode(event.key.toUpperCase().charCodeAt(0) & 31);
  else if (!data && !event.ctrlKey && event.key.length === 1) data = event.key;
  if (!data) return;
  event.preventDefault();
  serial.send(data);
});
view.addEventListener("paste", (event) => {
  if (!serial || serial.readyState !== WebSocket.OPEN) return;
  event.preventDefault();
  serial.send(event.clipboardData.getData("text").replace(/\r?\n/g, "\r"));
});

function openBoth() {
  openScreen();
  openSerial();
}

document.getElementById("console-reconnect").addEventListener("click", openBoth);
if (!box.dataset.unavailable) openBoth();
else { state("vnc", "unavailable", "refused"); state("serial", "unavailable", "refused"); }
