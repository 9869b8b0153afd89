/*
 * The chat page: asks over `POST /api/chat` (Server-Sent Events read with fetch), renders the frames of
 * the API contract v2 (run, progress, tool, draft, outcome, error), cancels with `POST …/cancel`, and when
 * the stream drops before the outcome re-attaches with `GET …/events?after=<last id>` (backing off
 * 0.5 s … 8 s). A request a restarting server process refused before doing anything (503
 * `service_draining`) is sent again after its `Retry-After`.
 *
 * Progress: each `progress` frame (stage STARTED / FINISHED) and each `tool` frame (the TOOL stage:
 * RUNNING, then a terminal status) is one line under the pending answer, with the time since the question
 * was sent; the line still running ticks, so a long verified run never looks stalled. A FINISHED frame
 * closes the latest open line of its stage (or is a line of its own when its start was not seen). A
 * REDACTION line says which kinds of secrets were replaced by placeholders (and how many) before the
 * question, a tool's input or output went to the model or was stored.
 *
 * Conversations persist on the server, so the page is only a view of them: the open conversation is in
 * the address (`?session=<id>`), and loading it replays each of its runs, oldest first, from the server
 * with `GET …/events?after=0` (the same frames a live run sends, the released outcome last); a run still
 * running when the page (re)loads is re-attached and keeps streaming. The sidebar lists the user's own
 * conversations (`GET /api/diagnosis/sessions/?mine=true&q=…`, newest first, cursor pages), searchable
 * by the text of their questions.
 *
 * Feedback: each finished answer carries *Helpful* / *Not helpful* (text: no emoji font needed) and an
 * optional comment, sent to
 * `POST …/runs/{runId}/feedback` (one vote per reader, changeable: each one is chained into the run's
 * record); a replayed answer shows the reader's vote as the run list gives it (`feedback`).
 *
 * Keeping up: the page follows the newest answer (scrolls to the bottom as frames arrive) unless the
 * reader scrolled up, and follows again once they are back at the bottom or ask. The question bubble shows
 * the question as stored (the `run` frame's `query`, redacted) as soon as the run starts. Replayed frames
 * carry `at` (when their timeline event was recorded) and the `run` frame `askedAt`, so a reload or a
 * re-attach draws each stage at its true time since the question was asked. A conversation the reader does
 * not own (staff reading another user's) comes without a composer and is labelled read-only (the server
 * renders it so). A question over the API's limit (`data-query-max`, from `diagnosis.services`) is refused
 * here with the limit stated, never cut silently.
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
  var maxChars = parseInt(root.dataset.queryMax, 10);  // the API's limit, rendered by the server
  var readOnly = root.dataset.readOnly === "true";  // someone else's conversation: no composer
  var sessionsUrl = root.dataset.sessionsUrl;
  var conversationList = document.getElementById("conversation-list");
  var conversationSearch = document.getElementById("conversation-search");
  var conversationMore = document.getElementById("conversation-more");
  var conversationNote = document.getElementById("conversation-note");
  var REPLAY_PAGE = 100;  // the newest runs of a conversation replayed on load
  var MAX_RECONNECTS = 30;

  var sessionId = null;
  var streams = 0;
  var active = [];  // turns without an outcome yet: their elapsed counters tick
  var ticker = null;
  var TICK_MS = 200;
  var FOLLOW_SLACK_PX = 48;  // this close to the bottom counts as "at the newest answer"

  // ------------------------------------------------------------------------------------------------
  // Following the newest answer: scroll with it unless the reader scrolled up to read something else
  // ------------------------------------------------------------------------------------------------
  var following = true;
  var pinnedTop = 0;  // where the page last scrolled itself to
  var scroller = document.scrollingElement || document.documentElement;

  function atBottom() {
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight <= FOLLOW_SLACK_PX;
  }

  function keepUp() {
    if (!following) { return; }
    scroller.scrollTop = scroller.scrollHeight;
    pinnedTop = scroller.scrollTop;
  }

  // Content that grew after the page's own scroll is not the reader leaving: only a scroll above where
  // the page put them is. Back at the bottom, the page follows again.
  window.addEventListener("scroll", function () {
    if (atBottom()) { following = true; } else if (scroller.scrollTop < pinnedTop - 2) { following = false; }
    root.dataset.following = String(following);
  }, {passive: true});

  function setConnection(state, text) {
    connection.className = "connection " + state;
    connection.textContent = text;
  }

  function show(el, visible) { el.classList.toggle("hidden", !visible); }

  function now() { return window.performance.now(); }

  function seconds(ms) { return (Math.max(0, ms) / 1000).toFixed(1) + " s"; }

  // Server times (ISO 8601) as milliseconds, NaN when absent.
  function serverMs(iso) { return typeof iso === "string" ? Date.parse(iso) : NaN; }

  // When the question was asked, on this page's clock: from the server's `askedAt` when known (a reload,
  // a resume), so every line reads its true time since the question, not since the page loaded.
  function setAskedAt(turn, askedAt) {
    var asked = serverMs(askedAt);
    if (isNaN(asked)) { return; }
    turn.askedAt = asked;
    if (turn.replayed) { turn.startedAt = now() - Math.max(0, Date.now() - asked); }
  }

  // A frame's time on this page's clock: its recorded `at` (a frame read from the timeline) placed after
  // the question by the server's own clock, else now (a frame sent as it happened arrives as it happens).
  function frameTime(turn, at) {
    var recorded = serverMs(at);
    if (isNaN(recorded) || turn.askedAt === undefined) { return now(); }
    return turn.startedAt + (recorded - turn.askedAt);
  }

  function runUrl(turn, suffix) {
    return runsUrl + encodeURIComponent(turn.sessionId) + "/runs/" + encodeURIComponent(turn.runId) + suffix;
  }

  // ------------------------------------------------------------------------------------------------
  // Turns
  // ------------------------------------------------------------------------------------------------
  function newTurn(text, replayed) {
    var empty = document.getElementById("empty");
    if (empty) { empty.remove(); }
    var node = template.content.firstElementChild.cloneNode(true);
    node.querySelector(".question").textContent = text;
    turns.appendChild(node);
    var turn = {
      node: node,
      question: node.querySelector(".question"),
      status: node.querySelector(".status"),
      demo: node.querySelector(".demo"),
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
      feedback: node.querySelector(".feedback"),
      runId: null, sessionId: null, lastId: 0, finished: false, reconnects: 0, toolItems: {},
      startedAt: now(), seen: {}
    };
    turn.cancel.addEventListener("click", function () { cancelRun(turn); });
    wireFeedback(turn);
    keepUp();
    if (replayed) {
      // Replayed from the server: its stages arrive at once, so no timing is shown for them.
      turn.replayed = true;
      node.dataset.replayed = "true";
      node.querySelector(".elapsed").title = "when the question was asked";
    } else {
      active.push(turn);
      startTicking();
    }
    return turn;
  }

  // One status per answer, in words a person reads correctly (never SUCCESS beside BLOCKED).
  var STATUS_WORDS = {PENDING: "waiting to start", RUNNING: "working", INTERRUPTED: "waiting for approval",
    SUCCESS: "answered", FAILED: "failed", CANCELLED: "cancelled", REFUSED: "refused", UNKNOWN: "connection lost"};

  function setStatus(turn, status, release) {
    var blocked = status === "SUCCESS" && release === "BLOCKED";
    var key = blocked ? "blocked" : status.toLowerCase();
    turn.status.textContent = blocked ? "blocked" : (STATUS_WORDS[status] || key);
    turn.status.className = "status badge status-" + key;
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
  var TOOL_WORDS = {AWAITING_APPROVAL: "waiting for approval", RUNNING: "running", SUCCEEDED: "finished",
    FAILED: "failed", INTERRUPTED: "interrupted", ABANDONED: "abandoned"};

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
    if (verdict === "WAITING") { return "waiting"; }
    return "";
  }

  function newLine(turn, stage, at) {
    var item = document.createElement("li");
    item.className = "stage";
    item.dataset.stage = stage;
    var label = document.createElement("span");
    label.className = "stage-label";
    var atLabel = document.createElement("span");
    atLabel.className = "stage-at";
    var took = document.createElement("span");
    took.className = "stage-took";
    item.appendChild(label);
    item.appendChild(atLabel);
    item.appendChild(took);
    item.startedAt = frameTime(turn, at);
    atLabel.title = isNaN(serverMs(at)) ? "since the question was sent"
      : "when it was recorded, since the question was sent";
    atLabel.textContent = "+" + seconds(item.startedAt - turn.startedAt);
    turn.progress.appendChild(item);
    return item;
  }

  function openLine(item) {
    item.classList.add("current");
    item.dataset.open = "true";
    item.querySelector(".stage-took").textContent = seconds(now() - item.startedAt);  // ticks from here
  }

  function closeLine(item, tone, at) {
    var wasOpen = item.dataset.open === "true";
    item.classList.remove("current");
    item.dataset.open = "false";
    item.classList.remove("tone-bad", "tone-good", "tone-waiting");
    if (tone) { item.classList.add("tone-" + tone); }
    if (wasOpen) {  // a stage seen only when it finished (a decision, a replay) has no duration here
      item.querySelector(".stage-took").textContent = seconds((at === undefined ? now() : at) - item.startedAt);
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
      var open = lastOpen(turn, data.stage) || newLine(turn, data.stage, data.at);
      open.dataset.status = data.status || "FINISHED";
      if (data.verdict) { open.dataset.verdict = data.verdict; }
      if (data.intent) { open.dataset.intent = data.intent; }
      open.querySelector(".stage-label").textContent = stageLabel(data, true);
      closeLine(open, verdictTone(data.verdict), frameTime(turn, data.at));
    }
  }

  function onTool(turn, data) {
    var item = turn.toolItems[data.toolCallId];
    if (!item) {
      item = newLine(turn, "TOOL", data.at);
      item.dataset.toolCallId = data.toolCallId;
      turn.toolItems[data.toolCallId] = item;
    }
    if (item.dataset.status === data.status) { return; }
    var running = data.status === "RUNNING";
    if (running && item.dataset.status) { item.startedAt = frameTime(turn, data.at); }  // approved: runs from now
    // A call waiting for a person is not a failure: it is drawn waiting (its decision comes as APPROVAL).
    var waiting = data.status === "AWAITING_APPROVAL";
    item.className = "stage tool tool-" + lower(data.status);
    item.dataset.status = data.status;
    item.querySelector(".stage-label").textContent =
      "Tool " + data.name + " " + (TOOL_WORDS[data.status] || lower(data.status)) + (running || waiting ? "…" : "");
    if (running) {
      openLine(item);
    } else {
      closeLine(item, data.status === "SUCCEEDED" ? "" : waiting ? "waiting" : "bad", frameTime(turn, data.at));
    }
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
    if (turn.replayed && active.indexOf(turn) < 0) {  // replayed finished: nothing ticked
      turn.progress.querySelectorAll("li.stage[data-open=true]").forEach(function (item) { closeLine(item, ""); });
      return;
    }
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
      if (typeof data.query === "string" && data.query) {
        // The question as stored: secrets the reader pasted were redacted before the run was created.
        turn.question.textContent = data.query;
      }
      setAskedAt(turn, data.askedAt);
      openConversation(data.sessionId);
      if (data.demo) {
        show(turn.demo, true);
        turn.node.dataset.demo = "true";
      }
      turn.node.dataset.runId = data.runId;
      turn.runIdLabel.textContent = data.runId;
      if (adminUrl) {
        turn.adminLink.href = adminUrl + encodeURIComponent(data.runId) + "/admin/";
        show(turn.adminLink, true);
      }
      if (!turn.finished) {
        show(turn.cancel, true);
        setStatus(turn, "RUNNING");
      }
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
      setStatus(turn, data.status, data.releaseDecision);
      show(turn.cancel, false);
      if (data.releaseDecision) { turn.node.dataset.release = data.releaseDecision; }
      var blocked = data.releaseDecision === "BLOCKED";
      turn.node.classList.toggle("blocked", blocked);
      show(turn.blockedNote, blocked);
      // The outcome's content is what was released: it replaces any draft.
      clearDraft(turn);
      showContent(turn, data);
      turn.node.dataset.finished = "true";
      show(turn.feedback, Boolean(turn.runId));
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
    keepUp();
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
            if (err.code === "service_draining" && turn.reconnects < MAX_RECONNECTS) {
              // A restarting server process refused it before doing anything: send it again.
              turn.reconnects += 1;
              await sleep(1000 * (Number(response.headers.get("Retry-After")) || 1));
              continue;
            }
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
    following = true;  // whoever asks wants to see the answer
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

  // ------------------------------------------------------------------------------------------------
  // Feedback on an answer
  // ------------------------------------------------------------------------------------------------
  function showVote(turn, feedback) {
    var rating = feedback ? feedback.rating : "";
    turn.feedback.querySelectorAll(".vote").forEach(function (button) {
      button.setAttribute("aria-pressed", String(button.dataset.rating === rating));
    });
    turn.node.dataset.feedback = rating;
    var comment = turn.feedback.querySelector(".feedback-comment");
    if (feedback && feedback.comment) { comment.value = feedback.comment; }
    comment.placeholder = rating === "down" ? "What was wrong? (optional)" : "Anything to add? (optional)";
    show(turn.feedback.querySelector(".feedback-comment-label"), Boolean(rating));
    show(turn.feedback.querySelector(".feedback-send"), Boolean(rating));
  }

  async function sendFeedback(turn, rating) {
    var state = turn.feedback.querySelector(".feedback-state");
    var comment = turn.feedback.querySelector(".feedback-comment").value;
    state.textContent = "Sending…";
    var response = await fetch(runUrl(turn, "/feedback"), {
      method: "POST",
      headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": csrf},
      credentials: "same-origin",
      body: JSON.stringify({rating: rating, comment: comment})
    });
    if (!response.ok) {
      var err = await errorOf(response);
      state.textContent = "Not recorded: " + err.message;
      return;
    }
    var saved = await response.json();
    showVote(turn, saved);
    state.textContent = "Thanks: recorded.";
  }

  function wireFeedback(turn) {
    turn.feedback.querySelectorAll(".vote").forEach(function (button) {
      button.addEventListener("click", function () { sendFeedback(turn, button.dataset.rating); });
    });
    turn.feedback.addEventListener("submit", function (event) {
      event.preventDefault();
      if (turn.node.dataset.feedback) { sendFeedback(turn, turn.node.dataset.feedback); }
    });
    showVote(turn, null);
  }

  // ------------------------------------------------------------------------------------------------
  // Conversations: the open one in the address, replayed from the server; the sidebar
  // ------------------------------------------------------------------------------------------------
  function conversationHref(id) { return "?session=" + encodeURIComponent(id); }

  function openConversation(id) {
    if (sessionId === id) { return; }
    sessionId = id;
    if (sessionLabel) { sessionLabel.textContent = "conversation " + id; }
    root.dataset.sessionId = id;
    if (new URLSearchParams(window.location.search).get("session") !== id) {
      window.history.replaceState(null, "", conversationHref(id));
    }
    conversationList.querySelectorAll("a[aria-current]").forEach(function (a) { a.removeAttribute("aria-current"); });
    var current = conversationList.querySelector("a[data-session-id='" + CSS.escape(id) + "']");
    if (current) { current.setAttribute("aria-current", "page"); } else { loadConversations(false); }
  }

  function timeOf(iso) {
    var when = new Date(iso);
    return isNaN(when) ? "" : when.toLocaleString(undefined, {dateStyle: "medium", timeStyle: "short"});
  }

  function replayTurn(run) {
    var turn = newTurn(run.query, true);
    turn.runId = run.runId;
    turn.sessionId = run.sessionId;
    turn.node.dataset.runId = run.runId;
    turn.runIdLabel.textContent = run.runId;
    turn.elapsed.textContent = timeOf(run.createdAt);
    if (adminUrl) {
      turn.adminLink.href = adminUrl + encodeURIComponent(run.runId) + "/admin/";
      show(turn.adminLink, true);
    }
    setStatus(turn, run.status);
    setAskedAt(turn, run.createdAt);
    if (["PENDING", "RUNNING"].indexOf(run.status) >= 0) {
      // Still running at the (re)load: its time since the question ticks on, from the server's clock.
      active.push(turn);
      startTicking();
    }
    if (run.feedback) { showVote(turn, run.feedback); }
    return follow(turn, function () {
      return fetch(runUrl(turn, "/events?after=0"), {
        headers: {"Accept": "text/event-stream"}, credentials: "same-origin"
      });
    });
  }

  async function loadConversation(id) {
    var response = await fetch(runsUrl + encodeURIComponent(id) + "/runs/?pageSize=" + REPLAY_PAGE, {
      headers: {"Accept": "application/json"}, credentials: "same-origin"
    });
    if (!response.ok) {
      var err = await errorOf(response);
      conversationNote.textContent = "That conversation could not be opened: " + err.message;
      show(conversationNote, true);
      window.history.replaceState(null, "", window.location.pathname);
      return;
    }
    var page = await response.json();
    var runs = page.results.slice().reverse();  // oldest first, as they were asked
    openConversation(id);
    if (page.next) {
      conversationNote.textContent = "Showing the newest " + runs.length + " questions of this conversation.";
      show(conversationNote, true);
    }
    for (var i = 0; i < runs.length; i += 1) {
      var replay = replayTurn(runs[i]);
      // A finished run replays at once; one still running keeps its stream open: don't wait for it.
      if (["SUCCESS", "FAILED", "CANCELLED"].indexOf(runs[i].status) >= 0) { await replay; }
    }
  }

  var conversationsNext = null;

  function addConversation(session) {
    var item = document.createElement("li");
    var link = document.createElement("a");
    link.href = conversationHref(session.sessionId);
    link.dataset.sessionId = session.sessionId;
    if (session.sessionId === sessionId) { link.setAttribute("aria-current", "page"); }
    var title = document.createElement("span");
    title.className = "conversation-title";
    title.textContent = session.title || "(untitled)";
    var when = document.createElement("span");
    when.className = "conversation-when";
    var count = session.runCount === 1 ? "1 question" : session.runCount + " questions";
    when.textContent = timeOf(session.lastRunAt || session.createdAt) + " · " + count;
    link.appendChild(title);
    link.appendChild(when);
    item.appendChild(link);
    conversationList.appendChild(item);
  }

  async function loadConversations(more) {
    var url = more && conversationsNext ? conversationsNext
      : sessionsUrl + "?mine=true&pageSize=30&q=" + encodeURIComponent(conversationSearch.value.trim());
    var response = await fetch(url, {headers: {"Accept": "application/json"}, credentials: "same-origin"});
    if (!response.ok) { return; }
    var page = await response.json();
    if (!more) { conversationList.textContent = ""; }
    page.results.forEach(addConversation);
    conversationsNext = page.next;
    show(conversationMore, Boolean(page.next));
    conversationList.dataset.loaded = "true";
    if (!conversationList.children.length) {
      var none = document.createElement("li");
      none.className = "conversation-none";
      none.textContent = conversationSearch.value.trim() ? "No conversation matches." : "No conversation yet.";
      conversationList.appendChild(none);
    }
  }

  var searchTimer = null;
  conversationSearch.addEventListener("input", function () {
    window.clearTimeout(searchTimer);
    searchTimer = window.setTimeout(function () { loadConversations(false); }, 250);
  });
  conversationMore.addEventListener("click", function () { loadConversations(true); });

  // The question box: the API's limit stated, and a question over it refused here with its length and the
  // limit (never cut: a paste keeps every character, so nothing is lost without a word).
  function checkLength() {
    var length = query.value.length;
    var over = length > maxChars;
    counter.textContent = length + " / " + maxChars;
    counter.classList.toggle("over", over);
    query.setAttribute("aria-invalid", String(over));
    var note = document.getElementById("composer-note");
    if (over) {
      note.textContent = "Too long to ask: " + length.toLocaleString() + " characters, and a question may have at most " +
        maxChars.toLocaleString() + ". Shorten it by " + (length - maxChars).toLocaleString() + " characters.";
      note.dataset.reason = "too-long";
      show(note, true);
    } else if (note.dataset.reason === "too-long" || (note.dataset.reason === "empty" && query.value.trim())) {
      note.dataset.reason = "";
      show(note, false);
    }
    return !over;
  }

  if (!readOnly) {
    var composerNote = document.getElementById("composer-note");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var text = query.value;
      if (!text.trim()) {
        composerNote.textContent = "Type a question first: it is empty.";
        composerNote.dataset.reason = "empty";
        show(composerNote, true);
        query.focus();
        return;
      }
      if (!checkLength()) { query.focus(); return; }
      show(composerNote, false);
      query.value = "";
      checkLength();
      ask(text);
    });
    query.addEventListener("input", checkLength);
    query.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { form.requestSubmit(askButton); }
    });
    document.getElementById("new-session").addEventListener("click", function () {
      // A new conversation is an empty page; the one left stays in the sidebar and on the server.
      window.location.href = window.location.pathname;
    });
  }

  loadConversations(false);
  var opened = new URLSearchParams(window.location.search).get("session");
  if (opened) { loadConversation(opened); } else if (!readOnly) { query.focus(); }
}());
