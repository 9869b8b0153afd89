"""Checking the record (the verify side of `audit`): what `verify_audit`, the checkpointer's gate, the
trace read and the offline verifier hold a stored record to.

* `hash_chain`: how a run's event is hashed and a stored chain is checked (verdict counts, gaps);
* `row_digests`: the canonical form of every audited row and its digest; `chain_digests`: the digests a
  chain carries, collected in one pass (no Django); `rows`: the stored rows against them;
* `authenticity`: which links the write key authenticates; `authority` and `provenance`: who held the
  right, and whether times agree with the signed checkpoints; `holds`: holds and purges as the chain
  records them; `access_log`: reasoning reads against their chained records;
* `coverage`: every stored column covered or excluded with a checked reason; `configurations`,
  `reconcile`, `appended_rows`: stored configurations, token ledgers and rows of higher layers;
* `runs`: the verification of runs and of the governance chain (`verify_audit`);
* `offline`: `python -m audit.verify_bundle`, a bundle verified with no Django and no database.
"""
