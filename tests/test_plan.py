"""plan_update: what an update embeds, keeps, refreshes and removes (hand-made cases)."""

from __future__ import annotations

import numpy as np

from indexer.discover import ImageFile
from indexer.plan import IndexedFacts, plan_update
from indexer.writer import SkipRecord


def _facts(rows: list[tuple[bytes, int, int, str]]) -> IndexedFacts:
    return IndexedFacts(
        paths=[r[0] for r in rows],
        sizes=np.array([r[1] for r in rows], np.int64),
        mtimes_ns=np.array([r[2] for r in rows], np.int64),
        hashes=[r[3] for r in rows],
    )


INDEXED = _facts([(b"a.jpg", 10, 100, "ha"), (b"b.jpg", 20, 200, "hb"), (b"c.jpg", 30, 300, "hc"), (b"d.jpg", 40, 400, "hd")])


def test_every_kind_of_change() -> None:
    found = [
        ImageFile(b"a.jpg", 10, 100),  # unchanged: same size and mtime
        ImageFile(b"b.jpg", 20, 999),  # touched: same size, new mtime, same content
        ImageFile(b"c.jpg", 31, 301),  # changed content
        # d.jpg deleted
        ImageFile(b"e.jpg", 50, 500),  # new
    ]
    hashed: list[bytes] = []

    def hash_file(rel: bytes) -> str | None:
        hashed.append(rel)
        return {b"b.jpg": "hb", b"c.jpg": "hc2"}[rel]

    plan = plan_update(INDEXED, [], found, hash_file)
    assert [f.rel for f in plan.to_embed] == [b"c.jpg", b"e.jpg"]
    assert plan.updated_paths == {b"c.jpg"}
    assert plan.keep_ids.tolist() == [0, 1]  # a and b stay; c is re-embedded, d is gone
    assert plan.refreshed == {1: 999}
    assert (plan.removed, plan.unchanged) == (1, 2)
    assert hashed == [b"b.jpg"]  # c's size changed: no need to hash it; a was not even read
    assert plan.changes_rows


def test_nothing_changed_touches_nothing() -> None:
    found = [ImageFile(p, int(s), int(m)) for p, s, m in zip(INDEXED.paths, INDEXED.sizes, INDEXED.mtimes_ns, strict=True)]
    plan = plan_update(INDEXED, [], found, lambda rel: (_ for _ in ()).throw(AssertionError("hashed")))
    assert plan.to_embed == [] and plan.unchanged == 4 and plan.removed == 0
    assert not plan.changes_rows


def test_same_size_different_content_is_updated() -> None:
    plan = plan_update(INDEXED, [], [ImageFile(b"a.jpg", 10, 555)], lambda rel: "other")
    assert [f.rel for f in plan.to_embed] == [b"a.jpg"] and plan.updated_paths == {b"a.jpg"}


def test_unreadable_changed_file_is_re_embedded_and_fails_there() -> None:
    plan = plan_update(INDEXED, [], [ImageFile(b"a.jpg", 10, 555)], lambda rel: None)
    assert [f.rel for f in plan.to_embed] == [b"a.jpg"]


def test_broken_files_are_retried_only_when_changed() -> None:
    skips = [
        SkipRecord(b"x.jpg", "empty file", 0, 7, "h0"),
        SkipRecord(b"y.jpg", "truncated file", 5, 8, "h1"),
        SkipRecord(b"gone.jpg", "empty file", 0, 9, "h2"),
    ]
    found = [ImageFile(b"x.jpg", 0, 7), ImageFile(b"y.jpg", 6, 9)]
    plan = plan_update(_facts([]), skips, found, lambda rel: None)
    assert [s.path for s in plan.carried_skips] == [b"x.jpg"]
    assert [f.rel for f in plan.to_embed] == [b"y.jpg"]
    assert plan.updated_paths == set()  # it was never in the index: an addition when it decodes


def test_first_build_embeds_everything() -> None:
    found = [ImageFile(b"a.jpg", 1, 1), ImageFile(b"b.jpg", 2, 2)]
    plan = plan_update(_facts([]), [], found, lambda rel: None)
    assert [f.rel for f in plan.to_embed] == [b"a.jpg", b"b.jpg"] and not plan.changes_rows


def test_a_videos_frame_rows_go_together() -> None:
    # Three videos of three frame rows each, between two images: kept, touched and changed whole.
    rows = [(b"a.jpg", 10, 100, "ha")]
    for name, size, mtime in ((b"v1.mp4", 500, 1), (b"v2.mp4", 600, 2), (b"v3.webm", 700, 3)):
        rows += [(name, size, mtime, name.decode())] * 3
    rows.append((b"z.jpg", 20, 200, "hz"))
    found = [
        ImageFile(b"v1.mp4", 500, 1),  # unchanged: its three rows stay
        ImageFile(b"v2.mp4", 600, 22),  # touched, same content: its three rows refreshed
        ImageFile(b"v3.webm", 701, 33),  # changed: re-sampled, its rows dropped
        ImageFile(b"z.jpg", 20, 200),
        # a.jpg deleted
    ]
    plan = plan_update(_facts(rows), [], found, lambda rel: {b"v2.mp4": "v2.mp4"}[rel])
    assert [f.rel for f in plan.to_embed] == [b"v3.webm"] and plan.updated_paths == {b"v3.webm"}
    assert plan.keep_ids.tolist() == [1, 2, 3, 4, 5, 6, 10]
    assert plan.refreshed == {4: 22, 5: 22, 6: 22}
    assert (plan.removed, plan.unchanged) == (1, 3)
