"""Checks the log's checkpoints, links, proofs and cosignatures with `aics-tlog` (PyPI), a C2SP
tlog-checkpoint / signed-note / tlog-cosignature and RFC 9162 implementation nobody here wrote.

Run with the witness venv's Python (`.venv-witness`, Python 3.12: aics-tlog needs it; see
scripts/setup.sh), never imported by the tests: reads one JSON object on stdin, prints one on stdout.
Input: `logVkey`, `witnessVkey`, `note` (a cosigned checkpoint), `link` (its link note),
`consistency` {old, new, oldRoot, newRoot, proof} and `inclusion` {leafData, index, size, root, proof}
(hashes in hex). Output: what aics-tlog found, field by field; the test compares it with what it expects.
"""

import json
import sys

import aics_tlog
from aics_tlog import checkpoint as tlog_checkpoint
from aics_tlog import note as tlog_note


def main() -> None:
    given = json.load(sys.stdin)
    log_key = tlog_note.parse_vkey(given["logVkey"])
    witness_key = tlog_note.parse_vkey(given["witnessVkey"])
    cp, parsed = tlog_checkpoint.checkpoint_from_note(given["note"])
    verdict = tlog_checkpoint.verify_checkpoint(parsed, log_key, [witness_key], 1)
    link = tlog_note.parse_note(given["link"])
    link_signed = tlog_note.verify_note(link, [log_key])
    try:
        tlog_checkpoint.parse_checkpoint(link.text)
        link_is_checkpoint = True
    except ValueError:
        link_is_checkpoint = False
    c = given["consistency"]
    i = given["inclusion"]
    hexes = lambda values: [bytes.fromhex(v) for v in values]  # noqa: E731
    result = {
        "origin": cp.origin,
        "size": cp.size,
        "root": cp.root.hex(),
        "extensionLines": list(cp.extension_lines),
        "ok": verdict.ok,
        "logOk": verdict.log_ok,
        "witnesses": verdict.witnesses,
        "error": verdict.error,
        "linkSigned": link_signed,
        "linkText": link.text,
        "linkIsCheckpoint": link_is_checkpoint,
        "consistent": aics_tlog.verify_consistency(
            c["old"], c["new"], bytes.fromhex(c["oldRoot"]), bytes.fromhex(c["newRoot"]), hexes(c["proof"])
        ),
        "included": aics_tlog.verify_inclusion(
            aics_tlog.leaf_hash(i["leafData"].encode("utf-8")),
            i["index"],
            i["size"],
            hexes(i["proof"]),
            bytes.fromhex(i["root"]),
        ),
    }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
