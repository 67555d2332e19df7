"""Why a weight version was refused. Every refusal names the version, the file and the reason."""


class WeightStoreError(RuntimeError):
    """Base class: a version cannot be published or loaded."""

    reason = "error"  # a short counter name: the store counts refusals as ``rejected/<reason>``


class VersionNotCommittedError(WeightStoreError):
    """No commit marker: the version is missing, half written, or being collected."""

    reason = "not_committed"


class VersionExistsError(WeightStoreError):
    """A committed version is immutable; publishing it again is refused."""

    reason = "exists"


class IntegrityError(WeightStoreError):
    """A tensor file is truncated, missing, or its checksum differs from the manifest."""

    reason = "integrity"


class ForeignRunError(WeightStoreError):
    """The manifest or commit marker belongs to another run."""

    reason = "foreign_run"


class ManifestError(WeightStoreError):
    """The manifest is unreadable or does not match its commit marker."""

    reason = "manifest"


class StorageTimeoutError(WeightStoreError, TimeoutError):
    """A tensor's shard reads or writes did not finish within ``io_timeout_s`` (storage hangs or crawls)."""

    reason = "timeout"
