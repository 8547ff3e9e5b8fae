"""`riverbed` run under cProfile that a signal switches on and off, for
profiling one phase of a benchmark (`BENCH_RIVERBED_WRAP`, bench/mqtt.py):

    BENCH_RIVERBED_WRAP=bench/_profiled_broker.py PROFILE_OUT=/tmp/phase.prof \\
        .venv/bin/python bench/mqtt.py --brokers riverbed ...
    kill -USR1 <broker pid>   # at the phase's start
    kill -USR2 <broker pid>   # at its end: the profile is written to PROFILE_OUT

`PROFILE_CPU=1` times calls by the thread's CPU time instead of the wall clock:
on a machine where the broker shares two cores with its clients, wall time
counts the moments the broker waits for a core as its own.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
import time

profile = (
    cProfile.Profile(time.thread_time) if os.environ.get("PROFILE_CPU") else cProfile.Profile()
)


def _start(*_: object) -> None:
    profile.enable()


def _stop(*_: object) -> None:
    profile.disable()
    profile.dump_stats(os.environ["PROFILE_OUT"])


signal.signal(signal.SIGUSR1, _start)
signal.signal(signal.SIGUSR2, _stop)
sys.argv = ["riverbed", *sys.argv[1:]]
runpy.run_module("riverbed.cli", run_name="__main__")
