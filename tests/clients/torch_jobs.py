"""One training job over a prepfs view: a DataLoader with 2 workers reading EPOCHS shuffled epochs.

Usage: torch_jobs.py VIEW_ROOT EPOCHS SHUFFLE_SEED. Prints one JSON line: for each epoch, the
sha256 of the tensor each file gave (by path relative to the view root). Jobs started at once
over one view compare these: the same file in the same epoch must give the same tensor.
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset


class Digests(Dataset):
    """The view's files as (index, sha256 of the array np.load gives), read in the workers."""

    def __init__(self, root):
        folder = torchvision.datasets.DatasetFolder(root, loader=np.load, extensions=(".npy",))
        self.paths = [p for p, _ in folder.samples]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return i, hashlib.sha256(np.load(self.paths[i]).tobytes()).hexdigest()


def as_list(batch):
    return batch


def main():
    root, epochs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dataset = Digests(root)
    names = [os.path.relpath(p, root) for p in dataset.paths]
    loader = DataLoader(dataset, batch_size=2, shuffle=True, num_workers=2, collate_fn=as_list,
                        generator=torch.Generator().manual_seed(seed))
    seen = []
    for _ in range(epochs):
        hashes = {names[i]: h for batch in loader for i, h in batch}
        assert len(hashes) == len(dataset), f"an epoch gave {len(hashes)} of {len(dataset)} files"
        seen.append(hashes)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
