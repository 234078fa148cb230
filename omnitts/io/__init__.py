"""Audio files: reading references, writing audio atomically, loudness normalization."""
