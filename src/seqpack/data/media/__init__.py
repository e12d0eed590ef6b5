"""Image-text samples for Qwen2-VL / Qwen2.5-VL-style models (``docs/notes/media.md``).

* ``images``: open images, the image processor, pixels, image-token counts, ``collate_media``;
* ``placeholders``: ``VisionTokens`` and ``expand_image_placeholders`` (one sample);
* ``expand``: ``expand_samples`` / ``prepare_multimodal`` (batch, streaming) and ``apply_length_policy``
  (the offline job), all through the one over-length policy of ``seqpack.data.length_policy``;
M-RoPE positions live with the packed row (``seqpack.packed.mrope``).
"""

from seqpack.data.length_policy import OVERLENGTH_POLICIES, OverlengthError
from seqpack.data.media.expand import apply_length_policy, expand_samples, prepare_multimodal
from seqpack.data.media.images import collate_media, load_image_processor, num_image_tokens, open_image, process_images
from seqpack.data.media.placeholders import VisionTokens, expand_image_placeholders
from seqpack.data.records import IMAGE_PLACEHOLDER

__all__ = [
    "IMAGE_PLACEHOLDER",
    "OVERLENGTH_POLICIES",
    "VisionTokens",
    "open_image",
    "load_image_processor",
    "process_images",
    "num_image_tokens",
    "expand_image_placeholders",
    "expand_samples",
    "prepare_multimodal",
    "apply_length_policy",
    "collate_media",
    "OverlengthError",
]
