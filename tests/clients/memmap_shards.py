"""Token shards read as DataLoader workers read them: one process memmaps a shard that is not yet
cached whole (np.load(mmap_mode='r')) and reads it through the mapping, which fills the cache;
while that mapping lives, other processes open and memmap the same shard. Every open must
succeed with the right values, however the kernel serves the first process's mapping.

usage: memmap_shards.py SHARD_IN_MOUNT SHARD_IN_SOURCE READERS
"""

import json
import subprocess
import sys

import numpy as np

shard, source, readers = sys.argv[1], sys.argv[2], int(sys.argv[3])
want = int(np.load(source).sum())

held = np.load(shard, mmap_mode="r")
assert int(held.sum()) == want, "the first mapping reads the source's values"

READER = (
    "import numpy as np, sys\n"
    "a = np.load(sys.argv[1], mmap_mode='r')\n"
    "print(int(a.sum()))\n"
)
for _ in range(readers):
    out = subprocess.run(
        [sys.executable, "-c", READER, shard], capture_output=True, text=True
    )
    assert out.returncode == 0, f"another process's memmap failed: {out.stderr.strip()}"
    assert int(out.stdout) == want, "another process's memmap reads the source's values"
# One more mapping by this process, beside its own.
assert int(np.load(shard, mmap_mode="r").sum()) == want
del held
print(json.dumps({"readers": readers, "sum": want}))
