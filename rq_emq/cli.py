"""The ``rq-emq`` command line (operators' tools grow here)."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rq-emq", description="Lease-based crash recovery for RQ.")
    parser.add_argument("--version", action="version", version=f"rq-emq {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
