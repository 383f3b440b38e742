"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

A scheduler stopping a job, a closed terminal or ``kill`` sends SIGTERM or
SIGHUP; by default Python dies at once and the profiling jobs it started run
on unrecorded. Raising a KeyboardInterrupt subclass instead runs the same
clean-up as Ctrl-C: started jobs are cancelled and recorded as cancelled.
"""

import signal
import threading
from contextlib import contextmanager

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by a signal other than SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.reason = f"terminated by {signal.Signals(signum).name}"


def _raise(signum, frame):
    raise Terminated(signum)


@contextmanager
def stop_cleanly():
    """While inside, SIGTERM and SIGHUP raise Terminated (main thread only: Python
    delivers signals there; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
