"""``setup_logging``: records go to ``sys.stderr`` as it is when they are emitted, so a thread that
outlives a capture of stderr (Beam's reader of the Prism runner's output) logs to the new stream
instead of printing a logging error for the closed one."""

import io
import logging
import sys
import threading

from rlax_core.utils.logging import setup_logging


def test_a_record_goes_to_stderr_as_it_is_now_not_to_a_stream_closed_since(monkeypatch):
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging("INFO")
    log = logging.getLogger("rlax.test_logging")
    log.info("one")
    first.close()  # the first capture ends; a thread that outlives it logs on
    monkeypatch.setattr(sys, "stderr", second)
    thread = threading.Thread(target=log.info, args=("two",))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    text = second.getvalue()
    assert "rlax.test_logging: two" in text and "Logging error" not in text and "Traceback" not in text
