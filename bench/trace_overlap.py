#!/usr/bin/env python3
"""The share of communication hidden behind compute, from `dsc train --trace` files.

usage: trace_overlap.py [--json] [--merge OUT] TRACE [TRACE ...]

Reads Chrome traces written by `dsc train --trace FILE` (docs/training.md,
"Traces"): complete events ("X") and async pairs ("b"/"e", the comm and copy
tracks, whose spans overlap). Under mpirun rank R > 0 writes FILE.rankR: given FILE alone, the
FILE.rank* next to it are read too. Per rank (pid), over the events of
category "collective":
  comm = the union of the spans on the "comm" track (a collective from its
         start to the return of its wait),
  wait = the union of the spans on the "wait" track (the executor blocked),
and hidden = 1 - sum(wait) / sum(comm) over the ranks: the share of the
time collectives were in flight during which the rank computed instead of
waiting. The trainer's stop-flag all-reduce (category "control") is left out.
--merge OUT writes the events of all files into one trace (one clock:
CLOCK_MONOTONIC of the host). Python 3 standard library only.
Exit status: 0, or 1 on an unreadable or malformed trace (a message says why).
"""
import glob
import json
import os
import sys


def fail(msg):
    print(f"trace_overlap.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    except ValueError as e:
        fail(f"{path}: not valid JSON: {e}")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        fail(f"{path}: no traceEvents list (not a Chrome trace)")
    return data, events


def union_us(spans):
    """Total length of the union of [start, end) spans."""
    total, lo, hi = 0.0, None, None
    for s, e in sorted(spans):
        if hi is None or s > hi:
            if hi is not None:
                total += hi - lo
            lo, hi = s, e
        elif e > hi:
            hi = e
    if hi is not None:
        total += hi - lo
    return total


def spans(events):
    """The events as spans with ts and dur: complete events ("X") as they are,
    async pairs ("b" ... "e" of one pid, cat and id: collectives and copies,
    which overlap) joined into one, with the begin's name and args."""
    out, open_ = [], {}
    for ev in events:
        ph = ev.get("ph")
        if ph == "X":
            out.append(ev)
        elif ph in ("b", "e"):
            key = (ev.get("pid"), ev.get("cat"), ev.get("id"))
            if ph == "b":
                if key in open_:
                    fail(f"async span begun twice: {json.dumps(ev)[:200]}")
                open_[key] = ev
                continue
            b = open_.pop(key, None)
            if b is None:
                fail(f"async end without a begin: {json.dumps(ev)[:200]}")
            try:
                ts, te = float(b["ts"]), float(ev["ts"])
            except (KeyError, TypeError, ValueError):
                fail(f"malformed event: {json.dumps(ev)[:200]}")
            span = dict(b, ph="X", dur=te - ts)
            out.append(span)
    if open_:
        fail(f"{len(open_)} async span(s) without an end")
    return out


def analyse(events):
    # track names from the thread_name metadata (pid, tid) -> name
    names = {}
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev.get("pid"), ev.get("tid"))] = ev.get("args", {}).get("name")
    ranks = {}
    for ev in spans(events):
        try:
            pid, ts, dur = ev["pid"], float(ev["ts"]), float(ev["dur"])
        except (KeyError, TypeError, ValueError):
            fail(f"malformed event: {json.dumps(ev)[:200]}")
        track = names.get((pid, ev.get("tid")))
        r = ranks.setdefault(pid, {"comm": [], "wait": [], "compute_us": 0.0, "steps": 0})
        if track == "compute":
            r["compute_us"] += dur
        elif track == "step" and str(ev.get("name", "")).startswith("step "):
            r["steps"] += 1
        elif track in ("comm", "wait") and ev.get("cat") == "collective":
            r[track].append((ts, ts + dur))
    out = []
    for pid in sorted(ranks):
        r = ranks[pid]
        comm, wait = union_us(r["comm"]), union_us(r["wait"])
        out.append({"rank": pid, "steps": r["steps"], "collectives": len(r["comm"]),
                    "comm_us": comm, "wait_us": wait, "compute_us": r["compute_us"],
                    "hidden": (1 - wait / comm) if comm > 0 else None})
    comm = sum(r["comm_us"] for r in out)
    wait = sum(r["wait_us"] for r in out)
    total = {"ranks": len(out), "collectives": sum(r["collectives"] for r in out),
             "comm_us": comm, "wait_us": wait,
             "hidden": max(0.0, 1 - wait / comm) if comm > 0 else None}
    return out, total


def main(argv):
    as_json, merge, paths = False, None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if a == "--json":
            as_json = True
        elif a == "--merge":
            if i + 1 >= len(argv):
                fail("--merge needs a file name")
            merge = argv[i + 1]
            i += 1
        elif a.startswith("-"):
            fail(f"unknown option '{a}' (see --help)")
        else:
            paths.append(a)
        i += 1
    if not paths:
        fail("give a trace file (see --help)")
    if len(paths) == 1:
        extra = glob.glob(glob.escape(paths[0]) + ".rank*")
        extra.sort(key=lambda p: int(p.rsplit(".rank", 1)[1]) if p.rsplit(".rank", 1)[1].isdigit() else 1 << 30)
        paths += [p for p in extra if os.path.isfile(p)]
    events = []
    for p in paths:
        events += load(p)[1]
    ranks, total = analyse(events)
    if merge:
        with open(merge, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    if as_json:
        print(json.dumps({"files": paths, "ranks": ranks, "total": total}))
        return 0
    print(f"{'rank':>4} {'steps':>5} {'colls':>6} {'comm ms':>10} {'wait ms':>10} "
          f"{'compute ms':>11} {'hidden':>7}")
    for r in ranks:
        h = f"{100 * r['hidden']:.1f}%" if r["hidden"] is not None else "-"
        print(f"{r['rank']:>4} {r['steps']:>5} {r['collectives']:>6} {r['comm_us'] / 1e3:>10.3f} "
              f"{r['wait_us'] / 1e3:>10.3f} {r['compute_us'] / 1e3:>11.3f} {h:>7}")
    if total["hidden"] is None:
        print("hidden: - (no collectives in the trace)")
    else:
        print(f"hidden: {100 * total['hidden']:.1f}% of {total['comm_us'] / 1e3:.3f} ms of "
              f"communication over {total['ranks']} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
