// templates/vms/image_list.html, "Upload an image": a tus 1.0 upload (/api/v1/image-uploads/) in
// chunks sent with fetch; after a failure it asks the server's offset (HEAD) and goes on from
// there. The upload's address is kept per file (name, size, date) in localStorage, so choosing
// the same file again after a reload resumes it too. Session-authenticated: the CSRF token goes
// in a header, as for every write.
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("upload-form");
  if (!form) return;
  const progress = document.getElementById("upload-progress");
  const status = document.getElementById("upload-status");
  const button = form.querySelector("button[type=submit]");
  const csrf = form.querySelector("[name=csrfmiddlewaretoken]").value;
  const chunk = Number(form.dataset.chunk);
  const RETRIES = 8;

  class Refused extends Error {}

  const headers = (extra) => ({ "Tus-Resumable": "1.0.0", "X-CSRFToken": csrf, ...extra });
  const call = (url, method, extra, body) =>
    fetch(url, { method, headers: headers(extra), body, credentials: "same-origin" });
  const base64 = (text) => btoa(String.fromCharCode(...new TextEncoder().encode(text)));
  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const say = (text) => {
    status.textContent = text;
  };
  const fileKey = (file) => `image-upload:${file.name}:${file.size}:${file.lastModified}`;

  async function message(response) {
    try {
      return (await response.json()).error.message;
    } catch {
      return `the server answered ${response.status}`;
    }
  }

  async function offsetOf(url) {
    const response = await call(url, "HEAD", {});
    if (response.status === 404) throw new Refused("the upload expired or was removed: start it again");
    if (!response.ok) throw new Error(`the server answered ${response.status}`);
    if (response.headers.get("Upload-State") !== "receiving") throw new Refused("the upload is already complete");
    return Number(response.headers.get("Upload-Offset"));
  }

  async function resumable(file) {
    const known = localStorage.getItem(fileKey(file));
    if (!known) return null;
    try {
      return { url: known, offset: await offsetOf(known) };
    } catch {
      localStorage.removeItem(fileKey(file));
      return null;
    }
  }

  async function create(file, name, format) {
    const metadata = `name ${base64(name)},format ${base64(format)}`;
    const response = await call(form.dataset.url, "POST", {
      "Upload-Length": String(file.size),
      "Upload-Metadata": metadata,
    });
    if (response.status !== 201) throw new Refused(await message(response));
    const url = response.headers.get("Location");
    localStorage.setItem(fileKey(file), url);
    return { url, offset: 0 };
  }

  async function patch(url, file, offset) {
    const body = file.slice(offset, offset + chunk);
    const response = await call(url, "PATCH", {
      "Upload-Offset": String(offset),
      "Content-Type": "application/offset+octet-stream",
    }, body);
    if (response.status === 204) return Number(response.headers.get("Upload-Offset"));
    if (response.status === 409 || response.status >= 500) throw new Error(await message(response));
    throw new Refused(await message(response));
  }

  async function send(url, file, offset) {
    let failures = 0;
    while (offset < file.size) {
      show(offset, file.size);
      try {
        offset = await patch(url, file, offset);
        failures = 0;
      } catch (error) {
        if (error instanceof Refused || ++failures > RETRIES) throw error;
        say(`Interrupted (${error.message}); resuming…`);
        await pause(1000 * 2 ** Math.min(failures, 5));
        offset = await offsetOf(url).catch((again) => {
          if (again instanceof Refused) throw again;
          return offset; // the server is still away: the next attempt tells
        });
      }
    }
    show(offset, file.size);
  }

  function show(offset, size) {
    progress.hidden = false;
    progress.value = size ? (100 * offset) / size : 100;
    say(`Uploading: ${Math.floor(progress.value)} %`);
  }

  async function outcome(url, file) {
    localStorage.removeItem(fileKey(file));
    let upload = { state: "checking" };
    while (upload.state === "checking") {
      const response = await fetch(url, { credentials: "same-origin" });
      if (!response.ok) throw new Error(await message(response));
      upload = await response.json();
      if (upload.state === "checking") await pause(2000); // a job checks it: qemu-img reads it all
    }
    if (upload.state === "done") {
      const link = document.createElement("a");
      link.href = form.dataset.imageUrl.replace("/0/", `/${upload.image}/`);
      link.textContent = upload.name;
      status.replaceChildren("Uploaded and checked: your image ", link, " is ready.");
    } else {
      say(`Refused: ${upload.reason}`);
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = form.elements.namedItem("file").files[0];
    if (!file) return;
    button.disabled = true;
    try {
      const upload = (await resumable(file)) || (await create(file, form.elements.namedItem("name").value, form.elements.namedItem("format").value));
      await send(upload.url, file, upload.offset);
      say("Checking the disk…");
      await outcome(upload.url, file);
    } catch (error) {
      say(`Not uploaded: ${error.message}`);
    } finally {
      button.disabled = false;
    }
  });
});
