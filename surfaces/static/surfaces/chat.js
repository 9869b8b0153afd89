/*
 * The chat page: asks over `POST /api/chat` (Server-Sent Events read with fetch), renders the frames of
 * the API contract v2 (run, progress, tool, draft, outcome, error), cancels with `POST …/cancel`, and when
 * the stream drops before the outcome re-attaches with `GET …/events?after=<last id>` (backing off
 * 0.5 s … 8 s).
 *
 * Progress: each `progress` frame (stage STARTED / FINISHED) and each `tool` frame (the TOOL stage:
 * RUNNING, then a terminal status) is one line under the pending answer, with the time since the question
 * was sent; the line still running ticks, so a long verified run never looks stalled. A FINISHED frame
 * closes the latest open line of its stage (or is a line of its own when its start was not seen). A
 * REDACTION line says which kinds of secrets were replaced by placeholders (and how many) before the
 * question, a tool's input or output went to the model or was stored.
 *
 * Text the model writes is set with textContent (drafts, a plain outcome). The one exception is the
 * outcome's `contentHtml`: the released answer as the server rendered and sanitized it
 * (`surfaces.answers.render_answer`, an allowlist of tags and attributes), set with innerHTML; the CSP
 * (`script-src 'self'`) would stop an inline handler even if one got through.
 */
(function () {
  "use strict";

  var root = document.getElementById("chat");
  if (!root) { return; }
  var csrf = root.dataset.csrf;
  var chatUrl = root.dataset.chatUrl;
  var runsUrl = root.dataset.runsUrl;
  var adminUrl = root.dataset.adminUrl;
  var turns = document.getElementById("turns");
  var form = document.getElementById("composer");
  var query = document.getElementById("query");
  var counter = document.getElementById("counter");
  var askButton = document.getElementById("ask");
  var sessionLabel = document.getElementById("session");
  var connection = document.getElementById("connection");
  var template = document.getElementById("turn-template");
  var maxChars = parseInt(root.dataset.queryMax, 10) || 8000;
  var MAX_RECONNECTS = 30;

  var sessionId = null;
  var streams = 0;
  var active = [];  // turns without an outcome yet: their elapsed counters tick
  var ticker = null;
  var TICK_MS = 200;

  function setConnection(state, text) {
    connection.className = "connection " + state;
    connection.textContent = text;
  }

  function show(el, visible) { el.classList.toggle("hidden", !visible); }

  function now() { return window.performance.now(); }

  function seconds(ms) { return (Math.max(0, ms) / 1000).toFixed(1) + " s"; }

  function runUrl(turn, suffix) {
    return runsUrl + encodeURIComponent(turn.sessionId) + "/runs/" + encodeURIComponent(turn.runId) + suffix;
  }

  // ------------------------------------------------------------------------------------------------
  // Turns
  // ------------------------------------------------------------------------------------------------
  function newTurn(text) {
    var empty = document.getElementById("empty");
    if (empty) { empty.remove(); }
    var node = template.content.firstElementChild.cloneNode(true);
    node.querySelector(".question").textContent = text;
    turns.appendChild(node);
    var turn = {
      node: node,
      status: node.querySelector(".status"),
      release: node.querySelector(".release"),
      runIdLabel: node.querySelector(".run-id"),
      adminLink: node.querySelector(".admin-link"),
      cancel: node.querySelector(".cancel"),
      elapsed: node.querySelector(".elapsed"),
      progress: node.querySelector(".progress"),
      draftBox: node.querySelector(".draft-box"),
      draftText: node.querySelector(".draft-text"),
      blockedNote: node.querySelector(".blocked-note"),
      content: node.querySelector(".content"),
      error: node.querySelector(".error"),
      runId: null, sessionId: null, lastId: 0, finished: false, reconnects: 0, toolItems: {},
      startedAt: now(), seen: {}
    };
    turn.cancel.addEventListener("click", function () { cancelRun(turn); });
    node.scrollIntoView({block: "end"});
    active.push(turn);
    startTicking();
    return turn;
  }

  function setStatus(turn, status) {
    turn.status.textContent = status.toLowerCase();
    turn.status.className = "status badge status-" + status.toLowerCase();
    turn.node.dataset.status = status;
  }

  function showError(turn, code, message) {
    turn.error.textContent = message + (code ? " (" + code + ")" : "");
    show(turn.error, true);
  }

  // ------------------------------------------------------------------------------------------------
  // Progress: one line per stage, with the time since the question was sent
  // ------------------------------------------------------------------------------------------------
  var VERDICT_WORDS = {PASS: "passed", FAIL: "failed", ERROR: "error"};
  var TOOL_WORDS = {RUNNING: "running", SUCCEEDED: "finished", FAILED: "failed", INTERRUPTED: "interrupted",
    ABANDONED: "abandoned"};

  function lower(value) { return String(value || "").toLowerCase(); }

  function stageLabel(data, finished) {
    var verdict = data.verdict ? String(data.verdict) : "";
    switch (data.stage) {
      case "ROUTING":
        return finished ? "Routed" + (data.intent ? ": " + lower(data.intent).replace(/_/g, " ") : "") : "Routing…";
      case "MODEL_STEP":
        var step = "Model step " + (data.stepIndex || "") +
          (data.agentName && data.agentName !== "diagnosis_agent" ? " (" + data.agentName + ")" : "");
        return finished ? step : step + "…";
      case "EVIDENCE_GUARD":
        if (!finished) { return data.retry ? "Checking evidence again…" : "Checking evidence…"; }
        return "Evidence check" + (data.retry ? " (repair round)" : "") +
          (verdict ? ": " + (VERDICT_WORDS[verdict] || lower(verdict)) : "");
      case "SEMANTIC_GUARD":
        if (!finished) { return "Semantic check…"; }
        return "Semantic check" + (verdict ? ": " + (VERDICT_WORDS[verdict] || lower(verdict)) : "");
      case "RELEASE":
        if (!finished) { return "Releasing…"; }
        return verdict === "PUBLISHED" ? "Released" : verdict === "BLOCKED" ? "Blocked" : "Release: " + lower(verdict);
      case "APPROVAL":
        if (verdict === "WAITING" || !finished) { return "Waiting for approval by Approvers…"; }
        return "Approval" + (verdict ? ": " + lower(verdict) : "");
      case "REDACTION":
        return redactionLabel(data.redacted);
      default:
        return lower(data.stage).replace(/_/g, " ") + (finished ? "" : "…");
    }
  }

  // What was replaced by placeholders before anything was sent to the model or stored (kinds and counts
  // only; the values never reach the page).
  function redactionLabel(redacted) {
    var parts = [];
    Object.keys(redacted || {}).sort().forEach(function (kind) {
      parts.push(String(redacted[kind]) + " × " + String(kind).replace(/-/g, " "));
    });
    return "Redacted before sending" + (parts.length ? ": " + parts.join(", ") : "");
  }

  function verdictTone(verdict) {
    if (verdict === "PASS" || verdict === "PUBLISHED" || verdict === "APPROVED") { return "good"; }
    if (verdict === "FAIL" || verdict === "ERROR" || verdict === "BLOCKED" || verdict === "REJECTED") { return "bad"; }
    return "";
  }

  function newLine(turn, stage) {
    var item = document.createElement("li");
    item.className = "stage";
    item.dataset.stage = stage;
    var label = document.createElement("span");
    label.className = "stage-label";
    var at = document.createElement("span");
    at.className = "stage-at";
    var took = document.createElement("span");
    took.className = "stage-took";
    item.appendChild(label);
    item.appendChild(at);
    item.appendChild(took);
    item.startedAt = now();
    at.textContent = "+" + seconds(item.startedAt - turn.startedAt);
    at.title = "since the question was sent";
    turn.progress.appendChild(item);
    return item;
  }

  function openLine(item) {
    item.classList.add("current");
    item.dataset.open = "true";
    item.querySelector(".stage-took").textContent = seconds(now() - item.startedAt);  // ticks from here
  }

  function closeLine(item, tone) {
    var wasOpen = item.dataset.open === "true";
    item.classList.remove("current");
    item.dataset.open = "false";
    if (tone) { item.classList.add("tone-" + tone); }
    if (wasOpen) {  // a stage seen only when it finished (a decision, a replay) has no duration here
      item.querySelector(".stage-took").textContent = seconds(now() - item.startedAt);
      item.querySelector(".stage-took").title = "how long it took";
    }
  }

  function lastOpen(turn, stage) {
    var items = turn.progress.querySelectorAll("li.stage[data-open=true]");
    for (var i = items.length - 1; i >= 0; i -= 1) {
      if (items[i].dataset.stage === stage && !items[i].dataset.toolCallId) { return items[i]; }
    }
    return null;
  }

  function onProgress(turn, data) {
    if (data.stage === "TOOL") { return; }  // the `tool` frames are the TOOL stage (they name the call)
    // A finished stage is a timeline event: seen once, even when a re-attach replays it. Started
    // stages are live only (no sequence number) and never repeat.
    if (typeof data.sequenceNo === "number") {
      if (turn.seen[data.sequenceNo]) { return; }
      turn.seen[data.sequenceNo] = true;
    }
    if (data.status === "STARTED") {
      if (data.stage === "MODEL_STEP") { clearDraft(turn); }  // a new (repair) step writes a new draft
      var item = newLine(turn, data.stage);
      item.dataset.status = "STARTED";
      item.querySelector(".stage-label").textContent = stageLabel(data, false);
      openLine(item);
    } else {
      var open = lastOpen(turn, data.stage) || newLine(turn, data.stage);
      open.dataset.status = data.status || "FINISHED";
      if (data.verdict) { open.dataset.verdict = data.verdict; }
      if (data.intent) { open.dataset.intent = data.intent; }
      open.querySelector(".stage-label").textContent = stageLabel(data, true);
      closeLine(open, verdictTone(data.verdict));
    }
  }

  function onTool(turn, data) {
    var item = turn.toolItems[data.toolCallId];
    if (!item) {
      item = newLine(turn, "TOOL");
      item.dataset.toolCallId = data.toolCallId;
      turn.toolItems[data.toolCallId] = item;
    }
    if (item.dataset.status === data.status) { return; }
    var running = data.status === "RUNNING";
    item.className = "stage tool tool-" + lower(data.status);
    item.dataset.status = data.status;
    item.querySelector(".stage-label").textContent =
      "Tool " + data.name + " " + (TOOL_WORDS[data.status] || lower(data.status)) + (running ? "…" : "");
    if (running) { openLine(item); } else { closeLine(item, data.status === "SUCCEEDED" ? "" : "bad"); }
  }

  function tick() {
    var t = now();
    active.forEach(function (turn) {
      turn.elapsed.textContent = seconds(t - turn.startedAt);
      turn.progress.querySelectorAll("li.stage[data-open=true]").forEach(function (item) {
        item.querySelector(".stage-took").textContent = seconds(t - item.startedAt);
      });
    });
    if (!active.length && ticker !== null) { window.clearInterval(ticker); ticker = null; }
  }

  function startTicking() {
    if (ticker === null) { ticker = window.setInterval(tick, TICK_MS); }
    tick();
  }

  function stopTicking(turn) {
    turn.elapsed.textContent = seconds(now() - turn.startedAt);
    turn.progress.querySelectorAll("li.stage[data-open=true]").forEach(function (item) {
      item.classList.add("stopped");
      closeLine(item, "");
    });
    active = active.filter(function (other) { return other !== turn; });
  }

  // ------------------------------------------------------------------------------------------------
  // Drafts (CHAT_RELEASE=draft only) and the released answer
  // ------------------------------------------------------------------------------------------------
  function clearDraft(turn) {
    turn.draftText.textContent = "";
    show(turn.draftBox, false);
  }

  function onDraft(turn, data) {
    turn.draftText.textContent += data.text;
    show(turn.draftBox, true);
  }

  function showContent(turn, data) {
    var content = turn.content;
    content.className = "content";
    if (typeof data.contentHtml === "string" && data.contentHtml) {
      content.classList.add("md");
      content.innerHTML = data.contentHtml;  // rendered and sanitized on the server (see the top)
      content.querySelectorAll("a[href]").forEach(function (link) {
        link.target = "_blank";  // keep the conversation: sources open beside it
        link.rel = "noopener noreferrer";
      });
    } else if (data.content) {
      content.classList.add("plain");
      content.textContent = data.content;
    } else {
      content.classList.add("note");
      content.textContent = data.status === "CANCELLED" ? "Cancelled: nothing was released."
        : data.status === "FAILED" ? "The run failed: nothing was released." : "";
    }
    show(content, true);
  }

  var handlers = {
    run: function (turn, data) {
      turn.runId = data.runId;
      turn.sessionId = data.sessionId;
      sessionId = data.sessionId;
      sessionLabel.textContent = "conversation " + data.sessionId;
      turn.node.dataset.runId = data.runId;
      turn.runIdLabel.textContent = data.runId;
      if (adminUrl) {
        turn.adminLink.href = adminUrl + encodeURIComponent(data.runId) + "/admin/";
        show(turn.adminLink, true);
      }
      show(turn.cancel, true);
      setStatus(turn, "RUNNING");
    },
    progress: onProgress,
    tool: onTool,
    draft: onDraft,
    error: function (turn, data) {
      showError(turn, data.code, data.message);
    },
    outcome: function (turn, data) {
      if (turn.finished) { return; }
      turn.finished = true;
      stopTicking(turn);
      setStatus(turn, data.status);
      show(turn.cancel, false);
      if (data.releaseDecision) {
        turn.release.textContent = data.releaseDecision.toLowerCase();
        turn.release.className = "release badge release-" + data.releaseDecision.toLowerCase();
        turn.node.dataset.release = data.releaseDecision;
      }
      var blocked = data.releaseDecision === "BLOCKED";
      turn.node.classList.toggle("blocked", blocked);
      show(turn.blockedNote, blocked);
      // The outcome's content is what was released: it replaces any draft.
      clearDraft(turn);
      showContent(turn, data);
      turn.node.dataset.finished = "true";
    }
  };

  // ------------------------------------------------------------------------------------------------
  // Server-Sent Events over fetch
  // ------------------------------------------------------------------------------------------------
  function dispatch(turn, block) {
    var event = "message", data = [], id = null;
    block.split("\n").forEach(function (line) {
      if (!line || line.charAt(0) === ":") { return; }
      var colon = line.indexOf(":");
      var field = colon < 0 ? line : line.slice(0, colon);
      var value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") { event = value; } else if (field === "data") { data.push(value); } else if (field === "id") { id = value; }
    });
    if (id !== null && /^\d+$/.test(id)) { turn.lastId = Math.max(turn.lastId, parseInt(id, 10)); }
    if (!data.length || !handlers[event]) { return; }
    handlers[event](turn, JSON.parse(data.join("\n")));
  }

  async function consume(turn, response) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffer = "";
    for (;;) {
      var chunk = await reader.read();
      if (chunk.done) { break; }
      buffer += decoder.decode(chunk.value, {stream: true}).replace(/\r\n/g, "\n");
      var cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        var block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        dispatch(turn, block);
        if (turn.finished) { return; }
      }
    }
  }

  async function errorOf(response) {
    try {
      var body = await response.json();
      if (body && body.error) { return body.error; }
    } catch (ignored) { /* not JSON */ }
    return {code: "http_" + response.status, message: "Request failed."};
  }

  function sleep(ms) { return new Promise(function (resolve) { setTimeout(resolve, ms); }); }

  async function follow(turn, request) {
    streams += 1;
    setConnection("live", "live");
    try {
      for (;;) {
        try {
          var response = await request();
          if (!response.ok) {
            var err = await errorOf(response);
            showError(turn, err.code, err.message);
            if (!turn.runId || response.status < 500) { setStatus(turn, turn.runId ? "UNKNOWN" : "REFUSED"); return; }
          } else {
            await consume(turn, response);
          }
        } catch (dropped) {
          // A network error or a dropped stream: re-attach below.
        }
        if (turn.finished) { return; }
        if (!turn.runId) {
          showError(turn, "connection_lost", "The connection dropped before the run started.");
          setStatus(turn, "UNKNOWN");
          return;
        }
        if (turn.reconnects >= MAX_RECONNECTS) {
          showError(turn, "connection_lost", "Could not reconnect to the run; reload the page to try again.");
          return;
        }
        turn.reconnects += 1;
        turn.node.dataset.reconnects = String(turn.reconnects);
        setConnection("reconnecting", "reconnecting (" + turn.reconnects + ")…");
        await sleep(Math.min(8000, 500 * Math.pow(2, turn.reconnects - 1)));
        setConnection("live", "live");
        request = function () {
          return fetch(runUrl(turn, "/events?after=" + turn.lastId), {
            headers: {"Accept": "text/event-stream"},
            credentials: "same-origin"
          });
        };
      }
    } finally {
      if (!turn.finished) { stopTicking(turn); }  // refused, or given up: nothing runs any more here
      streams -= 1;
      if (!streams) { setConnection("idle", "idle"); }
    }
  }

  // ------------------------------------------------------------------------------------------------
  // Actions
  // ------------------------------------------------------------------------------------------------
  function ask(text) {
    var turn = newTurn(text);
    setStatus(turn, "PENDING");
    var body = {query: text};
    if (sessionId) { body.sessionId = sessionId; }
    return follow(turn, function () {
      return fetch(chatUrl, {
        method: "POST",
        headers: {"Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": csrf},
        credentials: "same-origin",
        body: JSON.stringify(body)
      });
    });
  }

  async function cancelRun(turn) {
    if (!turn.runId || turn.finished) { return; }
    turn.cancel.disabled = true;
    turn.cancel.textContent = "Cancelling…";
    var response = await fetch(runUrl(turn, "/cancel"), {
      method: "POST",
      headers: {"X-CSRFToken": csrf},
      credentials: "same-origin"
    });
    if (!response.ok) {
      var err = await errorOf(response);
      showError(turn, err.code, err.message);
      turn.cancel.disabled = false;
      turn.cancel.textContent = "Cancel";
    }
  }

  function updateCounter() {
    counter.textContent = query.value.length + " / " + maxChars;
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var text = query.value;
    if (!text.trim()) { return; }
    query.value = "";
    updateCounter();
    ask(text);
  });
  query.addEventListener("input", updateCounter);
  query.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { form.requestSubmit(askButton); }
  });
  document.getElementById("new-session").addEventListener("click", function () {
    sessionId = null;
    sessionLabel.textContent = "new conversation";
    query.focus();
  });
}());
