/*
 * The chat page's "Waiting for your approval" panel (shown to users with diagnosis.approve_tool_call):
 * lists the tool calls that wait for a decision (`GET /api/diagnosis/approvals/`, refreshed every 5 s)
 * and decides one with `POST …/runs/{runId}/approvals/{toolCallId}` {"decision", "note",
 * "argumentsDigest"} — the digest of the arguments shown, so a call whose arguments changed is refused
 * (409). Arguments are formatted JSON, wrapped, never clipped; times are in the reader's locale with the
 * time left ("expires in 14 min"); the card reflows down to a 360 px wide screen. Everything is set with
 * textContent.
 */
(function () {
  "use strict";

  var panel = document.getElementById("approvals");
  if (!panel) { return; }
  var list = document.getElementById("approval-list");
  var result = document.getElementById("approval-result");
  var csrf = panel.dataset.csrf;
  var REFRESH_MS = 5000;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  async function decide(item, decision, note, status) {
    var url = panel.dataset.runsUrl + encodeURIComponent(item.sessionId) + "/runs/" +
      encodeURIComponent(item.runId) + "/approvals/" + encodeURIComponent(item.toolCallId);
    status.textContent = "Recording…";
    var response = await fetch(url, {
      method: "POST",
      headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
      credentials: "same-origin",
      body: JSON.stringify({decision: decision, note: note.value, argumentsDigest: item.argumentsDigest})
    });
    var body = await response.json().catch(function () { return {}; });
    // The outcome stays in the panel's status line: the decided call leaves the list on refresh.
    if (response.ok) {
      status.textContent = "";
      result.textContent = item.toolName + " " + item.toolCallId + ": " + body.decision +
        " (recorded at #" + body.sequenceNo + ")";
    } else {
      var error = body.error || {};
      status.textContent = "Not decided: " + (error.message || response.status);
    }
    refresh();
  }

  // Times as people read them: in the reader's locale, with how long until the request expires.
  function localTime(iso) {
    var when = new Date(iso);
    return isNaN(when) ? String(iso) : when.toLocaleString(undefined, {dateStyle: "medium", timeStyle: "short"});
  }

  function relative(iso) {
    var minutes = Math.round((new Date(iso) - Date.now()) / 60000);
    if (isNaN(minutes)) { return ""; }
    if (minutes <= 0) { return "expired"; }
    if (minutes < 90) { return "expires in " + minutes + " min"; }
    return "expires in " + Math.round(minutes / 60) + " h";
  }

  function render(items) {
    list.textContent = "";
    items.forEach(function (item) {
      var li = el("li", "approval");
      li.dataset.toolCallId = item.toolCallId;
      li.appendChild(el("div", "approval-head", item.toolName));
      var meta = el("div", "approval-meta");
      meta.appendChild(el("span", "", "run " + item.runId));
      meta.appendChild(el("span", "", "asked by " + (item.requester || "?")));
      meta.appendChild(el("span", "", "requested " + localTime(item.requestedAt)));
      var expires = el("span", "approval-expires", relative(item.expiresAt));
      expires.title = "expires " + localTime(item.expiresAt);
      meta.appendChild(expires);
      li.appendChild(meta);
      if (item.action) {  // who executes it, where, until when (the request's statement)
        li.appendChild(el("p", "approval-action", "If approved: " + item.action.text));
      }
      var args = el("pre", "approval-args", JSON.stringify(item.arguments, null, 2));
      args.setAttribute("aria-label", "arguments of " + item.toolName);
      args.tabIndex = 0;  // scrollable with the keyboard when long
      li.appendChild(args);
      var controls = el("div", "approval-controls");
      var note = el("input", "approval-note");
      note.type = "text";
      note.maxLength = 1000;
      note.placeholder = "note (recorded)";
      note.setAttribute("aria-label", "note on the decision about " + item.toolName);
      var status = el("span", "approval-status");
      status.setAttribute("role", "status");
      var approve = el("button", "approve", "Approve");
      var reject = el("button", "reject secondary", "Reject");
      approve.type = reject.type = "button";
      approve.setAttribute("aria-label", "Approve " + item.toolName + " in run " + item.runId);
      reject.setAttribute("aria-label", "Reject " + item.toolName + " in run " + item.runId);
      approve.addEventListener("click", function () { decide(item, "approve", note, status); });
      reject.addEventListener("click", function () { decide(item, "reject", note, status); });
      [note, approve, reject, status].forEach(function (n) { controls.appendChild(n); });
      li.appendChild(controls);
      list.appendChild(li);
    });
    panel.classList.toggle("hidden", items.length === 0 && !result.textContent);
  }

  async function refresh() {
    try {
      var response = await fetch(panel.dataset.url, {credentials: "same-origin"});
      if (response.ok) { render((await response.json()).approvals || []); }
    } catch (e) { /* the next refresh tries again */ }
  }

  refresh();
  window.setInterval(refresh, REFRESH_MS);
}());
