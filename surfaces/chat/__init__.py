"""The chat transport: WebSocket `ws/chat/` and Server-Sent Events under `/api/`, over one protocol.

* `protocol`: every frame once (WebSocket and SSE encodings) and `ChatRefused`;
* `service`: start, find, follow and cancel runs (what both transports do);
* `auth`: DRF's token and session authentication for both transports; `throttle`: the chat start rate;
* `consumers` (WebSocket), `sse` (async views), `pages` (the chat page), `schema` (the OpenAPI paths).

Runs themselves are the runtime's (`agent.runtime`): the chat never executes one.
"""
