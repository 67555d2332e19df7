"""The base of the RL stream: a side input that refreshes live, on a change, on the local runner.

A watcher re-reads a file (standing in for the weight store's ``latest()``). The test rewrites the
file mid-run and checks that main elements see the new value while the pipeline is live (not all at
the end), that a change makes a tick by itself (the heartbeat is longer than the run), that an
unchanged value ticks only on the heartbeat, and that the pipeline ends by itself when the watch stops.
"""

import json
import threading
import time
from pathlib import Path

import apache_beam as beam

from pipelines.runners import cached_prism_binary, pipeline_options
from transforms.live_side_input import WatchValue

RUN_SECONDS = 12
POLL_S = 0.05


class _ReadFile:
    """Picklable ``read()`` for WatchValue."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self) -> str:
        return Path(self.path).read_text().strip()


class _Record(beam.DoFn):
    """Appends (tick, wall time, side value) to a file the test reads while the pipeline runs."""

    def __init__(self, path: str):
        self._path = path

    def process(self, tick, side_values, window=beam.DoFn.WindowParam):
        with open(self._path, "a") as sink:
            sink.write(json.dumps({"tick": tick, "window": float(window.start), "values": side_values}) + "\n")
        yield tick


def _read_log(log_file: Path) -> list[dict]:
    if not log_file.exists():
        return []
    return [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]


def _run(tmp_path, heartbeat_s: float, flip: bool) -> tuple[list[dict], list[float]]:
    # Without Prism, Beam would fall back to a runner that replays side inputs, and the test would fail
    # for the wrong reason; say what is missing instead.
    assert cached_prism_binary() is not None, "Prism is not built: run `make setup` (scripts/setup_prism.sh)"
    value_file, log_file = tmp_path / "latest.txt", tmp_path / "seen.jsonl"
    value_file.write_text("v1")
    start = time.time()
    stop = start + RUN_SECONDS
    flipped_at: list[float] = []

    def flip_when_v1_seen():
        deadline = time.time() + RUN_SECONDS + 60
        while time.time() < deadline:
            if any(row["tick"] == "v1" for row in _read_log(log_file)):
                value_file.write_text("v2")
                flipped_at.append(time.time())
                return
            time.sleep(0.05)

    flipper = threading.Thread(target=flip_when_v1_seen, daemon=True)
    if flip:
        flipper.start()
    pipeline = beam.Pipeline(options=pipeline_options([], streaming=True))
    ticks, latest = pipeline | "Watch" >> WatchValue(_ReadFile(str(value_file)), POLL_S, heartbeat_s=heartbeat_s,
                                                     start=start, stop=stop)
    _ = ticks | "Record" >> beam.ParDo(_Record(str(log_file)), beam.pvalue.AsList(latest))
    result = pipeline.run()
    result.wait_until_finish(duration=(RUN_SECONDS + 120) * 1000)
    if flip:
        flipper.join(timeout=1)
    assert str(result.state).endswith("DONE"), f"pipeline did not stop by itself: {result.state}"
    return sorted(_read_log(log_file), key=lambda row: row["window"]), flipped_at


def test_a_changed_value_ticks_live_by_itself_and_the_pipeline_stops(tmp_path):
    # The heartbeat is far longer than the run: only the first read and the change can make ticks.
    # Live, not replayed at the end: the file changes only once a tick of v1 has reached the main
    # input, and the watch reads v2 only while it runs.
    seen, flipped_at = _run(tmp_path, heartbeat_s=10 * RUN_SECONDS, flip=True)
    ticks = [row["tick"] for row in seen]
    assert flipped_at, f"no main element saw the first value: {ticks}"
    assert ticks == ["v1", "v2"], f"a value ticked without a change or a heartbeat, or the change made none: {ticks}"
    _side_input_is_the_ticks_window_value(seen)


def _side_input_is_the_ticks_window_value(seen: list[dict]) -> None:
    # Prism may hand a main element its window's side input before materializing it (empty then);
    # transforms.rollout.ScheduleSteps falls back on the tick's own value.
    assert all(set(row["values"]) <= {row["tick"]} for row in seen), f"a tick read another window's value: {seen}"


def test_an_unchanged_value_ticks_again_only_on_the_heartbeat(tmp_path):
    heartbeat_s = 2.0
    seen, _ = _run(tmp_path, heartbeat_s=heartbeat_s, flip=False)
    assert {row["tick"] for row in seen} == {"v1"}
    _side_input_is_the_ticks_window_value(seen)
    assert len(seen) >= 2, f"the heartbeat never ticked: {seen}"
    # Emission times, not arrival times: a slow machine only spaces them further. Two emissions a
    # heartbeat apart may fall into windows one window shorter apart.
    starts = [row["window"] for row in seen]
    assert all(b - a >= heartbeat_s - POLL_S - 1e-6 for a, b in zip(starts, starts[1:])), starts
