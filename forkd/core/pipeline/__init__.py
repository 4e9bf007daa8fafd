"""The snapshot pipeline: the typed requests that make a snapshot, each carried out by one handler.

  ParentBuild  -> parent.ParentJob       boot a parent, warm it, pause it to a snapshot
  LayerBuild   -> layer.LayerJob         restore a snapshot, run steps, store the pages that differ
  Compaction   -> compaction.CompactJob  write a chain head as a base snapshot
  Branch       -> branch.BranchJob       snapshot a running child (live, full; diff: branch_diff; live by the
                                         pages it wrote: branch_paged, tried first)

Every handler is a Job (job.py): a list of named steps run in order by forkd.base.steps.run_steps, each one's
duration kept (they become the snapshot's `timings_ms`), and every resource it takes (work directories, scratch
memory files, VMs, locks, VMM connections, the snapshot writer itself) held by one contextlib.ExitStack, so every
failure unwinds the same way: VMs stopped, scratch removed, locks released, the snapshot marked failed with the
original exception re-raised. Files, hashes and commit are the store's (forkd.store.writer); the VMM is the
driver's (forkd.vmm.driver, see forkd/vmm/CONTRACT.md).
"""
