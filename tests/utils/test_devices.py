"""use_cpu_cores_as_devices, in fresh processes: JAX fixes its device count when it starts."""

import json
import os
import subprocess
import sys

SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING)
from rlax_core.utils.devices import use_cpu_cores_as_devices
import jax
asked = use_cpu_cores_as_devices({count})
have = len(jax.devices())
again = use_cpu_cores_as_devices(have + 1)  # too late: the backend is up
print(json.dumps([asked, have, again]))
"""


def _run(count, xla_flags=None):
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(count=count)], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_asks_for_that_many_cpu_devices_and_reports_a_late_call():
    (asked, have, again), stderr = _run(3)
    assert (asked, have, again) == (3, 3, 3)
    assert "already running with 3 CPU device(s); 4 were asked for" in stderr


def test_defaults_to_the_cores_and_leaves_an_explicit_xla_flag_alone():
    assert _run(None)[0][:2] == [len(os.sched_getaffinity(0))] * 2
    assert _run(2, "--xla_force_host_platform_device_count=5")[0] == [5, 5, 5]
