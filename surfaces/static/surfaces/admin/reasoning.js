// Run page: load the reasoning panel on request. The form posts (CSRF-protected) to the admin's reasoning
// view, which checks the permission and logs the read; the response is server-rendered, escaped HTML.
// Arriving with `?load=reasoning` (the way back from the TOTP step-up the reader was sent to by this
// panel) loads it at once: the reader already asked for it; the query is then dropped from the address
// so a reload does not read (and log) it again.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("dc-reasoning-form");
  const target = document.getElementById("dc-reasoning-body");
  if (!form || !target) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    button.textContent = "Loading…";
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body: new FormData(form),
        headers: {"X-Requested-With": "fetch"},
        credentials: "same-origin",
      });
      // 403 with X-Step-Up: otp is the server's "verify a second factor first" panel (access.stepup).
      if (!response.ok && response.headers.get("X-Step-Up") !== "otp") throw new Error(`HTTP ${response.status}`);
      target.innerHTML = await response.text();
      form.hidden = true;
    } catch (error) {
      target.textContent = `Could not load the reasoning (${error.message}).`;
      button.disabled = false;
      button.textContent = "Retry";
    }
  });
  const params = new URLSearchParams(window.location.search);
  if (params.get("load") === "reasoning") {
    params.delete("load");
    const rest = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (rest ? `?${rest}` : "") + window.location.hash);
    document.getElementById("reasoning")?.scrollIntoView();
    form.requestSubmit();
  }
});
