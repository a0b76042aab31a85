"""Compare two results/ folders file by file, byte for byte (logs and Snakemake benchmark files,
which hold clock readings, aside): the check that a refactor changed no artifact.

    python benchmarks/compare_results.py OLD/results NEW/results
"""

import hashlib
import sys
from pathlib import Path

SKIP = ("logs/", "benchmarks/")  # clock readings and host load, not artifacts


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not str(p.relative_to(root)).startswith(SKIP)}


def main(old: str, new: str) -> int:
    a, b = digests(Path(old)), digests(Path(new))
    only_old, only_new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    for label, names in (("only in old", only_old), ("only in new", only_new), ("different bytes", differ)):
        for name in names:
            print(f"{label}: {name}")
    same = len(set(a) & set(b)) - len(differ)
    print(f"{same} of {len(a)} artifacts byte-identical; {len(differ)} differ, {len(only_old)} only in old, "
          f"{len(only_new)} only in new")
    return 0 if not (only_old or only_new or differ) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
