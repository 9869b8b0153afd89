"""Instructions per unit of work, counted by valgrind's callgrind: a figure that does not move with the
machine's load, for comparing two versions of a hot path on a shared machine (timings there swing by 2–3×
from minute to minute; this count repeats within ≈ 0.2 %).

    python -m bench.instructions recorder      # one full B1 run recorded, one at a time (direct path)
    python -m bench.instructions concurrent    # one of 150 B1 runs recorded at once under group commit
    python -m bench.instructions trace500      # one read of B2's 500-event trace (trace10: 10 events)

Each figure is the difference between two processes that do the same set-up and warm-up and then K or 0
units of work, divided by K, so start-up, imports and first-use costs cancel out. The two processes run
side by side under `valgrind --tool=callgrind` (about 20–50× slower than native: 1–3 minutes). With
`--annotate`, the functions whose instruction counts changed the most are listed too (C level:
the interpreter, json, hashing, the driver). Caveat: valgrind emulates the CPU without its SHA
extensions, so SHA-256 weighs several times more here than natively.

Needs MariaDB (as the bench) and valgrind (Debian's package; on every machine kind here).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.env import DEFAULT_DB, ROOT

# name → (units of work K, how to run it: a function of this module called in the child process)
WORKS = {
    "recorder": 20,
    "concurrent": 150,
    "trace10": 50,
    "trace500": 10,
}


def _child(work: str, k: int) -> None:
    """The measured process: set-up and warm-up, then `k` units of `work`."""
    from bench import env

    env.setup(DEFAULT_DB)
    from bench import b1_recording, workload
    from diagnosis import services

    user = b1_recording.bench_user()
    if work in ("recorder", "concurrent"):
        inputs = workload.make_inputs()
        session = services.create_session(owner=user, title=f"instructions {work}")
        # As many runs created whatever `k` (creating them is set-up, equal in both processes).
        runs = b1_recording.new_runs(session, WORKS[work] + 20, "ic")
        if work == "recorder":
            b1_recording.run_recorder(runs[:3], inputs, group_commit=False)
            b1_recording.run_recorder(runs[20 : 20 + k], inputs, group_commit=False)
        else:
            b1_recording.run_concurrent(runs[:20], inputs, group_commit=True)
            if k:
                b1_recording.run_concurrent(runs[20 : 20 + k], inputs, group_commit=True)
        return
    from bench import b2_trace

    size = int(work.removeprefix("trace"))
    target = b2_trace.make_targets(user, sizes=(size,))[0]
    client = b2_trace.login_client(user)
    for _ in range(3 + k):
        b2_trace.endpoint_read(client, target)


def _collected(stderr: str) -> int:
    found = re.search(r"Collected : (\d+)", stderr)
    if found is None:
        raise RuntimeError("callgrind printed no instruction count:\n" + stderr[-2000:])
    return int(found.group(1))


def _annotate(path: Path) -> dict[str, int]:
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(path)], capture_output=True, text=True, check=True
    ).stdout
    costs: dict[str, int] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            name = re.sub(r"^/tmp/python-build[^/]*/Python-[^/]*/", "", m.group(2).strip())
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def measure(work: str, *, annotate: bool = False, log=print) -> int:
    """Instructions per unit of `work` (see the module docstring)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    k = WORKS[work]
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        procs = {}
        for n in (0, k):
            cmd = [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.{n}.out",
                sys.executable,
                "-m",
                "bench.instructions",
                "--child",
                work,
                str(n),
            ]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            procs[n] = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        counts = {}
        for n, proc in procs.items():
            _, err = proc.communicate()
            if proc.returncode:
                raise RuntimeError(f"the measured process failed ({proc.returncode}):\n{err[-2000:]}")
            counts[n] = _collected(err)
        per_unit = (counts[k] - counts[0]) // k
        if annotate:
            before, after = _annotate(Path(tmp, "cg.0.out")), _annotate(Path(tmp, f"cg.{k}.out"))
            diff = sorted(((after.get(f, 0) - before.get(f, 0)) / k, f) for f in set(before) | set(after))
            for cost, name in reversed(diff[-25:]):
                log(f"  {cost / 1e3:10.0f} k {cost / per_unit:6.1%}  {name[:110]}")
    return per_unit


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        _child(args[1], int(args[2]))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n\n")[0])
    p.add_argument("work", choices=sorted(WORKS))
    p.add_argument("--annotate", action="store_true", help="list the functions that cost the most")
    parsed = p.parse_args(args)
    per_unit = measure(parsed.work, annotate=parsed.annotate)
    unit = "read" if parsed.work.startswith("trace") else "run"
    print(f"{parsed.work}: {per_unit:,} instructions per {unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
