"""Which worker sweeps: one elected sweeper per set of queues, the rest of the fleet stands by.

Without an election every worker would try a sweep round per queue per interval: Redis
work that grows with the number of idle workers. Instead the workers listening on the
same set of queues elect one of them (a string ``emq:sweeper:<queue set>`` holding its
token, with an expiry, taken with ``SET NX PX`` and kept by ``hold_sweeper``). The
sweeper keeps it while it sweeps; a standby checks now and then (one ``SET NX PX``, at a
random phase) and takes over once the sweeper's hold lapsed: it died, froze or lost Redis.

The election is per queue *set*, so in a mixed fleet (``rq worker a b`` beside
``rq worker b c``) every queue has a sweeper; a queue shared by several sets is swept by
each of their sweepers, which the sweep's own fleet-wide rate limit keeps cheap. Being
elected is a matter of cost, never of safety: two sweepers at once (a frozen one waking
up) are as safe as one, every sweep call being one atomic script.

The timings (``lease`` = lease_ms, all from the sweeper's own settings):

- an idle sweeper looks every ``idle = lease / 2`` (not less than the sweep's poll);
- it holds the election for ``hold = 4/3 idle`` and renews it at most every ``hold / 3``;
- a standby checks every ``standby/2 .. standby`` with ``standby = 2/3 idle``;

so after the sweeper's last renewal a standby sweeps within ``hold + standby = 2 idle =
lease``: by the time a job the dead sweeper held can lapse, another sweeper is in place,
and the recovery bound (lease + grace + sweep interval) stays what it is with a live one.
"""

from __future__ import annotations

import logging
import math
import random
import time

from redis import Redis

from . import scripts
from .keys import JOB_PREFIX, QUEUE_PREFIX, sweeper_election_key
from .lease import new_token

logger = logging.getLogger("rq_emq.sweep")


class SweeperElection:
    """One worker's part in the sweeper election of its queue set."""

    def __init__(
        self,
        client: Redis,
        queues: list[str],
        idle_ms: int,
        name: str,
        queue_prefix: str = QUEUE_PREFIX,
        job_prefix: str = JOB_PREFIX,
    ) -> None:
        self.client = client
        self.key = sweeper_election_key(queues, queue_prefix, job_prefix)
        self.token = new_token(name)
        self.hold_ms = max(idle_ms * 4 // 3, 1)
        self.standby_ms = max(idle_ms * 2 // 3, 1)
        self.elected = False
        #: The last call's answer was lost (a timeout): the election may be ours.
        self._unsure = False
        self._renewed_at = -math.inf  # monotonic send time of the last successful hold

    def standby_pause(self) -> float:
        """Seconds a standby waits before it checks again (a random phase spreads the fleet)."""
        return random.uniform(self.standby_ms / 2, self.standby_ms) / 1000.0

    def hold(self) -> bool:
        """Whether this worker sweeps now: a standby checks whether the election is free
        (one ``SET NX PX``); the sweeper renews it when a third of its hold has passed."""
        sent = time.monotonic()
        if self.elected and (sent - self._renewed_at) * 1000 < self.hold_ms / 3:
            return True
        try:
            if not self.elected and not self._unsure:
                taken = bool(self.client.set(self.key, self.token, nx=True, px=self.hold_ms))
            else:
                # keep it; or, after a call whose answer was lost, find out whether that
                # SET NX took it (a standby's plain SET NX would then wait out its own hold)
                hold = scripts.load("hold_sweeper")
                taken = bool(hold(self.client, [self.key], [self.token, self.hold_ms]))
        except Exception:
            self.elected, self._unsure = False, True
            raise
        if taken and not self.elected:
            logger.info("elected sweeper of %s", self.key)
        elif self.elected and not taken:
            logger.info("no longer the sweeper of %s (its hold lapsed); standing by", self.key)
        self.elected, self._unsure = taken, False
        if taken:
            self._renewed_at = sent
        return taken

    def resign(self) -> None:
        """Give the election up (a stopping worker), so that a standby takes over at its
        next check instead of after the hold."""
        if not (self.elected or self._unsure):
            return
        self.elected = False
        self._renewed_at = -math.inf
        try:
            scripts.load("hold_sweeper")(self.client, [self.key], [self.token, 0])
        except Exception as error:  # it lapses on its own
            logger.info("could not give up the sweeper election of %s: %s", self.key, error)
