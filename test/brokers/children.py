"""The processes a broker test starts (relays, consumers, producers): kept
in CHILDREN by started(), and killed when the test ends however it ends
(pipeline.py, dead_letters.py)."""
import atexit

CHILDREN = []


@atexit.register
def _no_orphans():
    """Whatever happens to the test, its relays, consumers and producers go with it."""
    for proc in CHILDREN:
        if proc.poll() is None:
            proc.kill()


def started(proc):
    CHILDREN.append(proc)
    return proc
