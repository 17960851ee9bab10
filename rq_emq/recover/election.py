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
- **the line** (``<election>:line``, a list, and a pubsub channel of the same name): every
  other standby listens on the channel, on RQ's pubsub connection that each worker holds
  anyway (no connection of its own, nothing sent while it waits). When the sweeper's
  renewal (the same script) finds no deputy and an empty line, it pushes one element, the
  call, and announces it on the channel; the standbys that hear it race to ``LPOP`` it, and
  the one that gets it takes the deputy key (``SET NX PX``; if another was quicker, it goes
  back to listening). A call nobody took waits in the line, where a standby just come to
  the line looks first. A starting worker that finds the election taken tries the deputy
  key too, so that a fleet that starts together has a deputy before the sweeper's first
  renewal.

A standby's listening ends after ``line = 2 lease`` at the most (each a random
``line/2 .. line``); the standby then checks the election once (``SET NX PX``) and listens
again: that covers the sweeper and the deputy dying together (one host running both, a
common crash). That residue is one ``SET`` per standby per ``3/4 line`` on average (0.067
commands/s at the default 10 s lease): the one idle cost that still grows with the fleet.
A call costs one ``LPOP`` per standby that hears it, once per deputy recruited. (The line
was a ``BLPOP`` on a connection of each standby's own until the connection budget,
:mod:`rq_emq.connection.budget`: a connection per worker for a wait that seldom ends.) A longer
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

from redis import Redis

from .. import scripts
from ..hold.held import new_token
from ..keys import (
    JOB_PREFIX,
    QUEUE_PREFIX,
    sweeper_deputy_key,
    sweeper_election_key,
    sweeper_line_key,
    wake_key,
    watch_key,
)

logger = logging.getLogger("rq_emq.sweep")

#: A line wait ends after at most this many leases (a random half to all of it), and the
#: standby checks the election once: the bound when the sweeper and the deputy die together.
LINE_LEASES = 2
#: How often a listening standby looks whether its worker is stopping (no Redis command): a
#: stop waits this long at most, and an idle fleet's host wakes each standby's thread 4 times a second.
STOP_POLL_S = 0.25
#: A sweeper without a deputy whose call still waits in the line (no standby took it) looks
#: at the line again only every this many renewals: a lone worker pays no more than before.
LINE_LOOK_EVERY = 4

SWEEPER, DEPUTY, LINE, CHECK = "sweeper", "deputy", "line", "check"


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
        #: A set of several queues has an idle watcher, which the sweeper replaces when it died
        self.watched = len(set(queues)) > 1
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
        #: Set by RQ's pubsub thread when the sweeper calls on the line's channel.
        self.called = threading.Event()
        #: Just come to the line: a call made before it listened may wait there
        self._fresh_in_line = False
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
        if self.role == LINE and was != LINE:
            self._fresh_in_line = True
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
        args = [self.token, self.hold_ms, look, "1" if self.watched else "0"]
        held = int(scripts.load("hold_sweeper")(self.client, self._keys(), args))
        if held == 3:  # nobody waits in the line: look again only every few renewals
            self._skip_line_looks = LINE_LOOK_EVERY - 1
        elif look == "0":
            self._skip_line_looks -= 1
        return SWEEPER if held in (1, 3) else DEPUTY if held == 2 else LINE

    def _keys(self) -> list[str]:
        return [self.key, self.deputy_key, self.line_key, watch_key(self.key), wake_key(self.key)]

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
        """Listen for the sweeper's call (then try to take it, and the deputy key) until the
        listening ends (then check the election once). A standby just come to the line
        looks for a call first: one made before it listened waits in the list."""
        if self._fresh_in_line:
            self._fresh_in_line = False
            if self.client.lpop(self.line_key) is not None:
                return self._answer()
        called = self._listen(random.uniform(self.line_ms / 2, self.line_ms) / 1000.0)
        if called is None:  # stopping
            return LINE
        if called:
            if self.client.lpop(self.line_key) is None:
                return LINE  # another standby took the call
            return self._answer()
        return self._check(or_deputy=False)

    def _answer(self) -> str:
        """With the sweeper's call taken: the deputy key, unless another took it meanwhile."""
        if self.client.set(self.deputy_key, self.token, nx=True, px=self.hold_ms):
            return DEPUTY
        return LINE

    def heard(self) -> None:
        """The sweeper called on the line's channel (RQ's pubsub thread calls this)."""
        self.called.set()

    def _listen(self, timeout_s: float) -> bool | None:
        """Wait for a call for up to ``timeout_s``: True when one came, False when none,
        None when the worker stops meanwhile."""
        deadline = time.monotonic() + timeout_s
        while not self.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.called.wait(min(STOP_POLL_S, remaining)):
                self.called.clear()
                return True
        return None

    def resign(self) -> None:
        """Give the election and the deputy up (a stopping worker), so that the deputy
        takes over at its next check, or the sweeper's next renewal recruits a deputy,
        instead of after the hold."""
        if not (self.role in (SWEEPER, DEPUTY) or self._unsure):
            return
        self.role, self._unsure = CHECK, False
        self._renewed_at = -math.inf
        try:
            scripts.load("hold_sweeper")(self.client, self._keys(), [self.token, 0, "0", "0"])
        except Exception as error:  # it lapses on its own
            logger.info("could not give up the sweeper election of %s: %s", self.key, error)
