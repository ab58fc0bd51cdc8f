"""One training job over a prepfs view: a DataLoader with 2 workers reading EPOCHS shuffled epochs.

Usage: torch_jobs.py VIEW_ROOT EPOCHS SHUFFLE_SEED [--done PREFIX] [--wait-for FILE]
    [--delay-ms N]
Prints one JSON line: for each epoch, the sha256 of the tensor each file gave (by path relative
to the view root). Jobs started at once over one view compare these: the same file in the same
epoch must give the same tensor. --done: after epoch e, create PREFIX.e. --wait-for: after the
first epoch, wait (at most 300 s, else exit 3) until FILE exists, so a test can hold this job an
epoch behind another. --delay-ms: sleep this long per file read, a slower job.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset


class Digests(Dataset):
    """The view's files as (index, sha256 of the array np.load gives), read in the workers."""

    def __init__(self, root, delay_s):
        folder = torchvision.datasets.DatasetFolder(root, loader=np.load, extensions=(".npy",))
        self.paths = [p for p, _ in folder.samples]
        self.delay_s = delay_s

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return i, hashlib.sha256(np.load(self.paths[i]).tobytes()).hexdigest()


def as_list(batch):
    return batch


def wait_for(path, patience_s=300):
    deadline = time.monotonic() + patience_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            print(f"torch_jobs: {path} did not appear within {patience_s} s", file=sys.stderr)
            sys.exit(3)
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("epochs", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("--done")
    parser.add_argument("--wait-for")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    dataset = Digests(args.root, args.delay_ms / 1e3)
    names = [os.path.relpath(p, args.root) for p in dataset.paths]
    loader = DataLoader(dataset, batch_size=2, shuffle=True, num_workers=2, collate_fn=as_list,
                        generator=torch.Generator().manual_seed(args.seed))
    seen = []
    for epoch in range(args.epochs):
        if epoch == 1 and args.wait_for:
            wait_for(args.wait_for)
        hashes = {names[i]: h for batch in loader for i, h in batch}
        assert len(hashes) == len(dataset), f"an epoch gave {len(hashes)} of {len(dataset)} files"
        seen.append(hashes)
        if args.done:
            open(f"{args.done}.{epoch}", "w").close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
