"""What video sampling costs and what it finds: clipsearch's keyframe sampling against a full
decode keeping one frame a second, per codec and size, and the right moment found against the
sampling rate.

Videos are made here with PyAV from scikit-image's photos: shots of ``--seconds`` in total, each
a window of one photo panning slowly (each frame differs; no two shots alike), shots from 1 to 6 s long (seeded), 30 fps, a
keyframe every ``--gop`` seconds (the encoder may add one at a cut, as phones' encoders do), in
the codec's usual container, encoded with each encoder's fastest preset.

- cost, for each codec (``--codecs``) and height (``--heights``, 16:9): wall seconds to sample
  the video with ``keyframes`` (the default: keyframe packets alone, gaps over 3 s filled,
  near duplicates dropped), with ``rate`` at 1 fps (every frame decoded, one a second kept: the
  common baseline) and with ``shots``; best of ``--rounds``; frames sampled per second of video,
  seconds of video sampled per wall second, and the speed-up of ``keyframes`` over ``rate``.
  An index's embedding cost is the frames' count times the model's cost per image (see
  bench_index.py), so the frame counts say it.
- quality, on ``--quality-videos`` videos at 240p: a query is a frame at a random time (seeded),
  brightened a little; every sampled frame of every video is a 24x16 RGB thumbnail vector (a
  stand-in for a CLIP embedding that needs no model); the query's best frames make moments
  (``retrieval.moments``); the top video's best moment is right when it is the query's video and
  its best frame is in the query's shot (and, stricter, when the moment's span holds the
  query's time). Per sampling: frames per second of video and the shares right.

    python benchmarks/bench_video.py [--seconds 10] [--codecs h264,hevc,vp9,av1] [--heights 720,1080]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import scheduling_kept  # noqa: E402
from _harness import Bench, listed, note  # noqa: E402

# codec -> (encoder, container extension, encoder options for its fastest preset)
CODECS: dict[str, tuple[str, str, dict[str, str]]] = {
    "h264": ("libx264", "mp4", {"preset": "ultrafast"}),
    "hevc": ("libx265", "mp4", {"preset": "ultrafast", "x265-params": "log-level=error"}),
    "vp9": ("libvpx-vp9", "webm", {"deadline": "realtime", "cpu-used": "8"}),
    "av1": ("libsvtav1", "mkv", {"preset": "12", "svtav1-params": "log-level=0"}),
}
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png")
FPS = 30


Shot = tuple[str, float, float, tuple[float, float]]


def shot_plan(seconds: float, rng: np.random.Generator) -> list[Shot]:
    """(photo, start, end, where) shots covering ``seconds``, each 1 to 6 s long; ``where`` is the
    corner (fractions of the photo) of the half-size window the shot shows, so that no two shots
    look alike though the photos repeat."""
    shots, t = [], 0.0
    while t < seconds:
        length = min(float(rng.uniform(1, 6)), seconds - t)
        where = (float(rng.uniform(0, 0.5)), float(rng.uniform(0, 0.5)))
        shots.append((PHOTOS[int(rng.integers(len(PHOTOS)))], t, t + length, where))
        t += length
    return shots


def write_video(path: Path, codec: str, shots: list[Shot], width: int, height: int, gop: float) -> None:
    """The shots as a ``codec`` video of ``width`` x ``height``: each shot's window of its photo
    scaled a third wider than the frame, panning left to right over the shot."""
    import av
    import skimage
    from PIL import Image

    encoder, _, options = CODECS[codec]
    photos: dict[str, Image.Image] = {}
    with scheduling_kept(), av.open(str(path), "w") as container:
        stream = container.add_stream(encoder, rate=FPS, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = round(gop * FPS)
        for name, start, end, (fx, fy) in shots:
            if name not in photos:
                photos[name] = Image.open(Path(skimage.__file__).parent / "data" / name).convert("RGB")
            pw, ph = photos[name].size
            box = (round(fx * pw), round(fy * ph), round((fx + 0.5) * pw), round((fy + 0.5) * ph))
            wide = np.asarray(photos[name].crop(box).resize((width * 4 // 3, height), Image.Resampling.BILINEAR))
            frames = max(1, round((end - start) * FPS))
            slack = wide.shape[1] - width
            for i in range(frames):
                x = slack * i // max(1, frames - 1)
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(wide[:, x: x + width]), format="rgb24")
                for packet in stream.encode(frame):
                    container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def timed_sampling(path: Path, options: Any, rounds: int) -> tuple[float, int]:
    """Best wall seconds of ``rounds`` samplings of ``path`` and the frames kept."""
    from indexer.video import sample_video

    best, frames = float("inf"), 0
    for _ in range(rounds):
        start = time.perf_counter()
        _, kept = sample_video(path, options, max_side=224)
        best = min(best, time.perf_counter() - start)
        frames = len(kept)
    return best, frames


def cost(work: Path, codecs: list[str], heights: list[int], seconds: float, gop: float, rounds: int, seed: int) -> list[dict[str, Any]]:
    from indexer.video import VideoOptions

    samplings = {"keyframes": VideoOptions(), "rate 1 fps": VideoOptions(sampling="rate", rate=1.0, min_change=0),
                 "shots": VideoOptions(sampling="shots")}
    rows = []
    shots = shot_plan(seconds, np.random.default_rng(seed))
    for codec in codecs:
        for height in heights:
            width = height * 16 // 9 // 2 * 2
            path = work / f"{codec}-{height}p.{CODECS[codec][1]}"
            note(f"encoding {path.name}")
            write_video(path, codec, shots, width, height, gop)
            row: dict[str, Any] = {"codec": codec, "height": height, "seconds": seconds}
            for label, options in samplings.items():
                wall, frames = timed_sampling(path, options, rounds)
                row[label] = {"wall_s": round(wall, 4), "frames": frames, "frames_per_video_s": round(frames / seconds, 3),
                              "video_s_per_wall_s": round(seconds / wall, 1)}
            row["speedup_vs_rate"] = round(row["rate 1 fps"]["wall_s"] / row["keyframes"]["wall_s"], 2)
            rows.append(row)
    return rows


def thumb(image: Any) -> np.ndarray:
    """A 24x16 RGB thumbnail as a unit vector, centred (the stand-in embedding)."""
    from PIL import Image

    v = np.asarray(image.convert("RGB").resize((24, 16), Image.Resampling.BILINEAR), np.float32).ravel()
    v -= v.mean()
    return v / (np.linalg.norm(v) or 1.0)


def shot_of(plan: list[Shot], t: float) -> int:
    """The number of the shot of ``plan`` showing at ``t``."""
    return next((i for i, (_, start, end, _) in enumerate(plan) if start <= t < end), len(plan) - 1)


def quality(work: Path, videos: int, queries: int, seconds: float, gop: float, seed: int) -> list[dict[str, Any]]:
    import av
    from PIL import ImageEnhance

    from indexer.video import VideoOptions, sample_video
    from retrieval.moments import find_moments

    rng = np.random.default_rng(seed + 1)
    paths, plans = [], []
    for v in range(videos):
        path = work / f"q{v}.mp4"
        plans.append(shot_plan(seconds, rng))
        write_video(path, "h264", plans[-1], 426, 240, gop)
        paths.append(path)
    # Queries: frames of the full decode at random times, brightened by 10 %.
    asks = []
    for _ in range(queries):
        v, t = int(rng.integers(videos)), float(rng.uniform(0, seconds - 0.1))
        with av.open(str(paths[v])) as c:
            frame = next(f for f in c.decode(video=0) if f.time is not None and f.time >= t)
        asks.append((v, float(frame.time), thumb(ImageEnhance.Brightness(frame.to_image()).enhance(1.1))))
    samplings = {"keyframes (default)": VideoOptions(), "shots": VideoOptions(sampling="shots"),
                 **{f"rate {r:g} fps": VideoOptions(sampling="rate", rate=r, min_change=0) for r in (0.25, 0.5, 1.0, 2.0)}}
    rows = []
    for label, options in samplings.items():
        vecs, times, owner = [], [], []
        for v, path in enumerate(paths):
            _, frames = sample_video(path, options, max_side=224)
            vecs += [thumb(f.image) for f in frames]
            times += [f.time for f in frames]
            owner += [v] * len(frames)
        matrix, times_a, owner_a = np.stack(vecs), np.array(times), np.array(owner)
        right = holds = 0
        for v, t, q in asks:
            scores = matrix @ q
            best_video = int(owner_a[int(np.argmax(scores))])
            mine = owner_a == best_video
            moment = find_moments(times_a[mine], scores[mine], np.flatnonzero(mine), duration=seconds)[0]
            right += best_video == v and shot_of(plans[v], moment.time) == shot_of(plans[v], t)
            holds += best_video == v and moment.start - 1e-6 <= t <= moment.end + 1e-6
        rows.append({"sampling": label, "frames_per_video_s": round(len(vecs) / (videos * seconds), 3),
                     "right_shot": round(right / len(asks), 3), "moment_holds_time": round(holds / len(asks), 3)})
    return rows


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_video", __doc__, "seed", "work_dir")
    p = bench.parser
    p.add_argument("--seconds", type=float, default=10.0, help="length of each video (default: 10)")
    p.add_argument("--codecs", type=listed(choices=list(CODECS)), default=list(CODECS), help="codecs (default: all four)")
    p.add_argument("--heights", type=listed(int), default=[720, 1080], help="frame heights, 16:9 (default: 720,1080)")
    p.add_argument("--gop", type=float, default=2.0, help="seconds between keyframes the encoder is asked for (default: 2)")
    p.add_argument("--rounds", type=int, default=2, help="timed samplings per video, best kept (default: 2)")
    p.add_argument("--quality-videos", type=int, default=6, help="videos of the quality part, 0 skips it (default: 6)")
    p.add_argument("--queries", type=int, default=60, help="query frames of the quality part (default: 60)")
    args = bench.parse(argv)
    try:
        import av  # noqa: F401
    except ImportError:
        return bench.fail("PyAV is not installed: pip install 'clipsearch[video]'")
    if args.seconds < 2 or args.rounds < 1 or args.quality_videos < 0 or args.queries < 1:
        return bench.fail("--seconds must be >= 2, --rounds and --queries >= 1, --quality-videos >= 0", 2)
    with bench.scratch() as work:
        rows = cost(work, args.codecs, args.heights, args.seconds, args.gop, args.rounds, args.seed)
        found = quality(work, args.quality_videos, args.queries, args.seconds, args.gop, args.seed) if args.quality_videos else []
    table = [f"{'codec':<6}{'height':>7}  {'sampling':<11}{'frames/s of video':>18}{'video s / wall s':>18}", "-" * 60]
    for r in rows:
        for label in ("keyframes", "rate 1 fps", "shots"):
            m = r[label]
            table.append(f"{r['codec']:<6}{r['height']:>7}  {label:<11}{m['frames_per_video_s']:>18}{m['video_s_per_wall_s']:>18}")
        table.append(f"{'':<15}keyframes is {r['speedup_vs_rate']}x faster than a full decode at 1 fps")
    if found:
        table += ["", f"{'sampling':<21}{'frames/s of video':>18}{'right shot':>12}{'moment holds t':>16}", "-" * 67]
        table += [f"{r['sampling']:<21}{r['frames_per_video_s']:>18}{r['right_shot']:>12}{r['moment_holds_time']:>16}" for r in found]
    bench.report({"bench": "video", "seconds": args.seconds, "gop": args.gop, "cost": rows, "quality": found,
                  "queries": args.queries if found else 0}, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
