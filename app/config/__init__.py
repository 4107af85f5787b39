"""Configuration: the typed policies the pure parts read (policy), the versioned settings file
(settings) and the reference generated from it (docs)."""
