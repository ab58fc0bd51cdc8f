"""numpy memmap of a large .npy in a prepfs mount: random windows of a token array.

np.load(..., mmap_mode="r") maps the file through the mount; each window read faults in only the
pages it touches, served from prepfs's cache once read. With --source, first writes
SOURCE/arrays/tokens.npy (TOKENS uint16 token ids) if missing, and checks windows against it.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _prepfs import Timer, arguments  # noqa: E402

TOKENS, WINDOW, WINDOWS = 16 << 20, 2048, 512

args = arguments(__doc__)
if args.source:
    path = os.path.join(args.source, "arrays", "tokens.npy")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = np.random.default_rng(0)
        np.save(path, rng.integers(0, 50_000, TOKENS, dtype=np.uint16))
tokens = np.load(os.path.join(args.mount, "arrays", "tokens.npy"), mmap_mode="r")
reference = np.load(os.path.join(args.source, "arrays", "tokens.npy"), mmap_mode="r") \
    if args.source else None
timer = Timer("numpy_memmap")
rng = np.random.default_rng(1)
for epoch in range(args.epochs):
    for start in rng.integers(0, len(tokens) - WINDOW, WINDOWS):
        window = np.asarray(tokens[start:start + WINDOW])
        if reference is not None:
            assert np.array_equal(window, reference[start:start + WINDOW]), start
        timer.add(1)
timer.report(args.mount)
