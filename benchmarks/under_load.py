"""Run a quickdraft command while other processes keep the CPU busy (as on a shared machine).

Starts --busy processes that spin (each wants a whole core), runs the command given after
`--` (e.g. a `quickdraft bench`), and stops the spinners when it ends; prints the load average
seen. Used to check that the cost-model draft length never loses to plain decoding by more
than noise when the machine is loaded.

    python benchmarks/under_load.py --busy 2 -- quickdraft bench --methods prompt-lookup \\
        --no-peers --per-category 2 --output bench-out/under-load
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

SPIN = "while True:\n    pass\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="spinning processes to run beside the command")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if command[0] == "quickdraft":  # the one installed beside this Python
        command = [sys.executable, "-m", "quickdraft.cli", *command[1:]]
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    try:
        code = subprocess.call(command)
        print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}", file=sys.stderr)
    finally:
        for spinner in spinners:
            spinner.kill()
    return code


if __name__ == "__main__":
    sys.exit(main())
