"""Claims on schedule steps that hold across processes and VMs: one owner per step at a time.

The schedule offers a step only when no live claim holds it, so a step is not generated twice while
it is in flight. A claim is a small object in the run's store, ``ROOT/RUN-claims[/JOB]/step_N.json``
(``{"owner", "token", "expires"}``), created atomically: on a local folder under an exclusive ``flock`` of the
folder's lock file (every process of the machine), on ``gs://`` with GCS generation preconditions
(``if_generation_match=0`` creates only when absent; a takeover or a renewal matches the generation
it read). A release deletes the object, so the step is offered again at once, by whichever process
schedules next. A claim is named by its token (``try_claim`` returns it, the step's work units carry
it): a release or renewal with a token touches only that claim, so a worker late with a step whose
claim expired and was taken over neither frees nor prolongs the new owner's claim. A claim nobody
releases (a dropped bundle, a killed worker) expires: its lifetime follows the recipe's expected
step time (``loop.expected_step_s``, twice over: a step's units may queue for a step's time before a
worker takes them), and a worker generating a step renews its claim while it works
(:meth:`StepClaims.keep`), so a step slower than its lifetime is not offered twice in flight either.

Correctness does not rest on claims: group writes are idempotent, a step generated twice is written
twice under the same names. Claims save the fleet's time on its most expensive steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator, Sequence

from rlax_core.utils.identity import process_identity

LIFETIME_STEPS = 2.0  # a claim lasts this many expected step times (queueing, then generation)


def claim_lifetime_s(expected_step_s: float) -> float:
    return LIFETIME_STEPS * expected_step_s


class StepClaims:
    """Claims on ``(run, step)`` under ``root`` (a local folder or ``gs://bucket/prefix``), each live for
    ``lifetime_s`` seconds after it was taken or last renewed. ``job`` separates one job's claims from
    another's: a restarted stream does not wait out the claims of the job it replaces."""

    def __init__(self, root: str, lifetime_s: float, job: str = ""):
        if lifetime_s <= 0:
            raise ValueError(f"lifetime_s must be > 0, got {lifetime_s}")
        self.root, self.lifetime_s, self.job = root.rstrip("/"), lifetime_s, job
        self.owner = process_identity()
        self._backend = _GcsClaims() if self.root.startswith("gs://") else _LocalClaims()

    def path(self, run: str, step: int) -> str:
        return f"{self.root}/{run}-claims{'/' + self.job if self.job else ''}/step_{step:08d}.json"

    def held(self, run: str, step: int) -> bool:
        """Whether a live claim (of any process) holds ``step``."""
        claim = self._backend.read(self.path(run, step))
        return claim is not None and claim[0]["expires"] > time.time()

    def try_claim(self, run: str, step: int) -> str:
        """Claim ``step`` unless a live claim holds it: the new claim's token, or "" (falsy) when held."""
        body = self._body(uuid.uuid4().hex)
        return body["token"] if self._backend.claim(self.path(run, step), body) else ""

    def renew(self, run: str, step: int, token: str = "") -> bool:
        """Extend the claim on ``step`` (only the one named ``token``, if given) by a lifetime from now;
        False when there is none (released, or taken over)."""
        return self._backend.renew(self.path(run, step), token, self._body(token))

    def release(self, run: str, step: int, token: str = "") -> None:
        """The step is written (any claim goes) or deferred (only the claim named ``token``): it may be
        offered again at once, by any process."""
        self._backend.delete(self.path(run, step), token)

    @contextlib.contextmanager
    def keep(self, run: str, claims: Sequence[tuple[int, str]]) -> Iterator[None]:
        """Renew the claims ``(step, token)`` while the block runs (a step being generated stays
        claimed however long it takes)."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(self.lifetime_s / 4):
                for step, token in claims:
                    try:
                        self.renew(run, step, token)
                    except OSError:
                        pass  # the next renewal tries again; an expired claim costs a duplicate, no more

        thread = threading.Thread(target=renew, name="claim-renewal", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=30)

    def _body(self, token: str) -> dict:
        return {"owner": self.owner, "token": token, "expires": time.time() + self.lifetime_s}


class _LocalClaims:
    """Claim files in a local folder; every read-modify-write under an exclusive flock of its lock file."""

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[Path]:
        import fcntl

        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield target
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _read(target: Path):
        try:
            return json.loads(target.read_text()), None
        except (FileNotFoundError, ValueError):
            return None

    def read(self, path: str):
        with self._locked(path) as target:
            return self._read(target)

    def claim(self, path: str, body: dict) -> bool:
        with self._locked(path) as target:
            found = self._read(target)
            if found is not None and found[0]["expires"] > time.time():
                return False
            target.write_text(json.dumps(body))
            return True

    def renew(self, path: str, token: str, body: dict) -> bool:
        with self._locked(path) as target:
            found = self._read(target)
            if found is None or (token and found[0].get("token") != token):
                return False
            target.write_text(json.dumps({**body, "token": found[0].get("token")}))
            return True

    def delete(self, path: str, token: str) -> None:
        with self._locked(path) as target:
            found = self._read(target)
            if found is not None and (not token or found[0].get("token") == token):
                target.unlink(missing_ok=True)


class _GcsClaims:
    """Claim objects on GCS; creation, takeover and renewal conditioned on the object's generation."""

    def __init__(self):
        self._client = None

    def _blob(self, path: str):
        from google.cloud import storage

        if self._client is None:
            if os.environ.get("STORAGE_EMULATOR_HOST"):  # the tests' local GCS: no credentials to find
                from google.auth.credentials import AnonymousCredentials

                self._client = storage.Client(project="rlax", credentials=AnonymousCredentials())
            else:
                self._client = storage.Client()
        bucket, _, name = path.removeprefix("gs://").partition("/")
        return self._client.bucket(bucket).blob(name)

    def read(self, path: str):
        from google.api_core.exceptions import NotFound

        blob = self._blob(path)
        try:
            data = blob.download_as_bytes()
        except NotFound:
            return None
        return json.loads(data), blob.generation

    def _write(self, path: str, body: dict, generation: int) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self._blob(path).upload_from_string(json.dumps(body), content_type="application/json",
                                                if_generation_match=generation)
        except PreconditionFailed:
            return False  # another process created, renewed, took over or released it first
        return True

    def claim(self, path: str, body: dict) -> bool:
        if self._write(path, body, 0):  # 0: only if no such object exists
            return True
        found = self.read(path)
        if found is None:  # released between the two calls: the next tick claims it
            return False
        claim, generation = found
        return claim["expires"] <= time.time() and self._write(path, body, generation)

    def renew(self, path: str, token: str, body: dict) -> bool:
        found = self.read(path)
        if found is None or (token and found[0].get("token") != token):
            return False
        return self._write(path, {**body, "token": found[0].get("token")}, found[1])

    def delete(self, path: str, token: str) -> None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        found = self.read(path)
        if found is None or (token and found[0].get("token") != token):
            return
        with contextlib.suppress(NotFound, PreconditionFailed):  # gone, or renewed or taken over meanwhile
            self._blob(path).delete(if_generation_match=found[1])
