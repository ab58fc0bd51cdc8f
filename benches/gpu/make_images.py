"""Writes N JPEG photo-like images (smooth gradients, a square, noise; 500x375 like the
ImageNet median; quality 90) under DIR/class_k/, for the GPU benchmark. Image i depends on i
alone (its own seed), so any number of processes make the same set."""

import multiprocessing
import os
import sys

import torch
import torchvision


def make(i):
    path = os.path.join(OUT, f"class_{i % 10}", f"{i:06d}.jpg")
    if os.path.exists(path):
        return
    g = torch.Generator().manual_seed(i)
    h, w = 375, 500
    yy = torch.linspace(0, 1, h).view(h, 1)
    xx = torch.linspace(0, 1, w).view(1, w)
    c = torch.rand(3, 3, generator=g)
    img = torch.stack([c[k, 0] * xx + c[k, 1] * yy + c[k, 2] * xx * yy for k in range(3)])
    img = img + 0.08 * torch.randn(3, h, w, generator=g)
    y0 = int(torch.randint(0, h - 100, (1,), generator=g))
    x0 = int(torch.randint(0, w - 100, (1,), generator=g))
    img[:, y0 : y0 + 100, x0 : x0 + 100] = torch.rand(3, 1, 1, generator=g)
    img = (img.clamp(0, 1) * 255).to(torch.uint8)
    torchvision.io.write_jpeg(img, path, quality=90)


def init():
    torch.set_num_threads(1)


OUT = sys.argv[1]

if __name__ == "__main__":
    n = int(sys.argv[2])
    for k in range(10):
        os.makedirs(os.path.join(OUT, f"class_{k}"), exist_ok=True)
    with multiprocessing.get_context("fork").Pool(os.cpu_count(), initializer=init) as pool:
        pool.map(make, range(n), chunksize=64)
