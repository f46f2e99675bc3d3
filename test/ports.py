#!/usr/bin/env python3
"""The test run's one port allocator: prints a TCP port for a server of the run.

Every server a test starts (PostgreSQL on a private socket, PgBouncer, Redis,
RabbitMQ, etcd, Patroni, the HTTP services, the Citus nodes) takes its port
from here, so no two servers of a run are given the same port and none is
left to the kernel's ephemeral range, where a client's outgoing connection
may already hold it.

A run's ports start at a random multiple of 200 between 20000 and 32000
and go up from there, wrapping within that range (below Linux's ephemeral
range, 32768-60999), so two runs on one machine rarely draw from the same
place; each port is handed out once per run (the next one is kept in
$IDEM_RUN_DIR/ports, under a lock) and only after a bind to it on loopback
succeeded, so a port another run or program holds is passed over.  Without IDEM_RUN_DIR (a script run by hand) the state lives in
$TMPDIR.

    python3 test/ports.py            # one port
    import ports; ports.free_port()  # from the Python test drivers
"""
import fcntl
import os
import random
import socket
import sys
import tempfile

LOW, HIGH, BLOCK = 20000, 32000, 200


def _bindable(port):
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family)
        try:
            s.bind((host, port))
        except OSError as e:
            # a machine without IPv6 on loopback: only IPv4 matters
            if family == socket.AF_INET6 and e.errno in (97, 99):
                continue
            return False
        finally:
            s.close()
    return True


def free_port():
    state = os.path.join(os.environ.get("IDEM_RUN_DIR") or tempfile.gettempdir(), "ports")
    with open(state, "a+") as f:
        try:
            os.chmod(state, 0o666)  # the server's OS user draws from it too
        except OSError:
            pass
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().split()
        if text:
            start, nxt = int(text[0]), int(text[1])
        else:
            start = random.randrange(LOW, HIGH, BLOCK)
            nxt = start
        for _ in range(HIGH - LOW):
            port, nxt = nxt, nxt + 1
            if nxt >= HIGH:
                nxt = LOW
            if _bindable(port):
                f.seek(0)
                f.truncate()
                f.write(f"{start} {nxt}\n")
                f.flush()
                return port
    raise SystemExit(f"no free port between {LOW} and {HIGH}")


if __name__ == "__main__":
    print(free_port())
    sys.exit(0)
