"""Inside the judge's sandbox: run a task's tests and decide every verdict; the program is elsewhere.

A standalone script (standard library only) that ``code_verifier.py`` ships into a sandbox of its own,
beside ``plain_data.py``; its job (JSON) arrives on stdin. The program under test runs in another
sandbox (other namespaces, another uid) behind ``code_driver.py``; the only link is a pair of pipes: requests go out
on fd 4, plain-data answers come back on fd 5. Verdicts go to fd 3, which only this process holds.

Trusted names come first: the task's prompt (HumanEval's helpers such as ``poly``; its entry point is
then replaced), the setup code, builtins, and standard-library modules a test names. Every other
name a test uses comes from the program: a plain value, or a handle (``Remote``) that can be called
(the call runs in the program's process) or passed back to it, and is otherwise opaque: equal only to
itself, with no truth value and no attributes. Values cross only as builtin types
(``plain_data.decode``), so an object with a lying ``__eq__``, a rewritten harness or a forged line
on the channel can at most claim a value an honest function could have returned. Each test runs here
under its own alarm.
"""

import ast
import builtins
import errno
import json
import os
import signal
import sys
import traceback

sys.path.insert(0, os.getcwd())  # ``python -I`` leaves the script's directory off the path
import plain_data  # noqa: E402 - shipped beside this file

TO_PROGRAM_FD, FROM_PROGRAM_FD, VERDICT_FD = 4, 5, 3
DETAIL_CHARS = 400
REPEAT_S = 0.25


class TestTimeout(BaseException):
    """Raised by the alarm; a BaseException so that ``except Exception`` in a test cannot eat it."""


class ProgramEnded(BaseException):
    """The program's process ended (its sandbox's report says how); nothing more can be asked of it."""


class ProgramError(Exception):
    """An exception the program raised that has no builtin counterpart here (its type is the program's own)."""


class ChannelError(Exception):
    """An answer that is not plain data, or too large."""


# What the judge itself raised during the current test: its timeout, the program's end, what the channel
# cannot carry. A test may catch any of them (``except BaseException``, or a name the program bound to
# ``BaseException``), so each is recorded here too, and a test that met one takes its verdict from it:
# never a pass that running the test in-process would not have given.
_judge_raised: list = []


def _judge(error: BaseException) -> BaseException:
    _judge_raised.append(error)
    return error


class Remote:
    """An object that lives in the program's process: callable there, opaque here."""

    __slots__ = ("_number", "_type", "_program")

    def __init__(self, number: int, type_name: str, program: "Program"):
        self._number, self._type, self._program = number, type_name, program

    def __call__(self, *args, **kwargs):
        return self._program.call(self, args, kwargs)

    def __bool__(self):
        raise _judge(TypeError(f"the program returned a {self._type} object, which is not plain data: it has no "
                               "truth value here"))

    def __getattr__(self, name):
        error = AttributeError(f"the program's {self._type} object is not plain data: a test can call it or pass it "
                               f"back, not read .{name}")
        # A dunder is Python's own probe (``getattr(x, "__name__", None)``), not a test reading state.
        raise error if name.startswith("__") else _judge(error)

    def __repr__(self):
        return f"<the program's {self._type} object>"


class Program:
    """The far end of the channel: requests out, one plain-data answer per request back."""

    def __init__(self, max_reply_bytes: int):
        self.max_reply_bytes = max_reply_bytes
        self.buffer = bytearray()
        self.skipping = False  # inside an over-long line: drop bytes up to its end
        self.last_id = 0
        self.outstanding = None  # the id of a request a timeout left unanswered
        self.ended = None  # why the program can answer nothing more
        self.unresponsive = False  # ended because it stopped answering, not because its process is gone
        self.remotes: dict[int, Remote] = {}

    def remote(self, number: int, type_name: str) -> Remote:
        if number not in self.remotes:  # one Remote per program object, so ``is`` works across calls
            self.remotes[number] = Remote(number, type_name, self)
        return self.remotes[number]

    def _line(self) -> bytes:
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line, self.buffer = bytes(self.buffer[:end]), self.buffer[end + 1:]
                if self.skipping:
                    self.skipping = False
                    continue
                return line
            if len(self.buffer) > self.max_reply_bytes:
                self.buffer.clear()
                if not self.skipping:
                    self.skipping = True
                    self.outstanding = None  # that was its answer: the next test need not wait for one
                    raise _judge(ChannelError(f"the program's answer is over {self.max_reply_bytes} bytes"))
            chunk = os.read(FROM_PROGRAM_FD, 1 << 16)
            if not chunk:
                self.ended = "the program's process ended"
                raise _judge(ProgramEnded(self.ended))
            self.buffer += chunk

    def message(self) -> dict:
        """The next line that parses as a JSON object (the program may write anything; other lines are noise)."""
        while True:
            try:
                message = json.loads(self._line())
            except (ValueError, RecursionError):
                continue
            if type(message) is dict:
                return message

    def _request(self, request: dict) -> dict:
        if self.ended:
            raise _judge((TestTimeout if self.unresponsive else ProgramEnded)(self.ended))
        self.last_id += 1
        request["id"] = self.outstanding = self.last_id
        data = memoryview((json.dumps(request, separators=(",", ":")) + "\n").encode())
        try:
            while data:
                data = data[os.write(TO_PROGRAM_FD, data):]
        except BrokenPipeError:
            self.ended = "the program's process ended"
            raise _judge(ProgramEnded(self.ended)) from None
        while True:
            reply = self.message()
            if reply.get("id") == request["id"] and type(reply.get("id")) is int:
                self.outstanding = None
                return reply

    def settle(self, seconds: float) -> None:
        """Before a test: wait for an answer a timed-out call still owes, so it does not eat this test's time."""
        if self.outstanding is None or self.ended:
            return
        try:
            _timed(seconds, lambda: self._await(self.outstanding))
        except TestTimeout:
            self.ended = "the program stopped answering (a call ran past its time limit and never returned)"
            self.unresponsive = True

    def _await(self, request_id: int) -> None:
        while self.message().get("id") != request_id:
            pass
        self.outstanding = None

    def _value(self, reply: dict, argument=None):
        if "value" in reply:
            try:
                return plain_data.from_wire(reply["value"], self.remote, argument)
            except plain_data.BadWireData as error:
                raise _judge(ChannelError(f"the program's answer is not plain data: {error}")) from None
        raise _as_exception(reply.get("error"))

    def call(self, target: Remote, args: tuple, kwargs: dict):
        try:
            request = {"op": "call", "target": plain_data.to_wire(target, _number_of),
                       "args": plain_data.to_wire(list(args), _number_of),
                       "kwargs": plain_data.to_wire(dict(kwargs), _number_of)}
        except plain_data.NotPlainData as error:
            raise _judge(plain_data.NotPlainData(f"an argument cannot be sent to the program: {error}")) from None
        reply = self._request(request)
        # What the call did to the program's copies of the arguments happens to the test's own, as in-process;
        # an argument in the answer (or the answer itself) is the test's own object.
        sent = {("arg", i): arg for i, arg in enumerate(args)} | {("kwarg", k): arg for k, arg in kwargs.items()}

        def argument(tag):
            return sent[tuple(tag)]  # anything else (not a list, not an argument): bad data

        for change in reply.get("mutated") or ():
            if type(change) is not list or len(change) != 3 or tuple(change[:2]) not in sent:
                raise _judge(ChannelError("the program's answer names an argument it was not given"))
            try:
                new = plain_data.from_wire(change[2], self.remote, argument)
            except plain_data.BadWireData as error:
                raise _judge(ChannelError(f"the program's changed argument is not plain data: {error}")) from None
            if not _mirror(sent[tuple(change[:2])], new):
                raise _judge(ChannelError("the program's changed argument does not match the one it was given"))
        return self._value(reply, argument)

    def resolve(self, names: list) -> dict:
        reply = self._request({"op": "resolve", "names": names})
        found = reply.get("found")
        if type(found) is not list:
            raise _as_exception(reply.get("error"))
        values = {}
        for item in found:
            if type(item) is list and len(item) == 2 and item[0] in names:
                try:
                    values[item[0]] = plain_data.from_wire(item[1], self.remote)
                except plain_data.BadWireData:
                    continue  # left undefined: a test that uses it meets a NameError
        return values


def _mirror(old, new) -> bool:
    """Make ``old`` (a test's object) hold what ``new`` holds, in place, keeping nested containers where the
    shapes match; False when ``old`` cannot be changed into ``new`` in place (another type, or immutable)."""
    if type(old) is not type(new):
        return False
    if isinstance(old, (list, bytearray)):
        if len(old) == len(new) and isinstance(old, list):
            for i, item in enumerate(new):
                if not _mirror(old[i], item) and not _same(old[i], item):
                    old[i] = item
        else:
            old[:] = new
        return True
    if isinstance(old, dict):
        for key in [key for key in old if key not in new]:
            del old[key]
        for key, item in new.items():
            if not (key in old and (_mirror(old[key], item) or _same(old[key], item))):
                old[key] = item
        return True
    if isinstance(old, set):
        old.clear()
        old.update(new)
        return True
    if isinstance(old, tuple):  # immutable itself; the containers in it may have changed
        return len(old) == len(new) and all(_mirror(a, b) or _same(a, b) for a, b in zip(old, new))
    return _same(old, new)


def _same(a, b) -> bool:
    """Equal builtin values of one type (the judge's own ``==``, on plain data only); a handle is only itself."""
    if type(a) is Remote or type(b) is Remote:
        return a is b
    if type(a) is float and type(b) is float and a != a and b != b:  # two NaNs: the same value as sent
        return True
    try:
        return type(a) is type(b) and a == b
    except Exception:  # noqa: BLE001 - e.g. a nested handle's missing truth value
        return False


def _number_of(value) -> tuple:
    if type(value) is not Remote:
        raise plain_data.NotPlainData(f"a {type(value).__name__} object is not plain data")
    return value._number, value._type


def _as_exception(error) -> BaseException:
    """The exception a test sees for one the program raised: a builtin one when the name is a builtin's."""
    if type(error) is not dict:
        return _judge(ChannelError("the program's answer is neither a value nor an error"))
    name, message = str(error.get("type", "?"))[:100], str(error.get("message", ""))[:DETAIL_CHARS]
    if name == "timeout":
        return _judge(TestTimeout("a call to the program ran past its time limit"))
    if name == "ResultTooLarge":
        return _judge(ChannelError(f"{name}: {message}"))
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = getattr(builtins, str(error.get("builtin", "")), None)  # the program's subclass of a builtin
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not Exception:
        try:
            exception = cls(message)
        except Exception:  # noqa: BLE001 - a builtin that wants other arguments (UnicodeDecodeError, ...)
            return ProgramError(f"{name}: {message}")
        if isinstance(exception, OSError) and type(error.get("errno")) is int:
            exception.errno = error["errno"]
        return exception
    return ProgramError(f"{name}: {message}")


# Set by ``main`` while a test runs: ends the judge with that test's timeout verdict. A test that caught
# its timeout and is still running when the alarm fires again gets no second exception to catch:
# raising into a test that loops over ``except BaseException`` can land where CPython cannot take it
# ("SystemError: error return without exception set"), and the judge would end with no verdict.
_end_stuck_test = None


def _on_alarm(signum, frame):
    if _end_stuck_test is not None and any(isinstance(error, TestTimeout) for error in _judge_raised):
        _end_stuck_test()  # does not return
    raise _judge(TestTimeout())


def _timed(seconds: float, work):
    # It fires again every REPEAT_S: a test that catches the timeout does not get to run on.
    signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    try:
        return work()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _reason(error: BaseException) -> str:
    if isinstance(error, TestTimeout):
        return "timeout"
    if isinstance(error, ProgramEnded):
        return "ended"  # code_verifier.py turns this into how the program's process ended
    if isinstance(error, MemoryError):
        return "memory"
    if isinstance(error, AssertionError):
        return "failed"
    if isinstance(error, OSError) and error.errno == errno.EFBIG:
        return "file_size"
    return "error"


def _detail(error: BaseException) -> str:
    if isinstance(error, TestTimeout):
        return str(error) or "test exceeded its time limit"
    lines = traceback.format_exception_only(type(error), error)
    return "".join(lines).strip()[-DETAIL_CHARS:]


def _free_names(sources: list) -> tuple[list, list]:
    """Names the tests read but never bind, split into builtins and the rest."""
    read, bound = set(), set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # that test fails on its own when it runs
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    free = read - bound
    return sorted(free & set(dir(builtins))), sorted(free - set(dir(builtins)))


def _remote_names(candidates: list, namespace: dict, entry_point: str) -> list:
    """The names to take from the program: the entry point, and what nothing trusted defines."""
    remote = []
    for name in candidates:
        if name in namespace or name == entry_point:
            continue
        if name in sys.stdlib_module_names:
            try:
                namespace[name] = __import__(name)  # a module the test names: the real one, not the program's
                continue
            except ImportError:
                pass
        remote.append(name)
    return remote + ([entry_point] if entry_point else [])


def _prompt_definitions(prompt: str, namespace: dict) -> None:
    """Run the task's prompt here: its helpers are the trusted ones. A prompt that ends in a bare signature
    gets a ``pass`` body."""
    try:
        code = compile(prompt, "prompt.py", "exec")
    except SyntaxError:
        code = compile(prompt + "    pass\n", "prompt.py", "exec")
    exec(code, namespace)


def main() -> None:
    with open(0, "rb", closefd=False) as handle:  # the job arrives on stdin once the check starts
        job = json.loads(handle.read())
    verdicts = os.fdopen(VERDICT_FD, "w", buffering=1)
    tests, seconds = job["tests"], job["per_test_seconds"]

    # Each verdict line is at most ``verdict_line_bytes`` (its detail cut to fit), so the caller sizes
    # the channel from the test count, whatever the tests print or raise.
    def report(index: int, reason: str, detail: str) -> None:
        line = json.dumps({"index": index, "reason": reason, "detail": detail[:DETAIL_CHARS * 2]}) + "\n"
        if len(line) > job["verdict_line_bytes"]:  # escapes (\uXXXX) grew it: keep the verdict, cut the detail
            line = json.dumps({"index": index, "reason": reason, "detail": detail[:DETAIL_CHARS // 4]}) + "\n"
        verdicts.write(line)

    def report_all(reason: str, detail: str, start: int = 0) -> None:
        for index in range(start, len(tests)):
            report(index, reason, detail)

    signal.signal(signal.SIGALRM, _on_alarm)
    sys.setrecursionlimit(10_000)
    namespace = {"__name__": "tests"}
    try:
        shadowing, candidates = _free_names(tests)
        if job["prompt"] and job["entry_point"]:
            _timed(seconds, lambda: _prompt_definitions(job["prompt"], namespace))
    except BaseException as error:  # noqa: BLE001 - the task itself is broken: fail closed, say why
        report_all("error", "the task's tests cannot be judged: " + _detail(error))
        return
    try:
        # Setup code that builds the program's own objects (MBPP's trees of ``Node``) cannot run here;
        # the names it would have bound then come from the program, where it did run.
        _timed(seconds, lambda: exec(compile(job["setup"], "test_setup.py", "exec"), namespace))
    except BaseException:  # noqa: BLE001
        pass
    program = Program(job["max_reply_bytes"])
    try:
        ready = _timed(job["ready_seconds"], program.message)
        if ready.get("ready") is not True:
            error = _as_exception(ready.get("error"))
            report_all(_reason(error), "program: " + _detail(error))
            return
        remote = _remote_names(candidates, namespace, job["entry_point"])
        found = _timed(seconds, lambda: program.resolve(remote + shadowing))
    except BaseException as error:  # noqa: BLE001
        report_all(_reason(error), "program: " + _detail(error))
        return
    namespace.update({name: found[name] for name in remote if name in found})
    note = "".join(f"; note: the program defines {name}, but {name} here is the builtin"
                   for name in shadowing if name in found)
    judge_pid = os.getpid()

    def end_stuck_test(index: int) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if os.getpid() == judge_pid:  # a child that a test forked has no say
            report(index, "timeout", "test exceeded its time limit, caught the timeout and kept running")
            report_all("error", f"not run: test {index} caught the judge's timeout and kept running", index + 1)
            verdicts.flush()
        os._exit(0)

    global _end_stuck_test
    for index, test in enumerate(tests):
        program.settle(seconds)
        _judge_raised.clear()
        _end_stuck_test = lambda index=index: end_stuck_test(index)
        ended_by = None
        try:
            _timed(seconds, lambda: exec(compile(test, f"test_{index}.py", "exec"), namespace))
        except BaseException as error:  # noqa: BLE001 - every failure is a verdict
            ended_by, reason, detail = error, _reason(error), _detail(error) + note
        else:
            reason, detail = "passed", ""
        if _judge_raised and ended_by is not _judge_raised[0]:
            first = _judge_raised[0]  # the test caught what the judge raised: the judge's verdict stands
            reason, detail = _reason(first), _detail(first) + " (caught by the test; the judge's verdict stands)"
        _end_stuck_test = None
        if os.getpid() != judge_pid:  # a child that a test forked has no say
            os._exit(0)
        report(index, reason, detail)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip teardown: a test may have left threads behind
