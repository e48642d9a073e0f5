"""Data cache, checksums and atomic downloads (urllib only)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

from .errors import DataError

__all__ = ["cache_dir", "resolve_root", "ensure_file", "md5sum", "ENV_VAR"]

#: Environment variable naming the data cache when no ``data_dir`` is given.
ENV_VAR = "GRADENGINES_DATA"

_CHUNK = 1 << 20
_TIMEOUT_S = 60


def cache_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir`` if given, else ``$GRADENGINES_DATA``, else ``~/.cache/gradengines``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "gradengines"


def resolve_root(data_dir: str | os.PathLike | None, download: bool) -> Path:
    """The data root; an explicitly given ``data_dir`` must exist unless downloading."""
    root = cache_dir(data_dir)
    if data_dir is not None and not download and not root.is_dir():
        raise DataError(f"data directory {root} does not exist; create it and put the data files there, "
                        "or pass --download")
    return root


def md5sum(path: str | os.PathLike) -> str:
    """Hex md5 of the file at ``path``."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def ensure_file(
    directory: str | os.PathLike,
    filename: str,
    url: str,
    md5: str | None,
    download: bool,
    verify: bool = False,
) -> Path:
    """Return ``directory/filename``, downloading it from ``url`` if missing and ``download``.

    A present file is returned as is (its md5 is checked only if ``verify``).
    A download goes to a temporary file in ``directory``, its md5 is checked,
    and only then is it moved into place with ``os.replace``.
    """
    directory = Path(directory)
    path = directory / filename
    if path.is_file():
        if verify and md5 is not None:
            got = md5sum(path)
            if got != md5:
                raise DataError(f"checksum mismatch for {path}: expected md5 {md5}, got {got}; delete it and pass "
                                f"--download, or replace it with the file from {url}")
        return path
    if not download:
        raise DataError(f"missing {path}: put the file '{filename}' there (from {url}), or pass --download")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create data directory {directory}: {_one_line(exc.strerror or exc)}") from None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{filename}.", suffix=".part", dir=directory)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.md5(usedforsecurity=False)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
        except Exception as exc:  # URLError, HTTPError, timeouts, bad URLs, connection resets
            reason = getattr(exc, "reason", None) or exc
            raise DataError(f"could not download {url}: {_one_line(reason)}; put {filename} in {directory} "
                            "by hand") from None
        got = digest.hexdigest()
        if md5 is not None and got != md5:
            raise DataError(f"checksum mismatch for {url}: expected md5 {md5}, got {got}; nothing was saved, "
                            f"retry or put {filename} in {directory} by hand")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
