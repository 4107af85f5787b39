"""The serving model: sizing, decode and first-token time, measured and learnt profiles, serving
targets. Pure."""
