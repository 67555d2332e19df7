"""Run one untrusted Python program in a sandbox; a standalone script, not an importable module.

``run.py`` starts this file once per process with ``python -I -S --serve FD`` as root (a zygote):
for each sandbox it sends a job over that socket, and a forked handler builds the sandbox, runs the
program and writes back a report, both in ``marshal`` form (built in, and both ends are trusted: the
program writes neither). A sandbox then costs a fork here rather than an interpreter start and its
imports. It uses nothing but the standard library so that it does not depend on the package being
importable.

The job's program runs as PID 1 of fresh PID, mount, network, IPC and UTS namespaces, chrooted into a
tmpfs that holds only its own writable directory (``/sandbox``, size-capped), ``/dev/null``,
``/dev/zero``, ``/dev/urandom`` and read-only bind mounts of the Python install and the shared
libraries it loads (and of the job's ``readonly_files``, each at the path the job names). Before ``execve`` it gets resource limits (CPU time, address space, file size,
process count, open files, no core dumps), an empty supplementary group list, a uid/gid of its own
that no other process uses (so the process-count limit is its own and ``kill(-1)`` reaches only it),
``no_new_privs`` and a parent-death signal. Dropping from root to that uid clears every capability,
so the chroot cannot be escaped and nothing else on the host can be signalled.

When the kernel refuses namespaces the program still gets the limits, a private directory, the
stripped environment and the unprivileged uid, and the report says which isolation is missing.

Channels back: fd 1 and 2 (the program's stdout/stderr) and fd 3 (the program's results), each read
up to ``output_bytes`` (the results up to the job's ``results_bytes`` when it gives one, for a caller
whose results grow with its work); a stream cut there is named in the report's ``overflowed``. A
failure to build the sandbox comes back on a close-on-exec pipe of its own (``setup_error``), which
closes as the program starts, so no program can claim one. A prepared sandbox (``start`` in the job)
is built and its program started before its input exists: the program's stdin is then the caller's
pipe, and the wall clock (``idle_seconds`` until then) starts when the caller's settings arrive on the
start pipe; end-of-file there without settings gives the run up. A job may also hand the program
pipe ends of its caller's (``channels``: program fd -> inherited fd, all above 3): this launcher keeps no copy of them once the program has
them, so the peer at the other end sees end-of-file when the program's last process is gone. A
``lifeline`` (an inherited read end the program does not get) ends the run early: when its write end
closes (the peer is done), the program has ``LIFELINE_GRACE_S`` to exit, then it is killed. The wall-clock limit is enforced here, from outside the
namespace: when it passes, PID 1 is SIGKILLed and the kernel kills every process left in its namespace.
"""

import ctypes
import fcntl
import marshal
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MNT_DETACH = 2
SETUP_FAILED_EXIT = 125  # the child could not build the sandbox (the setup channel says why)
RESULT_FD = 3
CHANNEL_FD_BASE = 256  # where inherited channel fds wait until the child moves them to their places
# The child's setup-error pipe waits here (close-on-exec) until ``execve``: a program can neither write
# to it nor forge it with its own exit code and stderr, which are the program's to choose.
SETUP_FD = CHANNEL_FD_BASE - 1
LIFELINE_GRACE_S = 1.0  # after the lifeline closes, the program has this long to end by itself

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    _check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                      ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def _bind_readonly(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    # A bind mount takes its flags only on a remount.
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_root(job: dict, root: str) -> None:
    """Populate the new root (already a tmpfs mounted at ``root``) and chroot into it."""
    uid = job["uid"]
    for path in job["readonly_dirs"]:
        os.makedirs(root + path, exist_ok=True)
        _bind_readonly(path, root + path)
    for link, target in job["symlinks"]:
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        if not os.path.lexists(root + link):
            os.symlink(target, root + link)
    for inside, source in job.get("readonly_files", ()):  # e.g. a SQL task's database, never writable
        os.makedirs(os.path.dirname(root + inside), exist_ok=True)
        open(root + inside, "w").close()
        _bind_readonly(source, root + inside)
    os.makedirs(root + "/dev", exist_ok=True)
    for device in ("/dev/null", "/dev/zero", "/dev/urandom"):
        open(root + device, "w").close()
        _mount(device, root + device, None, MS_BIND)
    work = root + "/sandbox"
    os.makedirs(work)
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={job['limits']['workdir_bytes']},mode=0700,uid={uid},gid={uid}")
    _write_files(job["files"], work, uid)
    os.symlink("sandbox", root + "/tmp")
    # Nothing but /sandbox stays writable.
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    os.chroot(".")
    os.chdir("/sandbox")


def _write_files(files: dict, directory: str, uid: int) -> None:
    for name, text in files.items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chown(path, uid, uid)


def _limit_and_drop(job: dict) -> None:
    limits = job["limits"]
    cpu = limits["cpu_seconds"]
    for which, value in (
        (resource.RLIMIT_CORE, 0),
        # SIGXCPU at the soft limit; SIGKILL one second later if it is ignored.
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"]),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
    ):
        resource.setrlimit(which, value if isinstance(value, tuple) else (value, value))
    uid = job["uid"]
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    # Set after the uid change, which clears it: if this launcher dies, the program dies with it.
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")


def _child(job: dict, isolated: bool, root: str, pipes: dict, channels: list, setup: int) -> None:
    """In the forked child (PID 1 of the new namespaces when isolated): build, limit, exec.

    A failure before the program starts is written to ``setup`` (close-on-exec, so it closes as the
    program starts): the one sign that the sandbox could not be built which the program cannot fake.
    """
    try:
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, (_, write_end) in zip((1, 2, RESULT_FD), (pipes["stdout"], pipes["stderr"], pipes["results"])):
            os.dup2(write_end, fd)
        for target, held in channels:
            os.dup2(held, target)
        if isolated:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks to the host
            _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            _build_root(job, root)
        else:
            os.chmod(root, 0o700)
            if os.geteuid() == 0:
                os.chown(root, job["uid"], job["uid"])
            _write_files(job["files"], root, job["uid"])
            os.chdir(root)
        _limit_and_drop(job)
        first_free = max([RESULT_FD] + [target for target, _ in channels]) + 1
        os.closerange(first_free, setup)
        os.closerange(setup + 1, 1 << 16)
        env = {**job["env"], "HOME": os.getcwd(), "TMPDIR": os.getcwd()}
        if not os.access(job["python"], os.X_OK):
            raise PermissionError(f"{job['python']} is not executable by the sandbox's unprivileged uid; without "
                                  "namespaces the Python install must be readable by all users")
        os.execve(job["python"], [job["python"], "-I", "-S", "-B", *job["argv"]], env)
    except BaseException as error:  # noqa: BLE001 - anything here means no sandbox: say why and stop
        os.write(setup, f"sandbox setup failed: {type(error).__name__}: {error}\n".encode())
    finally:
        os._exit(SETUP_FAILED_EXIT)


def _unshare() -> tuple[bool, str]:
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if os.geteuid() != 0:
        return False, "not root: namespaces, chroot and the uid drop are unavailable"
    if libc.unshare(flags) != 0:
        return False, f"unshare refused ({os.strerror(ctypes.get_errno())})"
    return True, ""


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (the sandbox's own uid): stragglers outside a PID namespace."""
    if os.geteuid() != 0:
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _private_directory() -> str:
    """A new empty 0700 directory under $TMPDIR or /tmp (tempfile.mkdtemp without importing tempfile)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(100):
        path = os.path.join(base, "rlax-sandbox-" + os.urandom(8).hex())
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free sandbox directory name under {base}")


def run_job(job: dict) -> dict:
    """Build one sandbox, run the job's program in it to its end or its limits, and report how it went."""
    limits = job["limits"]
    cap = limits["output_bytes"]
    caps = {"results": job.get("results_bytes") or cap}
    isolated, why_not = _unshare() if job.get("isolate", True) else (False, "isolation disabled by the caller")
    root = _private_directory()
    # Out of the way of the fds the child is about to set up (an inherited one may well be fd 3).
    channels = [(target, fcntl.fcntl(inherited, fcntl.F_DUPFD, CHANNEL_FD_BASE)) for target, inherited in job["channels"]]
    for _, inherited in job["channels"]:
        os.close(inherited)
    lifeline = None  # the child does not get it: it closes every fd above its channels
    if job.get("lifeline") is not None:
        lifeline = fcntl.fcntl(job["lifeline"], fcntl.F_DUPFD, CHANNEL_FD_BASE)
        os.close(job["lifeline"])
    go = None  # a prestarted sandbox: its wall clock starts when the caller writes its settings here
    if job.get("start") is not None:
        go = fcntl.fcntl(job["start"], fcntl.F_DUPFD, CHANNEL_FD_BASE)
        os.close(job["start"])
    go_data = bytearray()
    pipes = {name: os.pipe() for name in ("stdout", "stderr", "results", "setup")}
    setup_read, setup_write = pipes["setup"]
    pipes["setup"] = setup_read, fcntl.fcntl(setup_write, fcntl.F_DUPFD_CLOEXEC, SETUP_FD)
    os.close(setup_write)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(job, isolated, root, pipes, channels, pipes["setup"][1])
    for read_end, write_end in pipes.values():
        os.close(write_end)
    for _, held in channels:
        os.close(held)

    buffers = {name: bytearray() for name in pipes}
    overflowed = set()
    open_fds = {pipes[name][0]: name for name in pipes}
    try:  # readable once the child has ended: no polling delay between its exit and the report
        exited = os.pidfd_open(pid)
    except (AttributeError, OSError):
        exited = None
    deadline = start + (job["idle_seconds"] if go is not None else limits["wall_seconds"])
    timed_out, stopped, status, usage = False, False, None, None
    while True:
        if status is None:
            done, status_now, usage_now = os.wait4(pid, os.WNOHANG)
            if done:
                status, usage = status_now, usage_now
                if not isolated:  # PID 1 gone kills its namespace; without one, kill stragglers of the uid
                    _kill_uid(job["uid"])
                deadline = min(deadline, time.monotonic() + 1.0)  # drain what is left, briefly
        if status is not None and not open_fds:
            break
        now = time.monotonic()
        if now >= deadline:
            if status is None:
                timed_out = not stopped
                os.kill(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
                if not isolated:
                    _kill_uid(job["uid"])
                deadline = time.monotonic() + 1.0
                continue
            break
        watched = list(open_fds) + [fd for fd in (lifeline, go, exited if status is None else None) if fd is not None]
        ready, _, _ = select.select(watched, [], [], min(0.05, deadline - now))
        if go is not None and go in ready:
            ready.remove(go)
            chunk = os.read(go, 4096)
            go_data += chunk
            if not chunk:  # the settings are complete: the job starts now (none: the caller gave it up)
                os.close(go)
                go, settings = None, marshal.loads(bytes(go_data)) if go_data else None
                start = deadline = time.monotonic()
                if settings is not None:
                    caps["results"] = settings.get("results_bytes") or caps["results"]
                    deadline = start + limits["wall_seconds"]
                else:
                    stopped = True
        if exited is not None and exited in ready:
            ready.remove(exited)  # wait4 at the top of the loop reaps it
        if lifeline is not None and lifeline in ready:
            ready.remove(lifeline)
            if not os.read(lifeline, 4096):  # the peer is done: the program may go
                os.close(lifeline)
                lifeline, stopped = None, True
                deadline = min(deadline, time.monotonic() + LIFELINE_GRACE_S)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                del open_fds[fd]
                os.close(fd)
                continue
            buffer = buffers[open_fds[fd]]
            room = max(0, caps.get(open_fds[fd], cap) - len(buffer))
            if len(chunk) > room:
                overflowed.add(open_fds[fd])
            buffer += chunk[:room]
    wall = time.monotonic() - start
    if isolated:
        libc.umount2(root.encode(), MNT_DETACH)  # the mount lives in our namespace until we exit
        os.rmdir(root)
    else:
        import shutil  # only here: the isolated path starts faster without it

        shutil.rmtree(root, ignore_errors=True)
    report = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "stopped": stopped,
        "wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "uid": job["uid"],
        "isolated": isolated,
        "isolation_missing": why_not,
        "overflowed": sorted(overflowed),
        "stdout": buffers["stdout"].decode("utf-8", "replace"),
        "stderr": buffers["stderr"].decode("utf-8", "replace"),
        "results": buffers["results"].decode("utf-8", "replace"),
        "setup_error": buffers["setup"].decode("utf-8", "replace").strip(),
    }
    return report


def _handle(fds: list) -> None:
    """In a handler forked by ``serve``: read the job, run it, write ``pid`` and the report on the reply pipe.

    ``fds``: the job's read end, the reply's write end, then the fds the job hands on (its ``channels``
    and ``lifeline`` name them by position in this list).
    """
    job_fd, reply_fd, handed = fds[0], fds[1], fds[2:]
    os.write(reply_fd, b"%d\n" % os.getpid())  # first: the caller's outer timeout kills this process group
    try:
        with open(job_fd, "rb") as source:
            job = marshal.loads(source.read())
        job["channels"] = [[target, handed[position]] for target, position in job["channels"]]
        for name in ("lifeline", "start"):
            if job.get(name) is not None:
                job[name] = handed[job[name]]
        reply = {"report": run_job(job)}
    except BaseException as error:  # noqa: BLE001 - no sandbox ran: the caller must hear why
        reply = {"error": f"{type(error).__name__}: {error}"}
    data = memoryview(marshal.dumps(reply))
    while data:
        data = data[os.write(reply_fd, data):]


def serve(control: int) -> None:
    """Run every job the caller sends on ``control`` (a SOCK_SEQPACKET socket), each in a forked handler.

    This process starts once and forks a handler per sandbox, so a sandbox costs a fork here instead
    of an interpreter start and its imports. A message carries only fds (``_handle``); the caller's
    end closing (it exited) ends this server. Handlers are reaped by the kernel.
    """
    import socket  # only in the server

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    channel = socket.socket(fileno=control)
    channel.setblocking(True)  # the file may come O_NONBLOCK from a caller with a default socket timeout
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 16, 64)
        except InterruptedError:
            continue
        if not message and not fds:
            return
        try:
            pid = os.fork()
        except OSError:  # EAGAIN or ENOMEM on a loaded host: closing the fds fails this job alone
            pid = -1
        if pid == 0:
            status = 0
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the handler waits for its own sandbox
                channel.close()
                os.setsid()
                _handle(fds)
            except BaseException:  # noqa: BLE001 - the caller sees a reply without a report
                status = 1
            finally:
                os._exit(status)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    serve(int(sys.argv[sys.argv.index("--serve") + 1]))
