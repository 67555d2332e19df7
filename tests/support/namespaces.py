"""What this machine lets an unprivileged test do with Linux namespaces."""

import shutil
import subprocess
import tempfile


def can_mount_a_tmpfs() -> bool:
    """Whether ``unshare -Urm`` may mount a tiny tmpfs here (user and mount namespaces allowed)."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(["unshare", "-Urm", "mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", folder],
                              capture_output=True, timeout=30)
    return done.returncode == 0
