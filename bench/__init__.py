"""Benchmarks of docs/performance.md: `python -m bench` / `make bench` (see bench/__main__.py).

b1_recording  recording cost vs raw autocommit statements; 200 concurrent runs (group commit)
b2_trace      trace endpoint vs raw SQL; growth to 1 000 000 stored runs; EXPLAIN
b3_chat       B3's headline: live chats on the chat profile (≈ 25 s runs), the cost split against the
              bare SDK's floor (b3_floor), capacity ramps per release mode, layer and process count
b3_live       concurrent WebSocket chats against daphne (servers, clients, the short-profile sweep)
b4_loop       share of a run's wall time outside the model
"""
