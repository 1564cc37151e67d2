"""One run per output folder: an advisory lock (flock) that the kernel releases when its process
ends, however it ends, so a crashed run never leaves a folder locked."""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".dvla.lock"


@contextmanager
def exclusive_output(folder: str | Path, command: str):
    """Hold `folder` for this process while the block runs; a second run on the same folder gets an
    error naming the holder (its command and PID)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / LOCK_FILE).open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _holder(handle.read())
            raise FileExistsError(
                f"{folder} is in use by {holder}: wait for it to finish, or give this run another "
                "output folder"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps({"command": command, "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        )
        handle.flush()
        yield folder
    finally:
        handle.close()  # releases the lock


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"`{info['command']}` (PID {info['pid']}, since {info['since']})"
    except (json.JSONDecodeError, KeyError, TypeError):
        return "another dvla run"
