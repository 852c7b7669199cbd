"""The people of an index on the query side: its faces read with the user's edits.

- :mod:`.people`: :class:`People`, who is in the index and which images hold whom;
- :mod:`.edits`: ``people.json``, names, merges, hidden people and faces moved by hand, kept
  beside the generations so that no update loses them.

Faces are found by the build (:mod:`indexer.faces`, ``index --faces``).
"""

from .edits import PEOPLE_FILE, PeopleEdits, editing, face_key, load_edits
from .people import Face, People, Person

__all__ = ["PEOPLE_FILE", "Face", "People", "PeopleEdits", "Person", "editing", "face_key", "load_edits"]
