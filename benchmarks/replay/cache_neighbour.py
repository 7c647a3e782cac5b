"""A neighbour for the in-process bench (benchmarks/replay/README.md, "Where the server's time
goes"):
a process that reads through a buffer of `--mib` MiB for `--busy-ms` out of every
`--period-ms`, as the API server and the replay client beside a live server's engine core use
part of the other core and of the shared L3 cache. Run it in the background during a bench
run; it runs until killed (or `--seconds`).

    python benchmarks/replay/cache_neighbour.py --mib 8 --busy-ms 25 --period-ms 100 &
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=8.0)
    parser.add_argument("--busy-ms", type=float, default=25.0)
    parser.add_argument("--period-ms", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=3600.0)
    args = parser.parse_args(argv)
    if args.mib <= 0 or not 0 < args.busy_ms <= args.period_ms:
        print("--mib must be > 0 and 0 < --busy-ms <= --period-ms", file=sys.stderr)
        return 2
    buf = np.ones(int(args.mib * 2**20) // 8)
    end = time.monotonic() + args.seconds
    passes = 0
    while time.monotonic() < end:
        start = time.monotonic()
        while time.monotonic() - start < args.busy_ms / 1000:
            buf += 1.0  # read and write every line of the buffer
            passes += 1
        time.sleep(max(0.0, args.period_ms / 1000 - (time.monotonic() - start)))
    print(f"{passes} passes over {args.mib} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
