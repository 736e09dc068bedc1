"""``python3 -m topokeeper.agent.main --config FILE [--once]``: the agent's command line and its loop."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import traceback
from typing import List, Optional

from topokeeper.agent.config import load_config
from topokeeper.agent.cycle import Agent
from topokeeper.agent.log import log
from topokeeper.wire import AgentConfigError

EXIT_OK = 0
EXIT_CRASHED = 1
EXIT_BAD_CONFIG = 2


def _guarded_cycle(agent: Agent) -> bool:
    """One cycle; a bug is logged with its traceback rather than ending the loop."""
    try:
        agent.cycle()
    except Exception as error:
        log("cycle.crashed", level="error", error=repr(error), traceback=traceback.format_exc())
        return False
    return True


def run_forever(agent: Agent) -> None:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log("agent.started", cluster=agent.config.cluster, poll_interval_seconds=agent.config.poll_interval_seconds)
    while not stop.is_set():
        _guarded_cycle(agent)
        stop.wait(agent.config.poll_interval_seconds)
    log("agent.stopped")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="topokeeper head-node pull agent")
    parser.add_argument("--config", required=True, help="the agent's JSON config file")
    parser.add_argument("--once", action="store_true", help="run one cycle and exit (tests, systemd timers)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except AgentConfigError as error:
        log("config.invalid", level="error", error=str(error))
        return EXIT_BAD_CONFIG
    agent = Agent(config)
    if args.once:
        return EXIT_OK if _guarded_cycle(agent) else EXIT_CRASHED
    run_forever(agent)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
