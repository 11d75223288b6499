#!/usr/bin/env python3
"""Checks a Chrome trace written by `dsc train --trace` (tests/cli/trace.sh).

usage: trace_check.py SCHEMA TRACE [TRACE ...]

1. Each file validates against SCHEMA (tests/cli/lib/chrome_trace.schema.json)
   by the JSON Schema keywords it uses: type, required, properties, items,
   enum, const, minimum, pattern, $ref (local), allOf, if/then.
2. On each track (pid, tid) the complete events ("X") nest: no two overlap
   partially (a viewer moves such events to overflow tracks).
3. Every async begin ("b") has one end ("e") of its pid, cat and id, no
   earlier than the begin.
Prints "ok" and exits 0, or names the first problem and exits 1. Python 3
standard library only.
"""
import json
import re
import sys

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def type_ok(v, t):
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, TYPES[t])


def validate(v, s, root, path):
    """The first violation of schema s by value v, or None."""
    if "$ref" in s:
        node = root
        for part in s["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return validate(v, node, root, path)
    if "type" in s and not type_ok(v, s["type"]):
        return f"{path}: not of type {s['type']}"
    if "const" in s and v != s["const"]:
        return f"{path}: not {s['const']!r}"
    if "enum" in s and v not in s["enum"]:
        return f"{path}: {v!r} not one of {s['enum']}"
    if "minimum" in s and type_ok(v, "number") and v < s["minimum"]:
        return f"{path}: {v} below {s['minimum']}"
    if "pattern" in s and isinstance(v, str) and not re.search(s["pattern"], v):
        return f"{path}: {v!r} does not match {s['pattern']}"
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                return f"{path}: no '{k}'"
        for k, sub in s.get("properties", {}).items():
            if k in v:
                e = validate(v[k], sub, root, f"{path}.{k}")
                if e:
                    return e
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            e = validate(x, s["items"], root, f"{path}[{i}]")
            if e:
                return e
    for sub in s.get("allOf", []):
        if "if" in sub:
            if validate(v, sub["if"], root, path) is None and "then" in sub:
                e = validate(v, sub["then"], root, path)
                if e:
                    return e
        else:
            e = validate(v, sub, root, path)
            if e:
                return e
    return None


def check(schema, path):
    with open(path) as f:
        d = json.load(f)
    e = validate(d, schema, schema, "$")
    if e:
        return e
    ev = d["traceEvents"]
    tracks = {}
    for x in ev:
        if x["ph"] == "X":
            tracks.setdefault((x["pid"], x["tid"]), []).append(x)
    for key, xs in tracks.items():
        xs.sort(key=lambda x: (x["ts"], -x["dur"]))
        stack = []  # end times of the enclosing events
        for x in xs:
            s, t = x["ts"], x["ts"] + x["dur"]
            while stack and stack[-1][0] <= s:
                stack.pop()
            if stack and t > stack[-1][0]:
                return (f"track {key}: '{x['name']}' [{s}, {t}] overlaps '{stack[-1][1]}' "
                        f"(ends {stack[-1][0]}) partially")
            stack.append((t, x["name"]))
    begun = {}
    for x in ev:
        if x["ph"] not in ("b", "e"):
            continue
        k = (x["pid"], x["cat"], x["id"])
        if x["ph"] == "b":
            if k in begun:
                return f"async id {k} begun twice"
            begun[k] = x
        else:
            b = begun.pop(k, None)
            if b is None:
                return f"async end {k} without a begin"
            if x["ts"] < b["ts"]:
                return f"async span {k} ends before it begins"
    if begun:
        return f"{len(begun)} async span(s) never end, e.g. {next(iter(begun))}"
    return None


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 1
    with open(argv[0]) as f:
        schema = json.load(f)
    for path in argv[1:]:
        e = check(schema, path)
        if e:
            print(f"trace_check.py: {path}: {e}", file=sys.stderr)
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
