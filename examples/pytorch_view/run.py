"""torchvision DatasetFolder over a prepfs tensor view: the mount decodes and augments.

The mount was started with --view train=decode,random_resized_crop(64),hflip,normalize(imagenet):
each image appears as a float32 CHW .npy under MNT/.prepfs/views/train/, a fresh random crop and
flip at every open, so the training loop only loads arrays.
"""
import os
import sys

import numpy as np
import torch
from torchvision import datasets

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _prepfs import Timer, arguments  # noqa: E402

args = arguments(__doc__)
root = os.path.join(args.mount, ".prepfs", "views", "train", "images")
dataset = datasets.DatasetFolder(
    root, loader=lambda path: torch.from_numpy(np.load(path)), extensions=(".npy",))
# persistent_workers: the workers stay forked between epochs (each open still gets a fresh crop).
loader = torch.utils.data.DataLoader(
    dataset, batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
timer = Timer("pytorch_view")
for epoch in range(args.epochs):
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 64, 64), images.shape
        timer.add(len(labels))
assert timer.items == args.epochs * len(dataset), timer.items
timer.report(args.mount)
