#!/usr/bin/env python3
"""A job pool that shares one GPU's memory between engine runs (standard library only).

A lease on the GPU machine is short and its device time is the scarce thing, so the drafts'
repro.py runs and the impact runs of one lease go through one pool: each job declares the share of
the GPU's memory its engine takes (SGLang's ``mem_fraction_static``, vLLM's
``gpu_memory_utilization``), and the pool starts queued jobs, first queued first, as long as the
running shares stay within ``--budget`` and the running jobs within ``--max-jobs``. Later calls
of the lease add jobs (the pool runs in its own process session and reads its queue folder), and
``close`` lets it exit once the queue is empty.

    gpu_pool.py ensure --dir D [--budget 0.8] [--max-jobs 8]  # `serve` in its own session, unless running
    gpu_pool.py add --dir D --name N --share S [--env K=V ...] [--cwd DIR] -- CMD ...
    gpu_pool.py close --dir D
    gpu_pool.py status --dir D                                # one line per job
    gpu_pool.py busy --dir D [--prefix P]                     # exit 0 while a job (named P...) is queued or running

Each job's output goes to D/logs/NAME.log; D/done/NAME.json records its exit status and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 2.0


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # a reader never sees half a file


def add(d: Path, name: str, share: float, env: list[str], cwd: str | None, cmd: list[str]) -> None:
    if not 0 < share <= 1:
        sys.exit(f"gpu_pool: --share {share} is not in (0, 1]")
    if not cmd:
        sys.exit("gpu_pool: no command given after --")
    q = d / "queue"
    q.mkdir(parents=True, exist_ok=True)
    seq = len(list(q.glob("*.json"))) + len(list((d / "done").glob("*.json"))) + len(list((d / "running").glob("*.json")))
    extra = dict(kv.split("=", 1) for kv in env)
    _write(q / f"{time.time_ns()}_{seq:04d}.json", {"name": name, "share": share, "env": extra, "cwd": cwd, "cmd": cmd})
    print(f"queued {name} (share {share})")


def serve(d: Path, budget: float, max_jobs: int) -> None:
    for sub in ("queue", "running", "done", "logs"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "serve.pid").write_text(str(os.getpid()))
    running: dict[str, tuple[subprocess.Popen, dict, float, Path]] = {}
    while True:
        for key, (proc, job, t0, rfile) in list(running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            _write(d / "done" / f"{job['name']}.json", {**job, "rc": rc, "seconds": round(time.time() - t0, 1)})
            rfile.unlink(missing_ok=True)
            del running[key]
        used = sum(job["share"] for _, job, _, _ in running.values())
        for qfile in sorted((d / "queue").glob("*.json")):
            if len(running) >= max_jobs:
                break
            job = json.loads(qfile.read_text())
            if running and used + job["share"] > budget + 1e-9:
                continue  # a smaller job further down may fit (a lone job always starts)
            log = open(d / "logs" / f"{job['name']}.log", "ab")
            try:
                proc = subprocess.Popen(job["cmd"], cwd=job.get("cwd") or None, env={**os.environ, **job["env"]},
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            except OSError as exc:  # a job that cannot start is done, not the pool's end
                log.write(f"gpu_pool: could not start: {exc}\n".encode())
                log.close()
                _write(d / "done" / f"{job['name']}.json", {**job, "rc": 127, "seconds": 0.0, "error": str(exc)})
                qfile.unlink(missing_ok=True)
                continue
            log.close()
            rfile = d / "running" / qfile.name
            os.replace(qfile, rfile)
            running[qfile.name] = (proc, job, time.time(), rfile)
            used += job["share"]
            print(f"{time.strftime('%H:%M:%S')} started {job['name']} (share {job['share']}, in use {used:.2f})", flush=True)
        if not running and not any((d / "queue").glob("*.json")) and (d / "closed").exists():
            break
        time.sleep(POLL_S)
    print(f"{time.strftime('%H:%M:%S')} pool done", flush=True)


def _serving(d: Path) -> bool:
    """Whether the pool's ``serve`` process is alive."""
    try:
        os.kill(int((d / "serve.pid").read_text()), 0)
        return True
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False


def ensure(d: Path, budget: float, max_jobs: int) -> None:
    """Start ``serve`` in its own process session (it outlives the call), unless one runs."""
    pid = d / "serve.pid"
    if _serving(d):
        print(f"pool running (pid {pid.read_text()})")
        return
    d.mkdir(parents=True, exist_ok=True)
    (d / "closed").unlink(missing_ok=True)
    with open(d / "serve.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", "--dir", str(d), "--budget", str(budget),
                                 "--max-jobs", str(max_jobs)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    pid.write_text(str(proc.pid))
    print(f"pool started (pid {proc.pid}, budget {budget}, at most {max_jobs} jobs)")


def status(d: Path) -> None:
    for f in sorted((d / "done").glob("*.json")):
        j = json.loads(f.read_text())
        print(f"done     {j['name']}: exit {j['rc']} after {j['seconds']} s")
    for f in sorted((d / "running").glob("*.json")):
        print(f"running  {json.loads(f.read_text())['name']}")
    for f in sorted((d / "queue").glob("*.json")):
        print(f"queued   {json.loads(f.read_text())['name']}")


def busy(d: Path, prefix: str) -> bool:
    """Whether the pool serves and a job whose name starts with ``prefix`` is queued or running."""
    return _serving(d) and any(json.loads(f.read_text())["name"].startswith(prefix)
                               for sub in ("queue", "running") for f in (d / sub).glob("*.json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("serve")
    e = sub.add_parser("ensure")
    for p in (s, e):
        p.add_argument("--budget", type=float, default=0.8, help="sum of running shares (default %(default)s)")
        p.add_argument("--max-jobs", type=int, default=8, help="running jobs at most (default %(default)s)")
    a = sub.add_parser("add")
    a.add_argument("--name", required=True)
    a.add_argument("--share", type=float, required=True, help="the GPU memory share the job's engine takes")
    a.add_argument("--env", action="append", default=[], help="K=V for the job's environment")
    a.add_argument("--cwd", default=None)
    a.add_argument("cmd", nargs=argparse.REMAINDER)
    sub.add_parser("close")
    sub.add_parser("status")
    sub.add_parser("busy").add_argument("--prefix", default="", help="only jobs whose name starts with this")
    for p in sub.choices.values():
        if not any(x.dest == "dir" for x in p._actions):
            p.add_argument("--dir", type=Path, required=True)
    args = ap.parse_args()
    if args.what == "serve":
        serve(args.dir, args.budget, args.max_jobs)
    elif args.what == "ensure":
        ensure(args.dir, args.budget, args.max_jobs)
    elif args.what == "add":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        add(args.dir, args.name, args.share, args.env, args.cwd, cmd)
    elif args.what == "close":
        args.dir.mkdir(parents=True, exist_ok=True)
        (args.dir / "closed").touch()
    elif args.what == "busy":
        sys.exit(0 if busy(args.dir, args.prefix) else 1)
    else:
        status(args.dir)


if __name__ == "__main__":
    main()
