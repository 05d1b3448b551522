#!/usr/bin/env python3
"""Checks a Grafana dashboard against a Prometheus text exposition scraped from a running vtismd:
every metric name a query (panel targets, template variables) uses must be served.

usage: dashboard_metrics.py DASHBOARD.json METRICS.txt"""
import json
import re
import sys

NAME = re.compile(r"\bvtism_[a-zA-Z0-9_]+")


def queries(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "query", "definition") and isinstance(v, str):
                yield v
            elif isinstance(v, dict) and k == "query" and isinstance(v.get("query"), str):
                yield v["query"]
            else:
                yield from queries(v)
    elif isinstance(node, list):
        for v in node:
            yield from queries(v)


def served(text):
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            if kind in ("histogram", "summary"):
                names.update(name + s for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def main():
    dashboard = json.load(open(sys.argv[1]))
    have = served(open(sys.argv[2]).read())
    used = {n for q in queries(dashboard) for n in NAME.findall(q)}
    if not used:
        sys.exit("the dashboard has no vtism_* query")
    missing = sorted(used - have)
    if missing:
        sys.exit(f"not served: {', '.join(missing)}")
    print(f"{len(used)} metrics queried, all served ({len(have)} names served)")


main()
