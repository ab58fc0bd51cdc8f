"""PyTorch over raw files with a sampler that publishes each epoch's order to prepfs.

Usage: torch_order_file.py ROOT ORDER_FILE EPOCHS. ImageFolder + DataLoader (2 workers) with the
`PublishedOrder` sampler from docs/CONFIGURATION.md: a fresh shuffle per epoch, written to
ORDER_FILE (atomically) before the epoch starts. Each batch is followed by a 20 ms step, as
training computes between batches. Exits non-zero on any mismatch; prints one JSON
line of what it read.
"""
import json
import os
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader


class PublishedOrder(torch.utils.data.Sampler):
    """Shuffles like RandomSampler and tells prepfs the order before each epoch."""

    def __init__(self, dataset, order_file):
        self.dataset, self.order_file = dataset, order_file

    def __len__(self):
        return len(self.dataset)

    def __iter__(self):
        order = torch.randperm(len(self.dataset)).tolist()
        tmp = self.order_file + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(self.dataset.samples[i][0] + "\n" for i in order)
        os.replace(tmp, self.order_file)
        return iter(order)


root, order_file, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
dataset = torchvision.datasets.ImageFolder(
    root, transform=torchvision.transforms.Compose([
        torchvision.transforms.Resize((64, 64)), torchvision.transforms.PILToTensor()]))
loader = DataLoader(dataset, batch_size=4, sampler=PublishedOrder(dataset, order_file),
                    num_workers=2)
images = 0
for _ in range(epochs):
    for batch, _labels in loader:
        assert tuple(batch.shape[1:]) == (3, 64, 64), batch.shape
        images += batch.shape[0]
        time.sleep(0.02)
assert images == epochs * len(dataset), f"{images} images in {epochs} epochs"
print(json.dumps({"images": images, "epochs": epochs}))
