"""Slowly updating side inputs that refresh live, on Prism locally and on Dataflow alike.

The RL stream stamps every rollout with the newest committed weight version, which reaches its DoFns
as a side input re-read on a clock. Two transforms make that work:

``PollEveryInterval(read, interval)``
    calls ``read()`` once per fixed window of ``interval`` seconds and yields the latest value of
    each window: the side input (use it with ``beam.pvalue.AsSingleton``).
``TicksEveryInterval(interval)``
    the main input clock: one element per ``interval``, in the same fixed windows, so each main
    element reads the value polled in its own window.

Why the main clock passes through a GroupByKey: Prism (Beam 2.77) runs a stage that reads side
inputs only when that stage's input watermark moves, and the watermark of a stage fed directly by
``PeriodicImpulse`` (a splittable DoFn) stays held by its pending residual until the impulse ends
(apache/beam#39446); a stage fed by a GroupByKey sees the watermark advance every window. Prism also
rejects the triggered global-window form of this pattern (apache/beam#31438), hence fixed windows.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import apache_beam as beam
from apache_beam.transforms.periodicsequence import PeriodicImpulse

FOREVER = 9223372036854.775  # Beam's maximum timestamp in seconds


def _windowed_impulse(interval: float, start: float | None, stop: float) -> PeriodicImpulse:
    """One element per ``interval`` seconds from ``start`` (default: now), in fixed windows of ``interval``."""
    return PeriodicImpulse(start_timestamp=time.time() if start is None else start, stop_timestamp=stop,
                           fire_interval=interval, apply_windowing=True)


class _Poll(beam.DoFn):
    def __init__(self, read: Callable[[], Any]):
        self._read = read

    def process(self, _tick):
        yield self._read()


class PollEveryInterval(beam.PTransform):
    """``read()`` once per window of ``interval`` seconds; one (latest) value per window."""

    def __init__(self, read: Callable[[], Any], interval: float, *, start: float | None = None,
                 stop: float = FOREVER):
        super().__init__()
        self._read, self._interval, self._start, self._stop = read, interval, start, stop

    def expand(self, pbegin):
        return (
            pbegin
            | "Impulse" >> _windowed_impulse(self._interval, self._start, self._stop)
            | "Read" >> beam.ParDo(_Poll(self._read))
            | "LatestPerWindow" >> beam.combiners.Latest.Globally().without_defaults()
        )


class TicksEveryInterval(beam.PTransform):
    """One timestamp element per ``interval`` seconds, windowed like ``PollEveryInterval``'s values."""

    def __init__(self, interval: float, *, start: float | None = None, stop: float = FOREVER):
        super().__init__()
        self._interval, self._start, self._stop = interval, start, stop

    def expand(self, pbegin):
        return (
            pbegin
            | "Impulse" >> _windowed_impulse(self._interval, self._start, self._stop)
            | "Key" >> beam.Map(lambda tick: (None, tick))
            | "ReleaseByWatermark" >> beam.GroupByKey()
            | "Unkey" >> beam.FlatMap(lambda keyed: sorted(keyed[1]))
        )
