"""The extender service (verbs -> placement -> bytes), explain, and the wiring that builds every part
once."""
