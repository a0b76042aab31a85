"""Peak resident memory of the current process, for the benchmarks' fresh-subprocess runs."""

from __future__ import annotations

import resource


def peak_rss_mib() -> float:
    """This process's peak RSS in MiB: VmHWM from /proc/self/status on Linux.

    Not ``getrusage(...).ru_maxrss``: Linux carries that value across fork + exec, so a child
    started by a large parent reports the parent's peak, whatever the child itself used."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
