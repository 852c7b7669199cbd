"""Tools built on top of an index or of the encoders, not needed by a query.

- :mod:`.evaluation`: ``clipsearch eval``, labelled queries in, MRR / Recall@K out;
- :mod:`.zeroshot`: ``clipsearch classify``, zero-shot labels for an index's images;
- :mod:`.verify`: ``clipsearch verify``, every checksum and cross-check of an index directory
  (each kind of file's check in :mod:`.verify_checks`);
- :mod:`.random_model`: offline random CLIP / SigLIP / open_clip checkpoints for tests,
  benchmarks and fine-tuning runs (``python -m retrieval.tools.random_model``).

The query layer (:mod:`retrieval`) never imports this package, except that ``retrieval``
re-exports :func:`~.verify.verify_index` for the documented ``retrieval.verify_index``.
"""
