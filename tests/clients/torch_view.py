"""PyTorch over a prepfs view, as a user would write it: DatasetFolder + np.load, 2 workers.

Usage: torch_view.py VIEW_ROOT N_IMAGES N_CLASSES SIZE. Exits non-zero with a message on any
mismatch; prints one JSON line of what it saw.
"""
import json
import sys

import numpy as np
import torch
import torchvision
from torch.utils.data import DataLoader

root, n_images, n_classes, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dataset = torchvision.datasets.DatasetFolder(
    root, loader=lambda p: torch.from_numpy(np.load(p)), extensions=(".npy",))
assert len(dataset) == n_images, f"{len(dataset)} samples, expected {n_images}"
assert len(dataset.classes) == n_classes, f"classes {dataset.classes}"
loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
seen, labels = 0, set()
for images, targets in loader:
    assert images.dtype == torch.float32, images.dtype
    assert tuple(images.shape[1:]) == (3, size, size), images.shape
    assert torch.isfinite(images).all()
    seen += images.shape[0]
    labels.update(targets.tolist())
assert seen == n_images, f"one epoch gave {seen} images"
assert labels == set(range(n_classes)), labels
# numpy memmap of a view file works (FUSE direct I/O with mmap allowed) and matches a read.
path = dataset.samples[0][0]
mapped = np.load(path, mmap_mode="r")
assert mapped.shape == (3, size, size) and mapped.dtype == np.float32
print(json.dumps({"images": seen, "classes": len(labels), "shape": list(images.shape[1:])}))
