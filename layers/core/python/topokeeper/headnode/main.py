"""The head-node program's command line."""

from __future__ import annotations

import math
import os
import sys
from typing import (
    Mapping,
    NoReturn,
    Optional,
    Sequence,
)

from topokeeper.headnode.config_dir import open_regular
from topokeeper.headnode.modes import execute
from topokeeper.headnode.output import new_result, publish, read_upload_target, render_result
from topokeeper.wire import EXIT_CODES, LOCK_WAIT_SECONDS, MODES, one_line

DEFAULT_LOCK_TIMEOUT = LOCK_WAIT_SECONDS


class _UsageError(Exception):
    pass


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    import argparse  # noqa: PLC0415 - only when the program runs, not when tests import the modules

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise _UsageError(message)

    parser = _Parser(
        prog="topokeeper-head-node.pyz", description="Apply, dry-run or verify a topokeeper bundle on a head node."
    )
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("bundle", help="bundle.json, or - to read it from stdin")
    parser.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT, metavar="SECONDS")
    parser.add_argument("--scontrol", metavar="PATH", help="the scontrol to run (default: found, see above)")
    parser.add_argument("--trusted-key", metavar="PATH", help="refuse a bundle not signed by this key (see above)")
    parser.add_argument("--upload-result", metavar="PATH", help="where a document too large for stdout goes")
    try:
        args = parser.parse_args(argv)
        if not (math.isfinite(args.lock_timeout) and args.lock_timeout >= 0):
            parser.error("--lock-timeout: expected a number of seconds >= 0")
    except _UsageError as error:
        result = new_result(None)
        result["outcome"], result["error"] = "refused", "usage: %s" % error
        print(render_result(result))
        return EXIT_CODES["refused"]
    try:
        if args.bundle == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(open_regular(args.bundle, follow=True), "rb") as handle:
                data = handle.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        result = new_result(args.mode)
        result["outcome"], result["error"] = "refused", one_line("cannot read the bundle: %s" % error)
    else:
        environment = os.environ if environ is None else environ
        result = execute(args.mode, text, args.lock_timeout, environment, args.scontrol, trusted_key=args.trusted_key)
    target, target_error = None, None
    if args.upload_result is not None:
        try:
            target = read_upload_target(args.upload_result)
        except (OSError, ValueError) as error:
            target_error = one_line("--upload-result %s: %s" % (args.upload_result, error))[:300]
    print(publish(result, target, target_error))
    return EXIT_CODES[result["outcome"]]


if __name__ == "__main__":
    sys.exit(main())
