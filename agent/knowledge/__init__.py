"""The knowledge base the agent's `lookup_knowledge` tool searches (operations runbooks).

- `ingest`: the writes: parse runbook markdown, cut it into chunks, upsert and delete documents.
- `retrieval`: the reads: the process's search index over documents and chunks (L0 metadata + L1 BM25).
- `selectors`: the page reads: one runbook with its chunks in order (the view citation links open).
- `data/`: the stop-word lists the retrieval tokeniser drops.

These modules stand on `diagnosis.models` alone; the tool itself is
`agent.runtime.tools.lookup_knowledge`.
"""
