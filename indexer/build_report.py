"""``BuildReport``: what one build or update did, beside the settings it ran with
(:mod:`indexer.build_config`).

:func:`indexer.build.build_index` returns it, ``clipsearch index --json`` prints its
:meth:`~BuildReport.to_dict`, and watch mode hands one to its caller per update. Its side-stage
fields are filled by each stage's :meth:`~indexer.sides.contract.SideStage.report`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class BuildReport:
    """What a run did; ``to_dict`` is what ``clipsearch index --json`` prints.

    ``added`` new files embedded, ``updated`` changed files re-embedded, ``removed`` rows of
    deleted files dropped, ``unchanged`` rows kept, ``skipped`` files in the skip list,
    ``total`` (= ``indexed``) rows in the index now, ``embedded`` images embedded by this run.
    ``write_seconds`` is the time spent committing the embedded rows and the final FAISS index;
    the side stages' fields (from ``text_notes`` to ``faces_seconds``) are each stage's
    :meth:`~indexer.sides.contract.SideStage.report`, their seconds their commits included.
    """

    index_dir: str
    model: str
    dim: int
    added: int
    updated: int
    removed: int
    unchanged: int
    skipped: int
    newly_skipped: int
    total: int
    indexed: int
    embedded: int
    resumed: bool
    commits: int
    seconds: float
    images_per_second: float
    decode_seconds: float
    encode_seconds: float
    write_seconds: float
    workers: int
    batch_size: int
    device: str
    threads: int = 0
    precision: str = ""
    # The CPU level the run acted on (retrieval.encoders.cpu), e.g. "avx2"; "" on CUDA.
    cpu_level: str = ""
    engine: str = "local"
    # Images indexed without some of their text (ignored metadata, an image OCR could not read),
    # and images in which OCR found text, this run; images already indexed whose text this run read
    # without embedding them again (index --ocr on an index embedded without it).
    text_notes: int = 0
    with_ocr_text: int = 0
    text_read: int = 0
    # Seconds spent reading the text of images already indexed (their commits included).
    text_seconds: float = 0.0
    # index --faces: images the detector read this run, the faces it found in them, the images it
    # could not read; and, over the whole index, the faces and the people they form.
    faces_read: int = 0
    faces_found: int = 0
    faces_notes: int = 0
    faces: int = 0
    people: int = 0
    # Seconds spent finding faces and grouping them into people (their commits included).
    faces_seconds: float = 0.0
    # Ray runs only: the encoder actors and the cluster's resources (ray.cluster_resources()).
    actors: int = 0
    cluster_resources: dict[str, float] = field(default_factory=dict)
    # Who wrote the Parquet parts: "actors", "driver", or "actors+driver" (some actors could not
    # reach the index directory); "" when nothing was embedded.
    ray_write: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.engine != "ray":
            # The Ray fields mean nothing for a local run: its summary leaves them out.
            del data["actors"], data["cluster_resources"], data["ray_write"]
        return data


__all__ = ["BuildReport"]
