"""Writing an ExportWeights stream into a folder (TrainingClient.save_weights / export_adapter)."""
from __future__ import annotations

import hashlib
import os
from typing import Any, BinaryIO, List, Optional

import grpc

from .errors import StreambpError
from .types import ExportedWeights
from .v1 import trainer_pb2 as pb

__all__ = ["FolderWriter"]

_WEIGHTS_FILE = {"model": ("model.safetensors", "config.json"),
                 "peft_adapter": ("adapter_model.safetensors", "adapter_config.json")}


class FolderWriter:
    """Writes an ExportWeights stream into a folder: each file through NAME.partial, checked
    (contiguous offsets, total size, SHA-256) and renamed when its last piece arrives."""

    def __init__(self, folder: str, expect_format: str, session: str):
        self.folder = folder
        self.expect_format = expect_format
        self.session = session
        self.format = ""
        self.policy_version = 0
        self.note = ""
        self.sha256 = ""
        self.files: List[str] = []
        self._name: Optional[str] = None  # the file being received
        self._file = ""  # its WeightsChunk.file ("" = the weights)
        self._path = ""
        self._out: Optional[BinaryIO] = None
        self._hash: Any = None
        self._received = 0
        self._total = 0

    def _bad(self, what: str) -> StreambpError:
        self.abort()
        return StreambpError(grpc.StatusCode.DATA_LOSS, f"ExportWeights: {what}")

    def _begin(self, chunk: pb.WeightsChunk) -> None:
        if not self.files and self._name is None:  # the first message of the stream
            if chunk.file:
                raise self._bad(f"the stream starts with {chunk.file!r}, not the weights")
            self.format = chunk.format or "model"
            if self.format not in _WEIGHTS_FILE:
                raise self._bad(f"unknown format {self.format!r}")
            if self.expect_format and self.format != self.expect_format:
                raise StreambpError(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"session {self.session!r} exports {self.format!r}, not an adapter "
                                    f"({self.expect_format}): use save_weights")
            self.policy_version, self.note = chunk.policy_version, chunk.note
            os.makedirs(self.folder, exist_ok=True)
            name = _WEIGHTS_FILE[self.format][0]
        else:
            name = chunk.file
            if not name or "/" in name or "\\" in name or name.startswith("."):
                raise self._bad(f"refusing the file name {name!r}")
        self._name, self._file = name, chunk.file
        self._path = os.path.join(self.folder, name)
        self._out = open(self._path + ".partial", "wb")
        self._hash = hashlib.sha256()
        self._received = 0
        self._total = chunk.total_bytes

    def add(self, chunk: pb.WeightsChunk) -> None:
        """One message of the stream."""
        if self._name is None:
            self._begin(chunk)
        elif chunk.file != self._file:
            raise self._bad(f"{self._name} ended without its last piece")
        assert self._out is not None
        if chunk.offset != self._received:
            raise self._bad(f"{self._name}: a piece at offset {chunk.offset}, expected {self._received}")
        self._out.write(chunk.data)
        self._hash.update(chunk.data)
        self._received += len(chunk.data)
        if chunk.last:
            self._end(chunk)

    def _end(self, chunk: pb.WeightsChunk) -> None:
        assert self._out is not None and self._name is not None
        self._out.close()
        self._out = None
        digest = self._hash.hexdigest()
        if self._total and self._received != self._total:
            raise self._bad(f"{self._name}: {self._received} bytes received, {self._total} announced")
        if chunk.sha256 and chunk.sha256.lower() != digest:
            raise self._bad(f"{self._name}: SHA-256 {digest} differs from the server's {chunk.sha256}")
        os.replace(self._path + ".partial", self._path)
        if self._name not in self.files:
            self.files.append(self._name)
        if not chunk.file:  # the weights: their config goes beside them
            self.sha256 = digest
            if chunk.config_json:
                config = _WEIGHTS_FILE[self.format][1]
                with open(os.path.join(self.folder, config), "w", encoding="utf-8") as f:
                    f.write(chunk.config_json)
                if config not in self.files:
                    self.files.append(config)
        self._name = None

    def abort(self) -> None:
        """Removes the partial file of an interrupted stream."""
        if self._out is not None:
            self._out.close()
            self._out = None
        if self._name is not None:
            self._name = None
            try:
                os.unlink(self._path + ".partial")
            except OSError:
                pass

    def finish(self) -> ExportedWeights:
        """The result, once the stream has ended."""
        if self._name is not None:
            raise self._bad(f"the stream ended before the last piece of {self._name}")
        if not self.files:
            raise self._bad("the stream ended without the weights")
        return ExportedWeights(path=self.folder, format=self.format, files=self.files, sha256=self.sha256,
                               policy_version=self.policy_version, note=self.note)
