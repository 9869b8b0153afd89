"""The transparency log over finished runs (RFC 9162 Merkle tree, signed checkpoints, proofs, evidence).

Pure modules (`merkle`, `note`, `signednote`, `leafdata`, `bundle`) import no Django, so the offline
verifier can use them; the Django modules keep keys, append and sign (`log`), read proofs, build
bundles and verify the whole store. This file imports nothing, so the pure modules stay importable
without Django settings.
Details: docs/architecture.md, *The transparency log*; docs/audit-integrity.md.
"""
