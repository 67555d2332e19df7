"""A slowly updating side input that refreshes as soon as its value changes, on Prism and on Dataflow.

The RL stream stamps every rollout with the newest committed weight version, which reaches its DoFns
as a side input, and schedules work on a main-input clock. ``WatchValue(read, poll_s, heartbeat_s)``
makes both from one watcher:

``latest``
    the value, once per fixed window of ``poll_s`` seconds in which it was emitted (read it with
    ``beam.pvalue.AsList``: a streaming runner may fire a window's pane more than once);
``ticks``
    one element per emission, in the same window as its value, so a main element reads the value
    that made it.

The watcher (a splittable DoFn, ``_Watch``) calls ``read()`` every ``poll_s`` inside one bundle and
emits when the value changes, or when ``heartbeat_s`` passed without a change (a schedule re-offers
deferred work on the heartbeat). It then holds the bundle until the emission's window closes, so the
watermark it reports at the bundle's end releases the window at once: a new value reaches the main
input about ``poll_s`` (and a runner's bundle round trip) after it appears. A watcher ticking at a
fixed rate instead paid for a bundle per tick: at 10 ticks a second an idle Prism stream took 64% of
a core on this project's 2-core machine, CPU the engine and the trainer were waiting for.

Why the main clock passes through a GroupByKey: Prism (Beam 2.77) runs a stage that reads side
inputs only when that stage's input watermark moves, and the watermark of a stage fed directly by a
splittable DoFn stays held by its pending residual (apache/beam#39446); a stage fed by a GroupByKey
sees the watermark advance with every window. Prism also rejects the triggered global-window form of
this pattern (apache/beam#31438), hence fixed windows.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Callable

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms import core, window
from apache_beam.utils.timestamp import Timestamp

FOREVER = 9223372036854.775  # Beam's maximum timestamp in seconds
_NOTHING = object()  # no value emitted yet
_MARGIN_S = 0.001  # past a window's end by more than Beam's microsecond rounding of it
# Per watch, its last emission (value, wall clock, its window's end), for this process: each resumed
# bundle of the watch may run in a new DoFn instance. A watch resumed in another process emits its
# value once more, which is harmless: ticks are idempotent and values are per window.
_emitted: dict[str, tuple[Any, float, float]] = {}


class _WatchSpan(core.RestrictionProvider):
    """The watch's restriction: the wall-clock milliseconds ``[start, stop)`` it may run through."""

    def initial_restriction(self, element):
        start_s, stop_s = element
        return OffsetRange(int(start_s * 1000), int(min(stop_s, FOREVER) * 1000))

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        return 8  # one small element at a time; the backlog is never larger

    def truncate(self, element, restriction):
        return None  # a drained pipeline stops watching at once


class _Watch(beam.DoFn):
    """Emits ``read()`` when it changes, or ``heartbeat_s`` after the last emission; see the module docstring."""

    def __init__(self, read: Callable[[], Any], poll_s: float, heartbeat_s: float):
        self._read, self._poll_s, self._heartbeat_s = read, poll_s, heartbeat_s
        self._id = uuid.uuid4().hex  # which watch's last emission ``_emitted`` holds

    def _last(self) -> tuple[Any, float, float]:
        """(value, wall clock, end of its window) of the last emission."""
        return _emitted.get(self._id, (_NOTHING, 0.0, 0.0))

    @beam.DoFn.unbounded_per_element()
    def process(self, element, tracker=beam.DoFn.RestrictionParam(_WatchSpan()),
                watermark=beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider())):
        claimed = tracker.current_restriction().start - 1
        while True:
            now = time.time()
            claimed = max(int(now * 1000), claimed + 1)
            if not tracker.try_claim(claimed):
                return  # past the stop time: the watch, and the stream it drives, ends
            value = self._read()
            last, last_emitted_t, last_window_end = self._last()
            if now >= last_window_end + _MARGIN_S and (value != last or now - last_emitted_t >= self._heartbeat_s):
                window_end = (math.floor(now / self._poll_s) + 1) * self._poll_s
                _emitted[self._id] = (value, now, window_end)
                yield window.TimestampedValue(value, now)
                # Hold the bundle until the emission's window has closed: the watermark reported
                # below then releases that window downstream without waiting for another bundle,
                # and no later emission can fall into it.
                while time.time() < window_end + _MARGIN_S:
                    time.sleep(window_end + _MARGIN_S - time.time())
                break
            time.sleep(self._poll_s)
        current = watermark.current_watermark()
        reached = Timestamp.of(time.time())
        if current is None or reached > current:
            watermark.set_watermark(reached)
        tracker.defer_remainder()


class WatchValue(beam.PTransform):
    """``read()`` watched every ``poll_s`` seconds from ``start`` (default: now) until ``stop``; returns
    ``(ticks, latest)``, both in fixed windows of ``poll_s`` (see the module docstring)."""

    def __init__(self, read: Callable[[], Any], poll_s: float, *, heartbeat_s: float = 1.0,
                 start: float | None = None, stop: float = FOREVER):
        super().__init__()
        if poll_s <= 0 or heartbeat_s <= 0:
            raise ValueError(f"poll_s and heartbeat_s must be > 0, got {poll_s} and {heartbeat_s}")
        self._read, self._poll_s, self._heartbeat_s = read, poll_s, heartbeat_s
        self._start, self._stop = start, stop

    def expand(self, pbegin):
        start = time.time() if self._start is None else self._start
        watched = (
            pbegin
            | "Impulse" >> beam.Impulse()
            | "Span" >> beam.Map(lambda _, span=(start, self._stop): span)
            | "Watch" >> beam.ParDo(_Watch(self._read, self._poll_s, self._heartbeat_s))
            | "Window" >> beam.WindowInto(window.FixedWindows(self._poll_s))
        )
        latest = watched | "LatestPerWindow" >> beam.combiners.Latest.Globally().without_defaults()
        ticks = (
            watched
            | "Key" >> beam.Map(lambda value: (None, value))
            | "ReleaseByWatermark" >> beam.GroupByKey()
            | "Unkey" >> beam.FlatMap(lambda keyed: keyed[1])
        )
        return ticks, latest
