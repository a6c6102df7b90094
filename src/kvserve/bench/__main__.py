"""``python -m kvserve.bench {serve,sweep,throughput} ...`` (same as ``kvserve bench ...``)."""

import sys

from kvserve.bench.cli import build_parser, run_bench


def _main() -> int:
    parser = build_parser()
    return run_bench(parser.parse_args(["bench", *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(_main())
