"""Announces reasoning purges to the layers above.

`reasoning_purging` is sent by `audit.write.reasoning_changes.purge_reasoning` before it erases any row, with
`run_ids` (an iterable of the run ids whose rows are in its scope): whoever keeps another copy of those
runs' reasoning above this layer (the runtime's saved resume states) erases it there. It is sent with
`send`, so a receiver that raises stops the purge before anything was erased (fail-closed). (The
auditors' group is made by `access.groups` with the other role groups.)
"""

from django.dispatch import Signal

reasoning_purging = Signal()
