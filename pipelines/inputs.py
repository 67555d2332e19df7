"""What a command checks before heavy work: every input it names exists and is what it claims.

A Beam pipeline meets a bad input on a worker, minutes later and many log lines deep, or (an input
that every row fails to adapt) finishes "successfully" with nothing. So each command resolves what
it was given first, and each failure is an ``InputError`` (one line from ``pipelines.cli``):

* files, folders and globs, local or gs://, in a folder that is complete if a batch command wrote it
  (:func:`require_input`, ``rlax_core.data.completion``);
* datasets: ``hf:NAME[:CONFIG]:SPLIT`` parsed and found, a folder a ``save_to_disk`` folder (:func:`require_dataset`);
* models: a checkpoint path, ``weights:STORE[@V]`` or ``checkpoint:DIR[@STEP]`` with that version
  (:func:`require_model`);
* training sets: Example rows (:func:`require_examples`);
* results: a job that wrote no row from a non-empty input failed, unless asked to allow it (:func:`require_rows`).
"""

from __future__ import annotations

from rlax_core.config import InputError

# A folder that datasets' save_to_disk wrote holds one of these.
SAVE_TO_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def require_input(path: str, what: str, rewriting: str | None = None) -> None:
    """``path`` (file, folder or glob; local or gs://) names something; ``hf:`` names are datasets (below).
    ``rewriting``: the output folder of the command asking, which need not be complete."""
    from apache_beam.io.filesystems import FileSystems

    if path.startswith("hf:"):
        require_dataset(path, what)
        return
    from rlax_core.data.completion import require_complete

    # First: the folder of a batch command that did not finish may not hold the files asked for yet.
    try:
        require_complete(path, what, rewriting)
    except InputError:
        raise
    except Exception:  # noqa: BLE001 - an unreachable bucket, a malformed glob: said by the check below
        pass
    try:
        found = FileSystems.exists(path) or any(m.metadata_list for m in FileSystems.match([path]))
    except Exception as error:  # noqa: BLE001 - a malformed glob or an unreachable bucket: say which input
        raise InputError(f"{what} {path}: cannot be read ({_one_line(error)})") from None
    if not found:
        raise InputError(f"{what} {path}: no such file or folder")


def require_dataset(path: str, what: str, rewriting: str | None = None) -> None:
    """A raw dataset a batch command reads (``transforms.io.ReadRawRecords``): its name resolves.

    ``hf:NAME[:CONFIG]:SPLIT`` must parse and its dataset be found (``datasets.load_dataset_builder``:
    metadata only, no download); a local folder must be one ``save_to_disk`` wrote (a folder of data
    files is read through a glob, ``DIR/*.jsonl``, or as ``hf:DIR``).
    """
    import fsspec

    from transforms.io import file_kind, parse_hf_path

    if path.startswith("hf:"):
        try:
            name, config, split = parse_hf_path(path)
        except ValueError as error:
            raise InputError(f"{what} {_one_line(error)}") from None
        try:
            import datasets

            builder = datasets.load_dataset_builder(name, config)
        except Exception as error:  # noqa: BLE001 - not found, unreachable, a bad config: all one line
            raise InputError(f"{what} {path}: cannot open the dataset ({_one_line(error)})") from None
        splits = builder.info.splits
        if splits and split not in splits:
            raise InputError(f"{what} {path}: no split {split!r}; splits: {', '.join(sorted(splits))}")
        return
    require_input(path, what, rewriting)
    if file_kind(path) != "hf" or any(c in path for c in "*?["):
        return
    fs, root = fsspec.core.url_to_fs(path)
    if fs.isdir(root) and not any(fs.exists(f"{root.rstrip('/')}/{marker}") for marker in SAVE_TO_DISK_MARKERS):
        raise InputError(f"{what} {path}: a folder, but not one that datasets' save_to_disk wrote; give its "
                         f"files ({path.rstrip('/')}/*.jsonl, *.csv, *.parquet) or hf:{path}")
    if not fs.isdir(root):
        raise InputError(f"{what} {path}: not a .jsonl, .json, .csv or .parquet file by its name")


def require_model(spec: str) -> None:
    """A model a command loads: a checkpoint path, or ``weights:STORE[@V]`` / ``checkpoint:DIR[@STEP]``
    with that version (``rlax_core.policy.source.check_policy``)."""
    from rlax_core.policy.source import check_policy, parse_policy_source

    require_input(parse_policy_source(spec).path, "model")
    check_policy(spec)


def require_examples(path: str, what: str = "train set") -> int:
    """Example rows at ``path`` (``rlax_core.data.training_set``); returns how many."""
    from rlax_core.data.training_set import read_examples

    require_input(path, what)
    try:
        return len(read_examples(path))
    except FileNotFoundError as error:
        raise InputError(f"{what} {path}: {_one_line(error)}") from None
    except InputError as error:
        raise InputError(f"{what} {_one_line(error)}") from None


def require_rows(command: str, written: int, read: int, *, what: str, see: str, allow_empty: bool) -> None:
    """A job that wrote no ``what`` has failed, unless ``allow_empty`` (``--allow-empty``) says it may."""
    if written or allow_empty:
        return
    source = "its input holds no rows" if not read else f"none of its {read:,} input rows was kept"
    raise InputError(f"{command} wrote no {what}: {source} ({see}); pass --allow-empty to accept an empty result")
