"""The cluster as the verbs see it: node facts, the snapshot, its one door. Pure."""
