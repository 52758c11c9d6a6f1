"""peer_files.py - what interop.py and gpt.py share: their command line
(`python SCRIPT BUILD/torch_peer WORKDIR`), the files peer.c writes in
WORKDIR, and the tally tests/matrix.sh reads."""
import os
import sys

import torch

peer, work = sys.argv[1], os.path.abspath(sys.argv[2])
os.makedirs(work, exist_ok=True)
torch.set_num_threads(1)
counts = {"passed": 0, "failed": 0}


def check(ok, what):
    counts["passed" if ok else "failed"] += 1
    print(("ok    " if ok else "FAIL  ") + what)


def path(name):
    return os.path.join(work, name)


def values(name, dtype=torch.float32):
    """A .f32 or .i32 file: its 4-byte little-endian values."""
    with open(path(name), "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=dtype).clone()


def done(name):
    print("%s: %d passed, %d failed" % (name, counts["passed"], counts["failed"]))
    sys.exit(1 if counts["failed"] else 0)
