"""Shared fixtures: tiny timm ViTs built in the test, and a local Ray instance with 2 CPUs."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer


@pytest.fixture
def tiny_vit() -> VisionTransformer:
    """A 2-block, 32-wide random ViT on 32 px images with 5 classes, in eval mode."""
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5).eval()


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance with an explicit small resource set, shut down after the session."""
    import ray

    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
