"""Safetensors files read as memory maps, for the bridge-targets job's states (n × T × d floats
per layer): training reads them a batch of rows at a time, so they need not fit in memory.

``safetensors.torch.load_file`` copies every tensor into memory. Here the file is mapped
copy-on-write and each tensor is a view of it (``torch.frombuffer``): the OS reads pages as rows
are used and may drop them again, since they are the file's, and the jobs of one node reading
the same file share its page cache. The bytes are the file's, so the numbers are those
``load_file`` gives. The format: an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and byte range, then the data.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path

import torch

from dihal_bench.errors import DihalError

#: safetensors' dtype names
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def map_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path`` as CPU views of the file mapped copy-on-write
    (writing to one changes this process's copy, never the file). DihalError naming the file
    when it is not a safetensors file or is truncated. A missing file raises FileNotFoundError, as
    ``open`` does: inside a job, the job store turns it into its "vanished from the store" error."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            (header_length,) = struct.unpack("<Q", handle.read(8))
            if 8 + header_length > path.stat().st_size:  # read() would first allocate that many bytes
                raise ValueError(f"a header of {header_length} bytes in a file of {path.stat().st_size}")
            header = json.loads(handle.read(header_length))
            # ACCESS_COPY: a writable private mapping, which torch.frombuffer needs to not warn
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise
    except (OSError, struct.error, ValueError) as exc:
        raise DihalError(f"{path} is not a readable safetensors file ({exc})") from None
    data_start = 8 + header_length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], list(entry["shape"]), entry["data_offsets"]
            count = math.prod(shape)
            fits = (min(shape, default=0) >= 0 and end - begin == count * dtype.itemsize
                    and data_start + end <= len(mapped))
        except (KeyError, TypeError, ValueError):
            fits = False
        if not fits:
            raise DihalError(f"{path} is damaged or truncated: tensor {name!r} does not fit its header; "
                             f"compute it again")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(mapped, dtype=dtype, count=count, offset=data_start + begin).view(shape)
    return tensors
