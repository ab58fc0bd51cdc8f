"""Writes N JPEG photos-like images (smooth gradients, shapes, noise; 500x375 like the
ImageNet median; quality 90) under DIR/class_k/, for the GPU benchmark."""

import os
import sys

import torch
import torchvision

out, n = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(0)
for i in range(n):
    d = os.path.join(out, f"class_{i % 10}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{i:06d}.jpg")
    if os.path.exists(path):
        continue
    h, w = 375, 500
    yy = torch.linspace(0, 1, h).view(h, 1)
    xx = torch.linspace(0, 1, w).view(1, w)
    c = torch.rand(3, 3, generator=g)
    img = torch.stack([c[k, 0] * xx + c[k, 1] * yy + c[k, 2] * xx * yy for k in range(3)])
    img = img + 0.08 * torch.randn(3, h, w, generator=g)
    y0, x0 = int(torch.randint(0, h - 100, (1,), generator=g)), int(torch.randint(0, w - 100, (1,), generator=g))
    img[:, y0 : y0 + 100, x0 : x0 + 100] = torch.rand(3, 1, 1, generator=g)
    img = (img.clamp(0, 1) * 255).to(torch.uint8)
    torchvision.io.write_jpeg(img, path, quality=90)
