/*
 * The chat page: asks over `POST /api/chat` (Server-Sent Events read with fetch), renders the frames of
 * the API contract (run, delta, tool, outcome, error), cancels with `POST …/cancel`, and when the stream
 * drops before the outcome re-attaches with `GET …/events?after=<last id>` (backing off 0.5 s … 8 s).
 * Text is only ever set with textContent: nothing the model writes is interpreted as HTML.
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

  function setConnection(state, text) {
    connection.className = "connection " + state;
    connection.textContent = text;
  }

  function show(el, visible) { el.classList.toggle("hidden", !visible); }

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
      tools: node.querySelector(".tools"),
      blockedNote: node.querySelector(".blocked-note"),
      content: node.querySelector(".content"),
      error: node.querySelector(".error"),
      runId: null, sessionId: null, lastId: 0, finished: false, reconnects: 0, toolItems: {}
    };
    turn.cancel.addEventListener("click", function () { cancelRun(turn); });
    node.scrollIntoView({block: "end"});
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
    delta: function (turn, data) {
      turn.content.textContent += data.text;
    },
    tool: function (turn, data) {
      var item = turn.toolItems[data.toolCallId];
      if (!item) {
        item = document.createElement("li");
        var name = document.createElement("span");
        name.className = "tool-name";
        name.textContent = data.name;
        var state = document.createElement("span");
        state.className = "tool-status";
        item.appendChild(name);
        item.appendChild(state);
        item.dataset.toolCallId = data.toolCallId;
        turn.tools.appendChild(item);
        turn.toolItems[data.toolCallId] = item;
      }
      item.className = "tool tool-" + data.status.toLowerCase();
      item.dataset.status = data.status;
      item.querySelector(".tool-status").textContent = data.status.toLowerCase();
    },
    error: function (turn, data) {
      showError(turn, data.code, data.message);
    },
    outcome: function (turn, data) {
      turn.finished = true;
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
      // The outcome's content is what was released: it replaces the streamed draft.
      turn.content.textContent = data.content;
      turn.content.classList.remove("draft");
      if (!data.content) {
        turn.content.classList.add("note");
        turn.content.textContent = data.status === "CANCELLED" ? "Cancelled: nothing was released."
          : data.status === "FAILED" ? "The run failed: nothing was released." : "";
      }
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
