"""torchvision ImageFolder over the raw JPEGs in a prepfs mount, exactly as over any directory."""
import os
import sys

import torch
from torchvision import datasets, transforms

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _prepfs import Timer, arguments  # noqa: E402

args = arguments(__doc__)
transform = transforms.Compose([
    transforms.RandomResizedCrop(64),
    transforms.RandomHorizontalFlip(),
    transforms.ToTensor(),
    transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
])
dataset = datasets.ImageFolder(os.path.join(args.mount, "images"), transform=transform)
loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)
timer = Timer("pytorch_imagefolder")
for epoch in range(args.epochs):
    for images, labels in loader:
        assert images.shape[1:] == (3, 64, 64), images.shape
        timer.add(len(labels))
assert timer.items == args.epochs * len(dataset), timer.items
timer.report(args.mount)
