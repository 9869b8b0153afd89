"""Checking the record (the verify side of `audit`): what `verify_audit`, the checkpointer's gate, the
trace read and the offline verifier hold a stored record to.

One module per check: chains (`hash_chain`), rows against their digests (`row_digests`,
`chain_digests`, `rows`), write tags (`authenticity`), rights and times (`authority`, `provenance`,
`holds`), reasoning reads (`access_log`), coverage, configurations, token ledgers, rows of higher layers;
`runs` and `run_check` verify runs and the governance chain, `offline` a bundle with no Django.
Details: docs/architecture.md, *Layers* (the audit package's rooms); docs/audit-integrity.md.
"""
