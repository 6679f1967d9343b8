#!/usr/bin/env python3
"""Recovery benchmarks of replicated KV (DéjàVu §4.2.3; the shapes of its
Fig. 10 and Fig. 11), run through the real CLI on one node:

  per-failure   a job of N long generations (all running at once); the
                worker is killed (`actor kill`) when the generation is 25%,
                50% or 75% done. Reported per kill point and mode: job time
                relative to the same job without a kill, recovery time (the
                resumed lines' KV fetch, `shardline_recovery_seconds`), the
                positions restored from the store and the positions computed
                beyond the failure-free run.
  repeated      the same job with a worker kill every K seconds; job time
                with replication against without.

Modes: `--kv-replication 2` (stream every step's KV to the node's store;
on one node that is its own RocksDB) against `--kv-replication 0` (no
streaming: a killed worker's lines start again from the prompt).

Usage (from the repository root, after deploy/build.sh):
  python3 bench/kv_recovery_bench.py per-failure --repeats 3
  python3 bench/kv_recovery_bench.py repeated --kill-every 4 --max-kills 3 --repeats 3
The kill point is measured in positions computed (shardline_computed_tokens_total):
25% = a quarter of lines x max_tokens.
Prints one JSON line per run and a summary table (medians) on stderr.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def metrics(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def metric_sum(m, prefix):
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))


class Node:
    def __init__(self, args, work, replication):
        self.work = work
        self.key = os.path.join(work, "cluster.key")
        subprocess.run([args.shardline, "cluster", "init", "--key-file", self.key], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.log_path = os.path.join(work, "node.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [args.shardline, "node", "start", "--name", "n0", "--listen", "127.0.0.1:0", "--data-dir",
             os.path.join(work, "data"), "--model", args.model, "--key-file", self.key, "--max-batch",
             str(args.lines), "--metrics", "127.0.0.1:0", "--kv-replication", str(replication),
             "--kv-sync", args.kv_sync, "--threads", str(args.threads)],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        self.addr = self.metrics_port = None
        while time.time() < deadline and (self.addr is None or self.metrics_port is None):
            text = open(self.log_path).read()
            m = re.search(r"listening on (127\.0\.0\.1:\d+)", text)
            if m:
                self.addr = m.group(1)
            m = re.search(r"metrics on port (\d+)", text)
            if m:
                self.metrics_port = int(m.group(1))
            time.sleep(0.05)
        if self.addr is None:
            raise RuntimeError("node did not start: " + open(self.log_path).read())
        self.shardline = args.shardline
        # The worker has loaded its model once it joined.
        while "orchestrator: worker n0/cpu:0 joined" not in open(self.log_path).read():
            time.sleep(0.05)

    def cli(self, *a):
        return subprocess.run([self.shardline, *a, "--node", self.addr, "--key-file", self.key],
                              capture_output=True, text=True)

    def status(self):
        r = self.cli("job", "status", "1", "--json")
        try:
            return json.loads(r.stdout)["jobs"][0]
        except (ValueError, KeyError, IndexError):
            return None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def write_input(path, args):
    with open(os.path.join(ROOT, "deploy/demo/prompts.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()][: args.lines]
    with open(path, "w") as f:
        for x in lines:
            x["body"]["max_tokens"] = args.max_tokens
            x["body"]["ignore_eos"] = True
            f.write(json.dumps(x) + "\n")


def run_job(args, replication, kill_at=None, kill_every=None):
    """One job on a fresh node; kill_at: kill the worker once this fraction
    of the decode steps ran; kill_every: kill it every this many seconds."""
    work = tempfile.mkdtemp(prefix="sl-kvrec-")
    try:
        inp = os.path.join(work, "in.jsonl")
        write_input(inp, args)
        node = Node(args, work, replication)
        # Progress: positions the model computed (prompts are ~10 tokens
        # against max_tokens generated, so this is the generation's progress).
        computed_key = 'shardline_computed_tokens_total{worker="n0/cpu:0"}'
        target = kill_at * args.lines * args.max_tokens if kill_at is not None else None
        t0 = time.time()
        r = node.cli("job", "submit", "--model", args.model, "--input", inp, "--output", os.path.join(work, "out.jsonl"))
        if r.returncode != 0:
            raise RuntimeError(r.stdout + r.stderr)
        kills = 0
        t_kill = None
        next_kill = t0 + kill_every if kill_every else None
        while True:
            s = node.status()
            if s and s["state"] in ("done", "failed"):
                break
            now = time.time()
            if kill_at is not None and kills == 0:
                if metrics(node.metrics_port).get(computed_key, 0.0) >= target:
                    node.cli("actor", "kill", "n0/cpu:0")
                    kills, t_kill = 1, now
            if next_kill is not None and now >= next_kill and kills < args.max_kills:
                if node.cli("actor", "kill", "n0/cpu:0").returncode == 0:
                    kills += 1
                next_kill = now + kill_every
            time.sleep(0.02)
        elapsed = time.time() - t0
        m = metrics(node.metrics_port)
        out = {
            "replication": replication,
            "kill_at": kill_at,
            "kill_every_s": kill_every,
            "kills": kills,
            "elapsed_s": elapsed,
            "computed_tokens": metric_sum(m, "shardline_computed_tokens_total"),
            "recovered_tokens": metric_sum(m, "shardline_recovered_tokens_total"),
            "recomputed_failure_tokens": metric_sum(m, "shardline_recomputed_tokens_total"),
            "recovery_s_sum": metric_sum(m, "shardline_recovery_seconds_sum"),
            "recovery_count": metric_sum(m, "shardline_recovery_seconds_count"),
            "state": s["state"] if s else None,
            "failed_lines": s["failed"] if s else None,
        }
        node.stop()
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["per-failure", "repeated"])
    p.add_argument("--shardline", default=os.path.join(ROOT, "build/cli/shardline"))
    p.add_argument("--model", default=os.path.join(ROOT, "deploy/demo/stories260K"))
    p.add_argument("--lines", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=448,
                   help="generated tokens per line (the demo model's context is 512 positions)")
    p.add_argument("--kv-sync", default="wal")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kill-every", type=float, default=4.0)
    p.add_argument("--max-kills", type=int, default=3,
                   help="repeated: at most this many kills (recompute alone never finishes a job whose "
                        "lines take longer than the interval)")
    p.add_argument("--threads", type=int, default=1,
                   help="engine threads (1 of the 2 cores: streaming gets the other, as the paper's setting)")
    args = p.parse_args()

    rows = []
    if args.what == "per-failure":
        points = [None, 0.25, 0.5, 0.75]
        for rep in range(args.repeats):
            for kill_at in points:
                for replication in (2, 0):  # alternating, so drift hits both alike
                    r = run_job(args, replication, kill_at=kill_at)
                    r["repeat"] = rep
                    print(json.dumps(r), flush=True)
                    rows.append(r)
        base = {rep: statistics.median([r["elapsed_s"] for r in rows if r["kill_at"] is None and r["replication"] == rep])
                for rep in (2, 0)}
        base_computed = {rep: statistics.median([r["computed_tokens"] for r in rows
                                                 if r["kill_at"] is None and r["replication"] == rep]) for rep in (2, 0)}
        print(f"{'kill at':>8} {'mode':>12} {'job time':>10} {'vs no kill':>11} {'recovery s':>11} "
              f"{'restored':>9} {'extra computed':>15}", file=sys.stderr)
        for kill_at in points:
            for rep in (2, 0):
                sel = [r for r in rows if r["kill_at"] == kill_at and r["replication"] == rep]
                t = statistics.median([r["elapsed_s"] for r in sel])
                ts = sorted(r["elapsed_s"] for r in sel)
                rec = statistics.median([r["recovery_s_sum"] for r in sel])
                restored = statistics.median([r["recovered_tokens"] for r in sel])
                extra = statistics.median([r["computed_tokens"] - base_computed[rep] for r in sel])
                label = "replicated" if rep else "recompute"
                print(f"{str(kill_at):>8} {label:>12} {t:9.2f}s {t / base[rep]:10.2f}x {rec:10.3f}s "
                      f"{restored:9.0f} {extra:15.0f}   (range {ts[0]:.2f}-{ts[-1]:.2f}s)", file=sys.stderr)
    else:
        for rep in range(args.repeats):
            for replication in (2, 0):
                for kill_every in (None, args.kill_every):
                    r = run_job(args, replication, kill_every=kill_every)
                    r["repeat"] = rep
                    print(json.dumps(r), flush=True)
                    rows.append(r)
        print(f"{'mode':>12} {'kills':>6} {'job time':>10} {'range':>16} {'extra computed':>15}", file=sys.stderr)
        for replication in (2, 0):
            base = statistics.median([r["computed_tokens"] for r in rows
                                      if r["replication"] == replication and r["kill_every_s"] is None])
            for kill_every in (None, args.kill_every):
                sel = [r for r in rows if r["replication"] == replication and r["kill_every_s"] == kill_every]
                ts = sorted(r["elapsed_s"] for r in sel)
                label = "replicated" if replication else "recompute"
                print(f"{label:>12} {statistics.median([r['kills'] for r in sel]):6.0f} "
                      f"{statistics.median(ts):9.2f}s {ts[0]:7.2f}-{ts[-1]:.2f}s "
                      f"{statistics.median([r['computed_tokens'] - base for r in sel]):15.0f}", file=sys.stderr)


if __name__ == "__main__":
    main()
