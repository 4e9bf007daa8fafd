"""The names of the declarative kinds, without their models: what a client needs to name an object (`pools`,
`pool/agents`, `/v1/pools`) before, or instead of, loading pydantic. forkd.spec.models builds one model per kind
named here (tests/test_spec_kinds.py checks the two against each other)."""

API_VERSION = "forkd.dev/v1alpha1"
KINDS = ("ForkParent", "ForkLayer", "ForkPool", "ForkBranch", "ForkClaim")
PLURALS = {"ForkParent": "parents", "ForkLayer": "layers", "ForkPool": "pools", "ForkBranch": "branches",
           "ForkClaim": "claims"}  # each kind's REST collection: /v1/{plural}
# plural / short names for `forkd get`
RESOURCE_NAMES = {"parents": "ForkParent", "parent": "ForkParent", "forkparent": "ForkParent",
                  "layers": "ForkLayer", "layer": "ForkLayer", "forklayer": "ForkLayer",
                  "pools": "ForkPool", "pool": "ForkPool", "forkpool": "ForkPool",
                  "branches": "ForkBranch", "branch": "ForkBranch", "forkbranch": "ForkBranch",
                  "claims": "ForkClaim", "claim": "ForkClaim", "forkclaim": "ForkClaim"}
