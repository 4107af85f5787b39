"""Binding: each pod's decisions, one bind and what it reports, who may bind."""
