"""Batch runs: a manifest in, an output directory out (audio files, results.jsonl, exports)."""
