"""The one retry policy: a few attempts with exponential backoff, for transient failures only.

Built on `tenacity` (a well-kept library) rather than hand-written loops: the
caller says which exceptions are transient, how many retries, the first wait;
every wait is reported through `on_retry`, and the last failure is re-raised
as it was, with the number of attempts for the message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# First retry waits this long, then doubles. Tests make it short.
BACKOFF_SECONDS = 1.0


class GaveUp(Exception):
    """Wraps the last transient failure after every attempt failed (`attempts`, `error`)."""

    def __init__(self, error: BaseException, attempts: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.attempts = attempts


def with_retries(
    attempt: Callable[[], T],
    *,
    retries: int,
    transient: Callable[[BaseException], bool],
    backoff: float | None = None,
    on_retry: Callable[[int, int, float, BaseException], None] | None = None,
    max_wait: float | None = None,
    wait_hint: Callable[[BaseException], float | None] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """Call `attempt` until it returns; retry (at most `retries` times) only errors `transient` accepts.

    A non-transient error is raised at once, unchanged. When the last attempt fails
    transiently, `GaveUp` carries that error and the attempt count. `on_retry(n, tries, wait,
    error)` is told before each wait. `max_wait` caps a wait; `wait_hint(error)` may ask for
    another wait (a registry's Retry-After); `sleep` replaces `time.sleep` (tests).
    """
    import tenacity  # not at import time: the CLI starts faster

    tries = max(0, retries) + 1
    first = BACKOFF_SECONDS if backoff is None else backoff

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None and state.next_action is not None:
            err = state.outcome.exception()
            assert err is not None
            on_retry(state.attempt_number, tries, state.next_action.sleep, err)

    backoff_wait = tenacity.wait_exponential(multiplier=first, exp_base=2, min=0)

    def wait(state: tenacity.RetryCallState) -> float:
        seconds = float(backoff_wait(state))
        err = state.outcome.exception() if state.outcome is not None else None
        hinted = wait_hint(err) if wait_hint is not None and err is not None else None
        if hinted is not None:
            seconds = hinted
        return min(seconds, max_wait) if max_wait is not None else seconds

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(tries),
        wait=wait,
        retry=tenacity.retry_if_exception(transient),
        before_sleep=before_sleep,
        # looked up at call time, so tests can replace time.sleep
        sleep=sleep if sleep is not None else (lambda seconds: time.sleep(seconds)),
        reraise=False,
    )
    try:
        return retrying(attempt)
    except tenacity.RetryError as e:
        last = e.last_attempt.exception()
        assert last is not None
        raise GaveUp(last, e.last_attempt.attempt_number) from last
