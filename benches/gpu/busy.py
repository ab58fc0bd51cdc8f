"""A stand-in for a training process on the same GPU: large matmuls in a loop until killed,
holding several GB of memory. check.sh runs the GPU tests and the benchmark beside it."""

import torch

x = torch.randn(8192, 8192, device="cuda")
hold = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")  # 8 GiB, as a model would
while True:
    x = torch.tanh(x @ x) * 0.5
    torch.cuda.synchronize()
