"""Checkpoints from the Hugging Face hub: `--checkpoint user/repo[@revision]` (any command that
takes a checkpoint) downloads the model repo into the hub cache once and loads it from there;
offline (`HF_HUB_OFFLINE=1`) it loads from the cache. Uploading is `dvla push` (dvla/push.py).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}(@[\w./-]+)?$")


def is_repo_id(text: str) -> bool:
    """Whether `text` reads as a hub model id `user/repo` (optionally `@revision`)."""
    return bool(REPO_ID.match(str(text)))


def download_checkpoint(name: str) -> Path:
    """The local (cached) folder of the hub model `user/repo[@revision]`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, _, revision = name.partition("@")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, repo_type="model"))
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"{name} is neither a local folder nor in the hub cache, and the hub cannot be reached "
            "(offline, or HF_HUB_OFFLINE is set); give a checkpoint folder or go online once"
        ) from None
    except GatedRepoError:
        raise FileNotFoundError(
            f"{repo_id} is gated: accept its terms on the hub and `huggingface-cli login`"
        ) from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"{repo_id} has no revision {revision!r} on the hub") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{name} is neither a local folder nor a model repo on the hub (a private one needs "
            "`huggingface-cli login`)"
        ) from None
