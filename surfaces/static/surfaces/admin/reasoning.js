// Run page: load the reasoning panel on request. The form posts (CSRF-protected) to the admin's reasoning
// view, which checks the permission and logs the read; the response is server-rendered, escaped HTML.
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
});
