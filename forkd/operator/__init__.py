"""Kubernetes front end: CRDs generated from the spec models, and a kopf operator that drives node daemons."""
