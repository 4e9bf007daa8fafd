"""Spec: pydantic models of ForkParent / ForkLayer / ForkPool / ForkBranch (issue 3). Pure, no I/O."""
