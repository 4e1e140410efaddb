"""An image folder checked before it is read: nothing in it is skipped without a word.

``datasets``' ``imagefolder`` silently leaves out what it cannot read as a file — a broken symbolic link,
a FIFO, a directory named ``x.png`` — and a class folder without images (which shifts every later class
id of a backbone that names no classes) — and a folder with no image at all fails inside ``datasets``
with a message that names no folder.  :func:`check_image_folder` refuses each, naming the path;
hidden entries (``.name``) are ignored, as ``imagefolder`` ignores them.
"""

from __future__ import annotations

import os
import stat

from .labels import DataError


def _image_extensions() -> frozenset[str]:
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return frozenset(e.lower() for e in ImageFolder.EXTENSIONS)


def _problem(path: str) -> str | None:
    """Why the image entry ``path`` cannot be read as an image file, or ``None``."""
    try:
        mode = os.stat(path).st_mode  # follows symbolic links
    except OSError:
        return "is a broken symbolic link" if os.path.islink(path) else "cannot be read"
    if stat.S_ISDIR(mode):
        return "is a directory named like an image"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a FIFO, socket or device)"
    return None


def check_image_folder(root: str) -> None:
    """Raise :class:`DataError` naming the first entry of the image folder ``root`` that would be skipped
    (module docstring), the first folder that holds no image, or ``root`` when it holds no image at all."""
    extensions = _image_extensions()
    empty, found = [], 0
    for directory, folders, files in os.walk(root, followlinks=True):
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        names = sorted(
            n for n in files + folders if not n.startswith(".") and os.path.splitext(n)[1].lower() in extensions
        )
        for name in names:
            problem = _problem(os.path.join(directory, name))
            if problem is not None:
                raise DataError(f"image folder {root}: {os.path.join(directory, name)} {problem}")
        images = [n for n in names if n in files]
        found += len(images)
        if directory != root and not images and not folders:
            empty.append(directory)
    if not found:
        shown = sorted(n for n in os.listdir(root) if not n.startswith("."))
        what = f"holds no images (found {shown[:10]})" if shown else "is an empty folder"
        raise DataError(
            f"{root} {what}: give an image folder ({root}/<class>/<image>), CSV/TSV/JSONL files or a saved "
            "Hugging Face dataset"
        )
    if empty:
        raise DataError(
            f"image folder {root}: {empty[0]} holds no images (a class folder without examples); remove it or add "
            "images" + (f" ({len(empty) - 1} more such folders)" if empty[1:] else "")
        )
