"""What a saved ``sop_config.json`` holds: the options each sopfast version writes, and those saved with
their current value (they may change after construction)."""

from __future__ import annotations

from typing import Any

from .recipes import RECIPES

#: Attributes of SOP that may change after construction; their current values are saved.
MUTABLE_CONFIG = (
    "num_groups",
    "tau",
    "mode",
    "deletion",
    "group_batch_size",
    "checkpoint_projection",
    "demote_blank",
    "agreement_prior",
    "train_agreement_prior",
)
#: The ``SOP`` options every ``sop_config.json`` of sopfast 0.3 or later holds (0.1 and 0.2 lacked the
#: recipe's options and, 0.1, ``ties``: they load as the paper's algorithm), each from its
#: :data:`OPTIONS_SINCE` version.
REQUIRED_OPTIONS = (
    "num_groups",
    "tau",
    "mode",
    "recipe",
    "num_heads",
    "ties",
    "group_sel_scale",
    "blur_kernel_size",
    "blur_sigma",
    "deletion",
    *RECIPES["paper"].model,
    "freeze_projection",
    "group_batch_size",
    "checkpoint_projection",
    "task",
)
REQUIRED_FROM = (0, 3, 0)
#: Options of :data:`REQUIRED_OPTIONS` that sopfast writes only since the version given (an earlier
#: checkpoint lacks them and ran with their ``"paper"`` value).
OPTIONS_SINCE = {
    "agreement_prior": (0, 6, 0),
    "sufficiency_weight": (0, 6, 0),
    "distill_weight": (0, 6, 0),
    "explore": (0, 6, 1),
    "train_agreement_prior": (0, 7, 0),
}
#: Constructor options saved too, but newer than sopfast 0.4's checkpoints, which lack them: absent, the
#: default (what those checkpoints ran with).
LATER_OPTIONS = ("backbone_dtype", "compile")


def absent_options(config: dict[str, Any], version: tuple[int, int, int]) -> list[str]:
    """The :data:`REQUIRED_OPTIONS` that sopfast ``version`` writes and ``config`` lacks."""
    if version < REQUIRED_FROM:
        return []
    return [key for key in REQUIRED_OPTIONS if key not in config and version >= OPTIONS_SINCE.get(key, REQUIRED_FROM)]
