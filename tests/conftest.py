"""Suite-wide settings.

Torch's intra-op thread pool is pinned to one thread: the suite's tensors are small, and on a
2-core machine shared with other processes, two spinning threads per op made tiny operations
orders of magnitude slower (measured in this repo while building it). Results do not depend on it.
"""
import torch

torch.set_num_threads(1)
