"""Object masks for grounding (paper RQ5): which pixels of an image are the object.

Two sources: ``"intensity"`` — the pixels of the image itself brighter than a threshold (a fraction
of full brightness; objects on a dark background, such as Fashion-MNIST), written
``intensity:0.2`` for another threshold — or a column of the data holding a mask image per example
(white = object).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INTENSITY = "intensity"
DEFAULT_THRESHOLD = 0.1


@dataclass(frozen=True)
class ObjectMasks:
    """``column`` holding mask images, or ``None`` for masks from the image's own intensity above
    ``threshold``."""

    column: str | None = None
    threshold: float = DEFAULT_THRESHOLD

    @classmethod
    def parse(cls, spec: str) -> ObjectMasks:
        """``"intensity"``, ``"intensity:T"`` (T in (0, 1)) or a column name."""
        name, _, value = spec.partition(":")
        if name != INTENSITY:
            return cls(column=spec)
        if not value:
            return cls()
        try:
            threshold = float(value)
        except ValueError:
            raise ValueError(f"object masks {spec!r}: the threshold after ':' must be a number") from None
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"object masks {spec!r}: the threshold must lie in (0, 1), got {threshold}")
        return cls(threshold=threshold)

    def from_pixels(self, images: torch.Tensor, low: float = -1.0, high: float = 1.0) -> torch.Tensor:
        """``[N, H, W]`` bool from images ``[N, C, H, W]`` whose pixel values run from ``low`` (black) to
        ``high`` (white): the channel mean brighter than the threshold."""
        brightness = (images.float().mean(dim=1) - low) / (high - low)
        return brightness > self.threshold
