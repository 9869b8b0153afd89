// Times in the reader's own time zone: every <time class="dc-local" datetime="ISO 8601"> (written by
// templates/admin/local_time.html in the server's zone) is rewritten as "YYYY-MM-DD HH:MM" in the
// browser's zone; its title keeps the seconds, names the zone and the exact instant as stored.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const pad = (n) => String(n).padStart(2, "0");
  let zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { zone = ""; }
  for (const el of document.querySelectorAll("time.dc-local[datetime]")) {
    const iso = el.getAttribute("datetime");
    const at = new Date(iso);
    if (Number.isNaN(at.getTime())) continue;
    const day = `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}`;
    const minute = `${pad(at.getHours())}:${pad(at.getMinutes())}`;
    el.textContent = `${day} ${minute}`;
    el.title = `${day} ${minute}:${pad(at.getSeconds())} your time${zone ? ` (${zone})` : ""}; ${iso}`;
  }
});
