"""Where each `forkd` verb is defined, so that running one imports its own module and no other.

VERBS maps a verb to (module under forkd.cli, summary). The module's `register(app)` adds the verb to `app` (a typer
app); the summary is what `forkd --help` lists, the first sentence of the command's own help
(tests/test_cli_tree.py checks both ways: every verb a module registers is here, with its help's first sentence).
A new verb: define it in its module, add it to that module's register(), and add its line here.
"""

VERBS: dict[str, tuple[str, str]] = {
    "version": ("config", "Print forkd's version."),
    "doctor": ("main", "Check this host: QEMU, kernel and image, accelerator (real boot probe), userfaultfd, space, "
                       "cgroups, netns."),
    "fork": ("main", "Fork N children of a snapshot (--tag), or of a running child as it is now (--from-sandbox ID); "
                     "returns when every child answered."),
    "set-timeout": ("main", "Keepalive: a child made through the daemon expires DURATION from now (the daemon kills it "
                            "then)."),
    "port": ("main", "Open TCP PORT of CHILD through the daemon: prints a URL (a path under the daemon's address over "
                     "the unix socket) that reaches the guest's HTTP server on PORT, for whoever holds it, until "
                     "--close or the child dies."),
    "gc": ("main", "Adopt live children; remove dead ones and orphaned namespaces, veths, taps, cgroups, sockets, "
                   "memory files and VMM processes (identified by recorded pid + start time, or by our naming, never by"
                   " process name)."),
    "ls": ("main", "List children (running, dead = its VMM is gone, failed)."),
    "eval": ("main", "Evaluate a Python expression in the child's warm interpreter and print its repr."),
    "ping": ("main", "Check that a child's agent answers."),
    "kill": ("main", "Stop children and remove their records (dead ones too)."),
    "quickstart": ("main", "The whole tour: apply a parent + pool spec, wait until the pool is warm, claim N children, "
                           "and run an eval and an exec in each."),
    "serve": ("main", "Run the daemon: the reconcile loop, the API on $FORKD_HOME/forkd.sock, and the children it "
                      "owns."),
    "apply": ("declarative", "Create or update objects from YAML."),
    "diff": ("declarative", "Show what apply would change."),
    "get": ("declarative", "List objects of one kind, with their status (AGE: since the object was first applied); of "
                           "one namespace (-n, default: default) or of all (-A, with a NAMESPACE column)."),
    "describe": ("declarative", "Show one object: spec, status, conditions, recent events (and a pool's children)."),
    "delete": ("declarative", "Delete objects (by KIND/NAME or by the files that declare them)."),
    "claim": ("declarative", "Hand out N warm children of a pool at once; the pool refills in the background."),
    "schema": ("declarative", "JSON Schemas of the spec objects, for editors: put `# yaml-language-server: "
                              "$schema=PATH/forkd.json` at the top of a spec file (the YAML language server, VS Code's "
                              "YAML extension, ...)."),
    "explain": ("declarative", "Describe a field of a spec object and the fields under it, like kubectl explain."),
    "pack": ("packs", "Bundle a snapshot, its ancestors and its guest image into one verified .tar.zst."),
    "unpack": ("packs", "Verify a pack completely, then install its snapshots and image (atomic, idempotent)."),
    "pull": ("packs", "Download a pack from the hub, verify it against the index, and unpack it."),
    "push": ("packs", "Pack a snapshot chain into a file:// hub and list it in the hub's registry.json."),
    "from-image": ("images", "Build a guest image from a container image (no Docker engine), then boot, warm and "
                             "snapshot it."),
    "branch": ("branch", "Snapshot a running child into a forkable snapshot ('forkd fork --tag T' restores its "
                         "state)."),
    "crds": ("k8s", "Generate the CustomResourceDefinitions (forkd.dev/v1alpha1) from the spec models."),
    "operator": ("k8s", "Run the Kubernetes operator (kopf): ForkParent/ForkLayer/ForkPool/ForkBranch resources are "
                        "applied to the node daemon at $FORKD_DAEMON_SOCKET (default $FORKD_HOME/forkd.sock) and their "
                        "status copied back."),
    "config": ("config", "Every FORKD_* setting: its value in effect, default, source (env, default or invalid) and "
                         "what it does."),
    "port-forward": ("portfwd", "Listen on a local TCP port and carry each connection to TCP PORT in sandbox ID, raw "
                                "bytes both ways (like kubectl port-forward): for protocols other than HTTP (a "
                                "database, SSH, a language server)."),
    "cp": ("cp", "Copy files or directories between a sandbox and this host, as a tar stream (like docker cp)."),
    "exec": ("streams", "Run a command in a child and stream its output: forkd exec [-i] [-t] [-e K=V] [-w DIR] [-u "
                        "USER] [--timeout DURATION] ID -- CMD [ARGS...]."),
    "logs": ("streams", "Print a child's console log (its kernel and init messages, and whatever the guest writes to "
                        "/dev/console)."),
    "image": ("images", "Guest images (kernel + initramfs with Python and the forkd agent)."),
    "snapshot": ("main", "Snapshots: create, ls, info, diff (a layer), compact, rm, push, pull; or branch a running "
                         "child (--from-sandbox)."),
    "job": ("jobs", "Builds running on the daemon as jobs: ls, cancel."),
    "audit": ("main", "The daemon's hash-chained audit log ($FORKD_HOME/audit.log)."),
    "hub": ("packs", "Serve a directory as a forkd hub."),
}

# old spelling -> (module, the `forkd snapshot` verb it now is): still run, hidden from --help, with a warning
OLD_NOUNS: dict[str, tuple[str, str]] = {
    "snapshots": ("main", "ls"),
    "snapshot-info": ("main", "info"),
    "rmi": ("main", "rm"),
    "snapshot-diff": ("main", "diff"),
    "snapshot-compact": ("main", "compact"),
}
