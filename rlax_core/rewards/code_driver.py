"""Inside the program's sandbox: run the candidate program, then compute what the judge asks for.

A standalone script (standard library only) that ``code_verifier.py`` ships into the program's sandbox
beside ``plain_data.py``; its job (JSON) arrives on stdin. It decides nothing. The program runs once
(then the task's setup code, in the same namespace); the driver says on fd 5 whether that worked, then answers the
requests that arrive on fd 4 from the judge (``code_judge.py``, another sandbox): look up names, call
a function with arguments. Each answer is one JSON line of plain data (``plain_data.py``); an object
that is not plain data goes back as a numbered handle the judge can only call or pass back. Each
request runs under its own alarm; the sandbox's CPU and wall-clock limits stand behind it.

The program can rewrite this driver, its builtins or the channel: it gains nothing by it, because
all that leaves this process is data that the judge decodes into builtin values, which an honest
function could have returned just as well. The tests are not here to be read.
"""

import builtins
import json
import os
import signal
import sys

sys.path.insert(0, os.getcwd())  # ``python -I`` leaves the script's directory off the path
import plain_data  # noqa: E402 - shipped beside this file

REQUEST_FD, REPLY_FD = 4, 5
MESSAGE_CHARS = 400


class CallTimeout(BaseException):
    """Raised by the alarm; a BaseException so that ``except Exception`` in the program cannot eat it."""


def _on_alarm(signum, frame):
    raise CallTimeout()


def _error(error: BaseException) -> dict:
    """A plain description of an exception (its ``str`` is the program's to choose; it only ends up in details)."""
    if isinstance(error, CallTimeout):
        return {"type": "timeout", "message": "ran past its time limit"}
    try:
        message = str(error)
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        message = "<unprintable>"
    code = getattr(error, "errno", None)
    # The nearest builtin class, so that a test's ``except ValueError`` still catches a subclass of it.
    builtin = next((cls.__name__ for cls in type(error).__mro__ if getattr(builtins, cls.__name__, None) is cls),
                   "BaseException")
    return {"type": type(error).__name__, "builtin": builtin, "message": message[-MESSAGE_CHARS:],
            "errno": code if type(code) is int else None}


class Handles:
    """Objects the judge may refer to by number: they stay alive (and keep their ids) for the whole run."""

    def __init__(self):
        self.objects, self.numbers = [], {}

    def number(self, value) -> tuple[int, str]:
        key = id(value)
        if key not in self.numbers:
            self.numbers[key] = len(self.objects)
            self.objects.append(value)
        return self.numbers[key], type(value).__name__

    def object(self, number: int, type_name: str):
        if not 0 <= number < len(self.objects):
            raise LookupError(f"no object #{number}")
        return self.objects[number]


def _timed(seconds: float, work):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return work()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _answer(request: dict, namespace: dict, handles: Handles, seconds: float) -> dict:
    """The reply to one request: a value, or the exception the program raised."""
    op = request.get("op")
    if op == "resolve":
        found = {name: namespace[name] for name in request["names"] if name in namespace}
        return {"found": [[name, plain_data.to_wire(value, handles.number)] for name, value in found.items()]}
    if op != "call":
        raise ValueError(f"unknown request {op!r}")
    target = plain_data.from_wire(request["target"], handles.object)
    args = plain_data.from_wire(request["args"], handles.object)
    kwargs = plain_data.from_wire(request["kwargs"], handles.object)
    # Encoding runs under the alarm too: draining a returned generator runs the program's code.
    return _timed(seconds, lambda: _call(target, args, kwargs, request, handles))


# Arguments whose contents a call can change: a test running in-process would see the change.
_CONTAINERS = (list, dict, set, bytearray, tuple)


def _call(target, args: list, kwargs: dict, request: dict, handles: Handles) -> dict:
    """The call's value (or exception) and the arguments it changed.

    The program works on copies of the test's arguments; the judge mirrors what the call did to them
    (``mutated``: their new contents), and an argument that the value holds, or is, travels as a
    reference to the judge's own object: a test that looks at an argument after the call, or at the
    identity of what came back, sees what it would in-process.
    """
    sent = list(zip((["arg", i] for i in range(len(args))), request["args"], args))
    sent += [(["kwarg", key], wire, kwargs[key]) for key, wire in request["kwargs"].get("v", ())
             if type(key) is str and key in kwargs]
    shared = {id(value): where for where, _, value in sent if isinstance(value, _CONTAINERS)}
    try:
        result = target(*args, **kwargs)
    except CallTimeout:
        raise
    except BaseException as error:  # noqa: BLE001 - the program's exception is its answer
        reply = {"error": _error(error)}
    else:
        reply = {"value": plain_data.to_wire(result, handles.number, shared)}
    mutated = []
    for where, before, value in sent:
        if isinstance(value, _CONTAINERS):
            others = {key: tag for key, tag in shared.items() if key != id(value)}  # itself: its contents
            now = plain_data.to_wire(value, handles.number, others)
            if now != before:
                mutated.append([*where, now])
    if mutated:
        reply["mutated"] = mutated
    return reply


def _line(message: dict) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _send(line: bytes) -> None:
    data = memoryview(line)
    while data:
        data = data[os.write(REPLY_FD, data):]


def main() -> None:
    with open(0, "rb", closefd=False) as handle:  # the job arrives on stdin once the check starts
        job = json.loads(handle.read())
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.setrecursionlimit(10_000)
    seconds, max_bytes = job["per_call_seconds"], job["max_reply_bytes"]
    requests = os.fdopen(REQUEST_FD, "rb")
    # Not "__main__": a program's ``if __name__ == "__main__":`` block (reading input, ...) stays off.
    namespace = {"__name__": "candidate"}
    try:
        _timed(seconds, lambda: exec(compile(job["program"], "candidate.py", "exec"), namespace))
        _timed(seconds, lambda: exec(compile(job["setup"], "test_setup.py", "exec"), namespace))
    except BaseException as error:  # noqa: BLE001 - a program that does not run is the judge's to score
        _send(_line({"ready": False, "error": _error(error)}))
        return
    _send(_line({"ready": True}))
    handles = Handles()
    for line in requests:
        request = json.loads(line)
        try:
            reply = _answer(request, namespace, handles, seconds)
        except BaseException as error:  # noqa: BLE001 - the program's exception is its answer
            reply = {"error": _error(error)}
        reply["id"] = request["id"]
        line = _line(reply)
        if len(line) > max_bytes:
            line = _line({"id": request["id"], "error": {"type": "ResultTooLarge",
                                                        "message": f"the answer is over {max_bytes} bytes as plain data"}})
        _send(line)
    # Normal after the judge's last test; before it, the detail of a "crashed" verdict says so.
    os.write(2, b"driver: the judge closed the request channel\n")


if __name__ == "__main__":
    status = 0
    try:
        main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.write(2, b"driver: the judge stopped reading answers\n")
    except BaseException as failure:  # noqa: BLE001 - the driver itself broke (or the program broke it): say so
        os.write(2, f"driver failed: {type(failure).__name__}: {failure}\n".encode(errors="replace"))
        status = 1
    os._exit(status)  # skip interpreter teardown: the program may have left threads or atexit hooks behind
