"""The knowledge base the agent's `lookup_knowledge` tool searches (operations runbooks).

- `ingest`: the writes: parse runbook markdown, cut it into chunks, upsert and delete documents.
- `retrieval`: the reads: the process's search index over documents and chunks (L0 metadata + L1 BM25).
- `text`: the shared tokeniser; `query`: a query's glossary expansion and typo corrections.
- `selectors`: the page reads: one runbook with its chunks in order (the view citation links open).
- `data/`: the tokeniser's stop words; the bilingual ops glossary `query` expands with.

These modules stand on `diagnosis.models` alone; the tool is `agent.runtime.tools.lookup_knowledge`.
"""
