"""Audio files: reading references, writing audio atomically, loudness normalization; and `user_path`."""

from pathlib import Path


def user_path(value) -> Path:
    """A path the user gave, `~` expanded as a shell would: every path omnitts takes reads "~/v.safetensors" as
    the one in the home folder. An unknown "~name" stays as written (its error then says "file not found")."""
    path = Path(value)
    try:
        return path.expanduser()
    except RuntimeError:  # no such user, or no home folder
        return path
