"""The bulk wire form (docs/WIRE.md) from NumPy: the helper that page shows, checked by
the round-trip tests. A client needs nothing beyond NumPy and an HTTP client."""

import json
import struct

import numpy as np

MEDIA_TYPE = "application/vnd.gpu-ops.bulk"
DTYPES = {"f16": "<f2", "f32": "<f4", "f64": "<f8", "u8": "<u1", "u32": "<u4", "u64": "<u8",
          "cf32": "<c8"}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def bulk_body(header: dict, arrays: dict) -> bytes:
    data = bytearray()
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=np.dtype(a.dtype).newbyteorder("<"))
        offset = -(-len(data) // 64) * 64
        data += bytes(offset - len(data)) + a.tobytes()
        header[name] = {"dtype": NAMES[a.dtype], "shape": list(a.shape),
                        "byte_offset": offset, "byte_length": a.nbytes}
    head = json.dumps(header).encode()
    head += b" " * (-(8 + len(head)) % 64)
    return struct.pack("<Q", len(head)) + head + bytes(data)


def read_bulk(body: bytes) -> tuple[dict, dict]:
    (n,) = struct.unpack_from("<Q", body)
    header, data = json.loads(body[8:8 + n]), memoryview(body)[8 + n:]
    arrays = {name: np.frombuffer(data[d["byte_offset"]:d["byte_offset"] + d["byte_length"]],
                                  DTYPES[d["dtype"]]).reshape(d["shape"])
              for name, d in header.items() if isinstance(d, dict) and "byte_offset" in d}
    return header, arrays
