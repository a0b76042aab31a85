"""Per-rule wall times of a Snakemake run, from the benchmark: files every rule writes under
results/logs/benchmark/ (one TSV per job: s, max_rss, cpu_time, …), as a Markdown table.

    python benchmarks/rule_times.py [results/logs/benchmark]

Jobs of a rule run side by side, so a rule's summed job seconds can exceed its share of the
run's wall time; ``cpu s`` is the jobs' summed CPU time (user + system)."""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path


def read_jobs(root: Path) -> dict[str, list[dict[str, float]]]:
    """{rule: [job rows]}: the rule is the first path component under ``root``."""
    jobs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for path in sorted(root.rglob("*.tsv")):
        rule = path.relative_to(root).parts[0].removesuffix(".tsv")
        with path.open() as f:
            for row in csv.DictReader(f, delimiter="\t"):
                jobs[rule].append({k: float(v) if v not in ("", "NA", "-") else 0.0 for k, v in row.items()
                                   if k != "h:m:s"})
    return jobs


def table(jobs: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| rule | jobs | job s (sum) | longest job s | cpu s | peak RSS MiB |", "|---|---:|---:|---:|---:|---:|"]
    for rule, rows in sorted(jobs.items(), key=lambda kv: -sum(r["s"] for r in kv[1])):
        lines.append(f"| {rule} | {len(rows)} | {sum(r['s'] for r in rows):.0f} | {max(r['s'] for r in rows):.0f} | "
                     f"{sum(r.get('cpu_time', 0.0) for r in rows):.0f} | {max(r.get('max_rss', 0.0) for r in rows):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default="results/logs/benchmark", type=Path)
    args = parser.parse_args()
    if not args.root.is_dir():
        raise SystemExit(f"{args.root} does not exist: run snakemake first (every rule writes a benchmark file there)")
    print(table(read_jobs(args.root)))
