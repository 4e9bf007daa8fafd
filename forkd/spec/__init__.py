"""Spec: pydantic models of ForkParent / ForkLayer / ForkPool / ForkBranch / ForkClaim. Pure, no I/O."""
