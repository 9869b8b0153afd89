"""The transparency log over finished runs (RFC 9162 Merkle tree, signed checkpoints, proofs, evidence).

Pure modules (no Django import, usable by the offline verifier `python -m audit.verify_bundle`):
`merkle` (RFC 9162 hashing, proofs and their verifiers), `note` (the signed checkpoint format and
Ed25519 verification), `leafdata` (what a run's leaf commits to) and `bundle` (verification of an evidence
bundle). Django modules: `keys` (signing keys from settings), `models`' tables in `audit.models`, `log`
(appending finished runs and signing checkpoints), `proofs` (proofs read from the stored tree),
`evidence` (building a bundle) and `verify` (the whole-store check of `manage.py verify_audit`).

This file imports nothing, so that the pure modules stay importable without Django settings.
"""
