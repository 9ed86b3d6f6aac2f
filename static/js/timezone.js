// Tells the server the browser's time zone, so pages show local times before the user chooses
// one on their account page: a cookie that accounts/middleware.py reads on the next request
// (and keeps for e-mails). Zone names ("Europe/Berlin") need no escaping in a cookie.
(() => {
  let zone;
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  } catch {
    return;
  }
  if (!zone || !/^[A-Za-z0-9_+\-/]+$/.test(zone)) return;
  const name = "vclmgr_tz";
  if (document.cookie.split("; ").includes(`${name}=${zone}`)) return;
  const secure = location.protocol === "https:" ? "; Secure" : "";
  document.cookie = `${name}=${zone}; path=/; max-age=31536000; SameSite=Lax${secure}`;
})();
