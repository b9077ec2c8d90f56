"""The lean DynamoDB transport's retries: botocore's standard mode (the same retryable
errors, jittered exponential backoff and retry quota), decided without I/O, so a lean store
retries when, and as often as, a store on the SDK does."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .wire import Answer, error_code

# botocore's standard retry mode (botocore/retries/standard.py): what another try may clear.
_TRANSIENT_CODES = "RequestTimeout RequestTimeoutException PriorRequestNotComplete"
_TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
_THROTTLING_CODES = (
    "Throttling ThrottlingException ThrottledException RequestThrottledException "
    "TooManyRequestsException ProvisionedThroughputExceededException "
    "TransactionInProgressException RequestLimitExceeded BandwidthLimitExceeded "
    "LimitExceededException RequestThrottled SlowDown PriorRequestNotComplete "
    "EC2ThrottledException"
)
_MODELED_RETRYABLE = "ReplicatedWriteConflictException"  # in DynamoDB's service model
_RETRYABLE_CODES = frozenset(f"{_TRANSIENT_CODES} {_THROTTLING_CODES} {_MODELED_RETRYABLE}".split())
_MAX_BACKOFF_SECONDS = 20.0
# The retry quota's costs (a timeout costs more: it held a connection for long).
_RETRY_COST = 5
_TIMEOUT_RETRY_COST = 10
_NO_RETRY_REFUND = 1


@dataclass
class RetryQuota:
    """botocore's retry quota: retries spend capacity, successes refund it, so a failing
    endpoint stops being retried instead of tripling the load on it."""

    capacity: int = 500
    available: int = 500

    def acquire(self, amount: int) -> bool:
        # Races only misplace a few units of a soft budget: no lock on the hot path.
        if amount > self.available:
            return False
        self.available -= amount
        return True

    def release(self, amount: int) -> None:
        if self.available < self.capacity:
            self.available = min(self.capacity, self.available + amount)


@dataclass
class RetryPolicy:
    """Standard-mode retries: at most ``max_attempts`` tries in all, on the errors botocore
    retries, after ``rand() * min(2 ** (attempt - 1), 20)`` seconds, within the quota."""

    max_attempts: int
    quota: RetryQuota = field(default_factory=RetryQuota)
    random: Callable[[], float] = random.random

    def _delay(self, attempt: int, cost: int) -> float | None:
        if attempt >= self.max_attempts or not self.quota.acquire(cost):
            return None
        return self.random() * min(2.0 ** (attempt - 1), _MAX_BACKOFF_SECONDS)

    def after_exception(self, attempt: int, error: BaseException) -> tuple[float | None, int]:
        """Seconds to wait before the next try (``None``: raise it now), and the quota taken."""
        from botocore import exceptions as boto

        if not isinstance(error, (boto.ConnectionError, boto.HTTPClientError)):
            return None, 0
        timed_out = isinstance(error, (boto.ConnectTimeoutError, boto.ReadTimeoutError))
        cost = _TIMEOUT_RETRY_COST if timed_out else _RETRY_COST
        return self._delay(attempt, cost), cost

    def after_answer(
        self, attempt: int, answer: Answer, code: str | None = None
    ) -> tuple[float | None, int]:
        """:meth:`after_exception` for an answer (``None``: take it as it is); ``code``: an
        error answer's code, if read already."""
        if answer.status < 300:
            retryable = answer.checksum_failed()
        elif answer.status in _TRANSIENT_STATUSES:
            retryable = True
        else:
            retryable = (error_code(answer) if code is None else code) in _RETRYABLE_CODES
        if not retryable:
            return None, 0
        return self._delay(attempt, _RETRY_COST), _RETRY_COST

    def succeeded(self, last_cost: int) -> None:
        """A call ended in a 2xx: refund its last retry's cost, or a little if it had none."""
        self.quota.release(last_cost or _NO_RETRY_REFUND)
