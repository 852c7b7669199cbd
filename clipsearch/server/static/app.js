// clipsearch web UI: filled in by the UI work.
