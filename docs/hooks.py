"""MkDocs hook: adds the reference pages generated from the code (`scalerl.reference`) to the
site at every build, so they are never stale and never committed."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from scalerl.reference import pages


def on_files(files: Files, config: Any) -> Files:
    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files
