"""How many records a batch may take: ``spark.streaming.receiver.maxRate`` and backpressure.

With backpressure on, the limit follows Spark's PIDRateEstimator (same gains and the same
``spark.streaming.backpressure.*`` keys), fed by each completed batch's record count,
processing delay and scheduling delay; ``maxRate`` caps it either way. Rates are records
per second for the whole stream (Spark's are per receiver; we have one per stream).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..spark_conf import SPARK_CONF


@dataclass(frozen=True)
class RateSettings:
    max_rate: float | None = None  # records/s; None or <= 0: unlimited
    backpressure: bool = False
    initial_rate: float | None = None
    proportional: float = 1.0
    integral: float = 0.2
    derived: float = 0.0
    min_rate: float = 100.0

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str]) -> "RateSettings":
        """The rate keys as ``spark_conf.SPARK_CONF`` declares and reads them (unknown keys are
        warned about once, by ``ConsumerConfig.with_spark_conf``)."""
        values = SPARK_CONF.read(conf, source="Spark conf", warn=False).of("rate")
        max_rate = values.pop("max_rate", None)
        return cls(max_rate=max_rate if max_rate and max_rate > 0 else None, **values)


class RateController:
    def __init__(self, settings: RateSettings, batch_interval_ms: int):
        self.settings = settings
        self.batch_interval_ms = max(1, batch_interval_ms)
        self._rate: float | None = settings.initial_rate if settings.backpressure else None
        self._latest_error = 0.0
        self._latest_time_ms: int | None = None
        self._first_run = True

    @property
    def rate(self) -> float | None:
        """Current records/s limit, None when unlimited."""
        rates = [r for r in (self._rate, self.settings.max_rate) if r]
        return min(rates) if rates else None

    def batch_limit(self) -> int | None:
        rate = self.rate
        if rate is None:
            return None
        return max(1, int(rate * self.batch_interval_ms / 1000.0))

    def batch_completed(self, time_ms: int, records: int, processing_delay_ms: int,
                        scheduling_delay_ms: int) -> int | None:
        """A batch completed: the next batch's record limit (``batch_limit``), with the
        estimate updated, as Spark's RateController computes a new rate on each completion."""
        self._estimate(time_ms, records, processing_delay_ms, scheduling_delay_ms)
        return self.batch_limit()

    def _estimate(self, time_ms: int, records: int, processing_delay_ms: int,
                  scheduling_delay_ms: int) -> None:
        """Spark's PIDRateEstimator.compute, kept readable."""
        s = self.settings
        if not s.backpressure or records <= 0 or processing_delay_ms <= 0:
            return
        if self._latest_time_ms is not None and time_ms <= self._latest_time_ms:
            return
        since_update_s = ((time_ms - self._latest_time_ms) / 1000.0
                          if self._latest_time_ms is not None else self.batch_interval_ms / 1000.0)
        processing_rate = records / processing_delay_ms * 1000.0
        if self._first_run or self._rate is None:
            self._rate, self._latest_error = processing_rate, 0.0
            self._first_run = False
        else:
            error = self._rate - processing_rate
            historical_error = scheduling_delay_ms * processing_rate / self.batch_interval_ms
            d_error = (error - self._latest_error) / since_update_s
            self._rate = max(self._rate - s.proportional * error - s.integral * historical_error
                             - s.derived * d_error, s.min_rate)
            self._latest_error = error
        self._latest_time_ms = time_ms
