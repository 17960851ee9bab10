"""Which worker sweeps: one elected sweeper per set of queues, one deputy watching it, and
every other worker of the set waiting in a line that costs Redis nothing.

Without an election every worker would try a sweep round per queue per interval: Redis
work that grows with the number of idle workers. Instead the workers listening on the
same set of queues elect one of them (a string ``emq:sweeper:<queue set>`` holding its
token, with an expiry, taken with ``SET NX PX`` and kept by ``hold_sweeper``).

Before the deputy every other worker checked that election now and then (one ``SET NX``
per standby interval): cheap per worker, but a fleet-wide cost that grew with the fleet.
Now the standbys have two parts:

- **the deputy** (``<election>:deputy``, a token with an expiry): one standby checks the
  election every ``standby/2 .. standby`` with ``hold_sweeper``, which in the same call
  renews its deputy key, and takes the election once the sweeper's hold lapsed (it died,
  froze or lost Redis). A deputy that becomes the sweeper drops its deputy key;
- **the line** (``<election>:line``, a list): every other standby blocks in ``BLPOP`` on
  it, on a connection of its own, and sends nothing while it waits. When the sweeper's
  renewal (the same script) finds no deputy and an empty line, it pushes one element:
  Redis hands it to the standby that has waited longest, which takes the deputy key
  (``SET NX PX``; if another was quicker, it goes back to the line). A starting worker
  that finds the election taken tries the deputy key too, so that a fleet that starts
  together has a deputy before the sweeper's first renewal.

A line wait ends after ``line = 2 lease`` at the most (each wait a random
``line/2 .. line``); the standby then checks the election once (``SET NX PX``) and waits
again: that covers the sweeper and the deputy dying together (one host running both, a
common crash). That residue is one ``BLPOP`` and one ``SET`` per standby per ``3/4 line``
on average (0.044 commands/s at the default 30 s lease): the one idle cost that still
grows with the fleet, a third of what every standby paid before the deputy. A longer
line was cheaper still, but at 10 leases a host crash taking the sweeper and the deputy
left their jobs unrecovered for up to 5 minutes, which the chaos soak caught.

The election is per queue *set*, so in a mixed fleet (``rq worker a b`` beside
``rq worker b c``) every queue has a sweeper; a queue shared by several sets is swept by
each of their sweepers, which the sweep's own fleet-wide rate limit keeps cheap. Being
elected is a matter of cost, never of safety: two sweepers at once (a frozen one waking
up) are as safe as one, every sweep call being one atomic script.

The timings (``lease`` = lease_ms, all from the sweeper's own settings):

- an idle sweeper looks every ``idle = lease / 2`` (not less than the sweep's poll);
- it holds the election for ``hold = 4/3 idle`` and renews it at most every ``hold / 3``;
- the deputy checks every ``standby/2 .. standby`` with ``standby = 2/3 idle``, and holds
  its deputy key for ``hold`` too;

so after the sweeper's last renewal the deputy sweeps within ``hold + standby = 2 idle =
lease``: by the time a job the dead sweeper held can lapse, another sweeper is in place,
and the recovery bound (lease + grace + sweep interval) stays what it is with a live one.
A dead deputy's key lapses within ``hold``, and the sweeper's next renewal (within
``idle``) recruits the next one from the line. When the sweeper and the deputy die
together (or the sweeper within that replacement), a standby of the line takes the
election within ``hold + line`` (about 2.7 leases), and a job of the dead sweeper is back
within that plus 2 sweep intervals.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from typing import Any

from redis import Redis

from .. import scripts
from ..hold.held import new_token
from ..keys import JOB_PREFIX, QUEUE_PREFIX, sweeper_deputy_key, sweeper_election_key, sweeper_line_key

logger = logging.getLogger("rq_emq.sweep")

#: A line wait ends after at most this many leases (a random half to all of it), and the
#: standby checks the election once: the bound when the sweeper and the deputy die together.
LINE_LEASES = 2
#: How often a line wait looks whether its worker is stopping (no Redis command): a stop
#: waits this long at most, and an idle fleet's host wakes each standby's thread 4 times a second.
STOP_POLL_S = 0.25
#: A line wait's reply is read this much after Redis's own timeout at the latest.
LINE_MARGIN_S = 1.0

#: A sweeper without a deputy whose call still waits in the line (no standby took it) looks
#: at the line again only every this many renewals: a lone worker pays no more than before.
LINE_LOOK_EVERY = 4

SWEEPER, DEPUTY, LINE, CHECK = "sweeper", "deputy", "line", "check"


def _borrow(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("BLPOP")


class SweeperElection:
    """One worker's part in the sweeper election of its queue set: the sweeper, the
    deputy, or a standby in the line (or about to check the election: ``check``)."""

    def __init__(
        self,
        client: Redis,
        queues: list[str],
        idle_ms: int,
        name: str,
        queue_prefix: str = QUEUE_PREFIX,
        job_prefix: str = JOB_PREFIX,
        lease_ms: int | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self.client = client
        self.key = sweeper_election_key(queues, queue_prefix, job_prefix)
        self.deputy_key = sweeper_deputy_key(self.key)
        self.line_key = sweeper_line_key(self.key)
        self.token = new_token(name)
        self.hold_ms = max(idle_ms * 4 // 3, 1)
        self.standby_ms = max(idle_ms * 2 // 3, 1)
        self.line_ms = LINE_LEASES * (lease_ms if lease_ms is not None else 2 * idle_ms)
        #: Set when the worker stops: a line wait ends at once.
        self.stopping = stopping if stopping is not None else threading.Event()
        self.role = CHECK
        #: The last call's answer was lost (a timeout): the election or the deputy may be ours.
        self._unsure = False
        self._renewed_at = -math.inf  # monotonic send time of the last successful hold
        self._line: Any = None  # the line wait's own connection, borrowed from the client's pool
        #: Renewals left that do not look at the line (its call was still waiting: nobody stands by)
        self._skip_line_looks = 0

    @property
    def elected(self) -> bool:
        """Whether this worker is the sweeper (as far as its last answered call says)."""
        return self.role == SWEEPER and not self._unsure

    def standby_pause(self) -> float:
        """Seconds a standby waits before its next step: the deputy checks every
        ``standby/2 .. standby`` (a random phase); a standby in the line waits in Redis."""
        if self.role == LINE:
            return 0.0
        return random.uniform(self.standby_ms / 2, self.standby_ms) / 1000.0

    def hold(self) -> bool:
        """Whether this worker sweeps now. The sweeper renews the election when a third of
        its hold has passed; the deputy checks it (renewing its deputy key); a standby
        that starts checks it with one ``SET NX`` (and the deputy key with another), then waits
        in the line."""
        sent = time.monotonic()
        if self.role == SWEEPER and not self._unsure and (sent - self._renewed_at) * 1000 < self.hold_ms / 3:
            return True
        was = self.role
        try:
            if self._unsure or self.role in (SWEEPER, DEPUTY):
                self.role = self._hold_script()
            elif self.role == CHECK:
                self.role = self._check(or_deputy=True)
            else:
                self.role = self._wait_in_line()
        except Exception:
            self._unsure = True
            raise
        self._unsure = False
        if self.role == SWEEPER:
            self._renewed_at = sent
            if was != SWEEPER:
                logger.info("elected sweeper of %s", self.key)
        elif was == SWEEPER:
            logger.info("no longer the sweeper of %s (its hold lapsed); standing by", self.key)
        if self.role == DEPUTY and was != DEPUTY:
            logger.debug("deputy sweeper of %s", self.key)
        return self.role == SWEEPER

    def _hold_script(self) -> str:
        look = "1" if self._skip_line_looks == 0 else "0"
        held = int(scripts.load("hold_sweeper")(self.client, self._keys(), [self.token, self.hold_ms, look]))
        if held == 3:  # nobody waits in the line: look again only every few renewals
            self._skip_line_looks = LINE_LOOK_EVERY - 1
        elif look == "0":
            self._skip_line_looks -= 1
        return SWEEPER if held in (1, 3) else DEPUTY if held == 2 else LINE

    def _keys(self) -> list[str]:
        return [self.key, self.deputy_key, self.line_key]

    def _check(self, or_deputy: bool) -> str:
        """One plain look at the election, which takes it when free; a starting worker
        then takes the deputy key when free, so that a fleet that starts together has a
        deputy at once, not after the sweeper's first renewal (a sweeper killed in that
        gap would wait for a line wait's end)."""
        if self.client.set(self.key, self.token, nx=True, px=self.hold_ms):
            return SWEEPER
        if or_deputy and self.client.set(self.deputy_key, self.token, nx=True, px=self.hold_ms):
            return DEPUTY
        return LINE

    def _wait_in_line(self) -> str:
        """Block in the line until the sweeper calls for a deputy (then try to be it) or
        the wait ends (then check the election once)."""
        popped = self._blpop(random.uniform(self.line_ms / 2, self.line_ms) / 1000.0)
        if popped is None:  # stopping
            return LINE
        if popped:
            if self.client.set(self.deputy_key, self.token, nx=True, px=self.hold_ms):
                return DEPUTY
            return LINE
        return self._check(or_deputy=False)

    def _blpop(self, timeout_s: float) -> bool | None:
        """``BLPOP`` on the line, on the line's own connection: True when an element came,
        False on Redis's timeout, None when the worker stops meanwhile (the connection is
        then closed, which ends the wait in Redis too)."""
        if self._line is None:
            self._line = _borrow(self.client.connection_pool)
        connection = self._line
        timeout_s = max(round(timeout_s, 3), 0.001)  # Redis reads 0 as "forever"
        try:
            if self.stopping.is_set():
                return None
            # Reconnect here, not in send_command: a Sentinel-managed connection asks
            # Sentinel for the master in connect(), while redis-py 8's send_command reopens a
            # closed socket to the address it last used. This connection lives outside the
            # pool, so after a failover broke it, every BLPOP went back to the old master.
            connection.connect()
            connection.send_command("BLPOP", self.line_key, timeout_s)
            deadline = time.monotonic() + timeout_s + LINE_MARGIN_S
            while not connection.can_read(timeout=STOP_POLL_S):
                if self.stopping.is_set():
                    connection.disconnect()
                    return None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no reply to BLPOP {self.line_key} after {timeout_s} s")
            return connection.read_response() is not None
        except BaseException:
            connection.disconnect()
            raise

    def close(self) -> None:
        """Hand the line's connection back to the pool (a stopping worker)."""
        connection, self._line = self._line, None
        if connection is not None:
            connection.disconnect()
            try:
                self.client.connection_pool.release(connection)
            except Exception:  # a pool that is gone or reset: nothing to give back
                pass

    def resign(self) -> None:
        """Give the election and the deputy up (a stopping worker), so that the deputy
        takes over at its next check, or the sweeper's next renewal recruits a deputy,
        instead of after the hold."""
        self.close()
        if not (self.role in (SWEEPER, DEPUTY) or self._unsure):
            return
        self.role, self._unsure = CHECK, False
        self._renewed_at = -math.inf
        try:
            scripts.load("hold_sweeper")(self.client, self._keys(), [self.token, 0, "0"])
        except Exception as error:  # it lapses on its own
            logger.info("could not give up the sweeper election of %s: %s", self.key, error)
