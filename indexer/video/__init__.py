"""Videos in the index (the ``video`` extra, PyAV): what a file is by its content
(:mod:`.probe`), which frames to keep (:mod:`.sampling`, :mod:`.video_config`) and decoding
them (:mod:`.frames`). Importing this package imports no PyAV; opening a video does.
"""

from .frames import NATIVE_SIDE, SampledFrame, VideoSampler, frame_at, sample_video
from .probe import VIDEO_EXTENSIONS, VideoInfo, is_video_file, sniff
from .video_config import SAMPLINGS, VideoOptions

__all__ = [
    "NATIVE_SIDE", "SAMPLINGS", "VIDEO_EXTENSIONS", "SampledFrame", "VideoInfo", "VideoOptions", "VideoSampler", "frame_at",
    "is_video_file", "sample_video", "sniff",
]
