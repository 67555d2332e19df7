"""Whether a process has really ended, for tests that kill processes and then take what they held."""

import os

import psutil


def has_exited(pid: int) -> bool:
    """True once every thread of ``pid`` has exited (it may still wait, a zombie, for its reaper).

    A zombie state alone is not enough: a killed process's main thread turns zombie while its other
    threads are still dying, and the files it holds (a run folder's lock) are closed with the last one.
    """
    try:
        status = psutil.Process(pid).status()
        if status == psutil.STATUS_ZOMBIE:
            return os.listdir(f"/proc/{pid}/task") == [str(pid)]
        return status == psutil.STATUS_DEAD
    except (psutil.NoSuchProcess, FileNotFoundError):
        return True
