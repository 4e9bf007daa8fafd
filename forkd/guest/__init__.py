"""What runs in the VM: forkd's init (init.sh; boot.sh is the stage-1 init of disk-backed images) and the agent,
PID 1 on the guest's own Python (stdlib only). The files here are copied into guest images; nothing in this
package is imported by the host except the list below."""

# The agent's modules, copied together into the guest's /forkd (init.sh runs /forkd/agent.py, so /forkd is
# sys.path[0] and they import each other flatly: `from agent_base import ...`). The one list: the image builders
# copy it, image ids hash it, pycheck reads its imports, and tests/test_guest_modules.py checks the packaging covers it.
AGENT_MODULES = ("agent.py", "agent_base.py", "agent_ops.py", "agent_procs.py", "agent_fs.py", "agent_tcp.py")
