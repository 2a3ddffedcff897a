"""Polling pages read ahead between a shard's tasks (the SQL source): the KCL's prefetch.

A KCL shard consumer's ``PrefetchRecordsPublisher`` calls GetRecords again as soon as the
shard allows it. A micro-batch's task cannot: it ends with its batch, and the shard's next
task comes only once Spark has run the batch's output, planned the next one and scheduled
it. A shard read at its limit then stands idle meanwhile, its 2 MiB/s unspent. So the
process whose task read a shard on a backlog keeps the shard's fetcher (its iterator) and
makes the next GetRecords itself, at the moment the shard's budget allows
(``ShardBudget.ready_at``). The shard's next task takes that page here, or asks this process
for it wherever it runs (``subscription_peers``, as fan-out's held subscriptions are asked).

Exactness: a page is held at the position its read follows, the last record the previous
reading handed out (and recorded); a reading takes it only when its range starts there, so
a range reads the same records whether they came ahead or not. A recorded range (a task
retried, a block recomputed) never takes one.

A page refused ahead (the shard's budget spent, say by an answer that timed out on its way
back) is kept for ``REFUSED_RETRY_S``: the next reading in this process waits that long
before its first call rather than calling into the same refusal and ending with nothing.

Bounds: at most ``MAX_PAGES`` pages a process (a page is at most 10 MiB, Kinesis' limit),
each with a thread that ends when the page is taken or ``HOLD_S`` after it came (the query
stopped, or the shard's next task read it elsewhere), letting the page go.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import KinesisDStreamError, ThrottlingError
from ..records import ExtendedSequenceNumber, GetRecordsResult
from .executor_process import ProcessOnce
from .fetch_pace import ShardBudget
from .polling import KinesisDataFetcher

log = logging.getLogger(__name__)

# Pages held (or being read) at once in one process: 10 MiB each at most.
MAX_PAGES = 8
# A page no task took within this long after it came is let go: longer than a batch of a
# query reading at the limit (about 5 s a 10 MB page), short beside an iterator's 5 minutes.
HOLD_S = 30.0
# A page refused ahead (its shard's budget spent, perhaps by an answer that never arrived):
# the next reading makes its first call this long after the refusal, Kinesis' one-second
# window, instead of at once into the same refusal.
REFUSED_RETRY_S = 1.0

PageKey = tuple[str, str]  # (the range's stream key, shard id)


@dataclass(eq=False)
class PageAhead:
    """One shard's next page, read (or being read) after ``position`` by ``fetcher``.

    ``budget`` is the shard's budget as the reading before it left it; the page is spent
    from it by the reading that takes it (``served_at``), so that reading's ``ready_at``
    counts the page when it was served.
    """

    key: PageKey
    position: ExtendedSequenceNumber
    fetcher: KinesisDataFetcher
    budget: ShardBudget
    not_before: float = 0.0  # epoch s: the reading's own pacing (maxFetchRate, minFetchPeriod)
    result: GetRecordsResult | None = None
    served_at: float = 0.0  # epoch s: when Kinesis answered
    seconds: float = 0.0  # the GetRecords call's duration
    failed: bool = False  # refused or failed: the next reading calls itself
    retry_at: float = 0.0  # epoch s: refused, so the next reading's first call waits for it
    spent: bool = False  # the rest of a page a reading cut: its bytes were counted then
    done: threading.Event = field(default_factory=threading.Event)
    gone: threading.Event = field(default_factory=threading.Event)  # taken or let go

    @property
    def due_at(self) -> float:
        """Epoch s when the page's read starts: the shard's budget allows it, and so does
        the pacing the query asked for."""
        return max(self.budget.ready_at, self.not_before)


class PrefetchRegistry:
    """The pages one process reads ahead, by (stream key, shard id)."""

    def __init__(self, max_pages: int = MAX_PAGES, hold_s: float = HOLD_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.max_pages, self.hold_s = max_pages, hold_s
        self._clock = clock
        self._pages: dict[PageKey, PageAhead] = {}
        self._lock = threading.Lock()
        self.taken = 0  # pages a reading took
        self.let_go = 0  # pages no reading took

    def fetch_after(self, key: PageKey, position: ExtendedSequenceNumber,
                    fetcher: KinesisDataFetcher, budget: ShardBudget,
                    not_before: float = 0.0) -> bool:
        """Read ``key``'s next page with ``fetcher`` (its iterator stands right after
        ``position``) once ``budget`` allows, not before ``not_before``; False if this
        process holds its most pages."""
        return self._keep(PageAhead(key, position, fetcher, budget, not_before=not_before))

    def hold(self, key: PageKey, position: ExtendedSequenceNumber,
             fetcher: KinesisDataFetcher, budget: ShardBudget, rest: GetRecordsResult) -> bool:
        """Keep ``rest``, the records after ``position`` of a page a reading cut at its cap,
        for the next reading (``fetcher`` reads on after them); False if this process holds
        its most pages."""
        page = PageAhead(key, position, fetcher, budget, result=rest, spent=True)
        page.done.set()
        return self._keep(page)

    def _keep(self, page: PageAhead) -> bool:
        page.fetcher.data_lost, page.fetcher.shard_iterator_calls = None, 0  # the next's own
        with self._lock:
            earlier = self._pages.pop(page.key, None)
            if earlier is not None:
                earlier.gone.set()
            if len(self._pages) >= self.max_pages:
                return False
            self._pages[page.key] = page
        threading.Thread(target=self._fetch, args=(page,), daemon=True,
                         name=f"prefetch-{page.key[1]}").start()
        return True

    def holds(self, key: PageKey, start: ExtendedSequenceNumber) -> bool:
        """Is a page read (or being read) ahead after ``start``?"""
        with self._lock:
            page = self._pages.get(key)
            return page is not None and page.position == start and not page.failed

    def take(self, key: PageKey, start: ExtendedSequenceNumber, wait_s: float
             ) -> PageAhead | None:
        """The page read ahead after ``start``, waiting up to ``wait_s`` for a read in
        flight. None if there is none (or it failed); a refused one is returned failed, with
        the time the reading's first call waits for (``retry_at``); a page due later than the
        wait stays here for the next reading and is returned undone (``done`` not set)."""
        with self._lock:
            page = self._pages.get(key)
            if page is None:
                return None
            if page.position != start:  # read after another position: no range wants it
                del self._pages[key]
                page.gone.set()
                return None
        if not page.done.is_set():
            if page.due_at - self._clock() > wait_s:
                return page  # not yet due: this reading leaves it to the next
            page.done.wait(wait_s)
        with self._lock:
            if self._pages.get(key) is not page:
                return None  # taken by a concurrent task of the shard
            if not page.done.is_set():
                return page
            del self._pages[key]
        page.gone.set()
        if page.failed:
            return page if page.retry_at > self._clock() else None
        self.taken += 1
        return page

    def _fetch(self, page: PageAhead) -> None:
        """Read the page when due (a kept rest is read already), then hold it for a reading
        to take, ``hold_s`` at most."""
        if not page.done.is_set():
            self._read(page)
        if page.failed:
            # kept until its retry time, for the next reading to wait for it (take)
            page.gone.wait(max(0.0, page.retry_at - self._clock()))
        if page.failed or not page.gone.wait(self.hold_s):
            with self._lock:
                if self._pages.get(page.key) is page:
                    del self._pages[page.key]
                    if not page.failed:
                        self.let_go += 1
                        log.info("%s: no task took the page read ahead after %s within "
                                 "%.0f s; letting it go", page.fetcher.name, page.position,
                                 self.hold_s)

    def _read(self, page: PageAhead) -> None:
        wait = page.due_at - self._clock()
        if wait > 0 and page.gone.wait(wait):
            page.failed = True  # replaced before it was due
            page.done.set()
            return
        began = time.perf_counter()
        try:
            page.result = page.fetcher.get_records()
            page.served_at = self._clock()
        except KinesisDStreamError as exc:  # the taking task's reading calls itself
            page.failed = True
            if isinstance(exc, ThrottlingError):
                page.retry_at = self._clock() + REFUSED_RETRY_S
            log.info("%s: reading ahead after %s failed (%s); the next task reads it%s",
                     page.fetcher.name, page.position, exc,
                     f", from {REFUSED_RETRY_S:.0f} s on" if page.retry_at else "")
        except Exception:  # noqa: BLE001 - a daemon thread: the next task reads alone
            page.failed = True
            log.warning("%s: reading ahead failed", page.fetcher.name, exc_info=True)
        page.seconds = time.perf_counter() - began
        page.done.set()

    def held(self) -> dict[PageKey, ExtendedSequenceNumber]:
        """The keys held and the positions their pages follow."""
        with self._lock:
            return {k: p.position for k, p in self._pages.items()}


# This process's registry.
prefetches = ProcessOnce(PrefetchRegistry)
