"""uint8 first: the mount hands over uint8 pixels, the device converts and normalizes them.

The recipe of DALI and FFCV: a uint8 tensor is a quarter of a float32 one, so the mount renders
less, the loader moves less (through FUSE, collate, pinned memory and the bus), and the
conversion to float and the normalization run on the accelerator, where they are nearly free:

    x = x.to(device, non_blocking=True).permute(0, 3, 1, 2).float().sub_(MEAN).div_(STD)

The mount was started with these views (tests/examples.rs does the same):
  train_u8 = decode,random_resized_crop(64),hflip,uint8(hwc)        what training reads
  val_u8   = decode,resize(80),center_crop(64),uint8(hwc)            the check below
  val      = decode,resize(80),center_crop(64),normalize(imagenet)   the float32 view it matches
An HWC uint8 batch (N, H, W, C) permuted to (N, C, H, W) is channels_last already: no copy.
The check: for the deterministic val pipeline, the uint8 view normalized on the device equals
the float32 view within float rounding. Runs on the CPU when there is no GPU.
"""
import os
import sys

import numpy as np
import torch
from torchvision import datasets

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _prepfs import Timer, arguments  # noqa: E402

# ImageNet's mean and std in uint8 levels (prepfs's normalize(imagenet) in 0-1 units, times 255).
MEAN = torch.tensor([0.485, 0.456, 0.406]).mul(255).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).mul(255).view(1, 3, 1, 1)

args = arguments(__doc__)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
mean, std = MEAN.to(device), STD.to(device)


def view(name):
    """DatasetFolder over view `name`: each item an array as the mount rendered it."""
    root = os.path.join(args.mount, ".prepfs", "views", name, "images")
    return datasets.DatasetFolder(
        root, loader=lambda path: torch.from_numpy(np.load(path)), extensions=(".npy",))


def on_device(batch):
    """A uint8 NHWC batch as normalized float32 NCHW (channels_last) on the device."""
    x = batch.to(device, non_blocking=True).permute(0, 3, 1, 2)
    return x.float().sub_(mean).div_(std)


# Training: uint8 crops through the DataLoader, pinned for asynchronous copies to a GPU.
train = view("train_u8")
loader = torch.utils.data.DataLoader(
    train, batch_size=16, shuffle=True, num_workers=2, persistent_workers=True,
    pin_memory=device.type == "cuda")
timer = Timer("pytorch_uint8")
for epoch in range(args.epochs):
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (64, 64, 3), images.shape
        x = on_device(images)
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 64, 64), x.shape
        assert x.is_contiguous(memory_format=torch.channels_last)
        timer.add(len(labels))
assert timer.items == args.epochs * len(train), timer.items

# The check: the same deterministic pipeline as uint8 (normalized here) and as float32.
u8, f32 = view("val_u8"), view("val")
assert [os.path.relpath(p, u8.root) for p, _ in u8.samples] == \
    [os.path.relpath(p, f32.root) for p, _ in f32.samples]
worst = 0.0
for (a, _), (b, _) in zip(u8, f32):
    mine = on_device(a.unsqueeze(0))[0].cpu()
    assert b.dtype == torch.float32 and mine.shape == b.shape, (mine.shape, b.shape)
    worst = max(worst, (mine - b).abs().max().item())
# Float rounding only: the mount computes v * (1/(255 std)) - mean/std, the device
# (v - 255 mean) / (255 std); one level is ~0.017 after normalization.
assert worst < 1e-5, f"uint8 normalized on the device differs from the float32 view by {worst}"
print(f"val: uint8 normalized on {device.type} vs the float32 view: max abs difference {worst:.2e}")
timer.report(args.mount)
