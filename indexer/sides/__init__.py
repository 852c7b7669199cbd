"""The side stages of a build: what a build makes beside the rows and their vectors.

A side stage (the keyword side with ``--ocr``, the faces side with ``--faces``) records its
setting in the manifest, checks its engine before any work, reads the rows it has not read yet
around the embedding, counts what it did for the report, and writes its side files into each
generation a commit publishes. :mod:`indexer.sides.contract` says what a stage implements,
:mod:`indexer.side_writer` what its part of a writer implements,
:mod:`indexer.sides.registry` which stages there are; :mod:`indexer.build`, :mod:`indexer.embed`
and :mod:`indexer.stats` only iterate the registry, and :mod:`indexer.commit` carries the sides
it is given.
"""
