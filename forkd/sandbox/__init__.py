"""Children: the on-disk registry of running VMM processes and the supervisor that starts, checks and stops
them. Every child is recorded before it is handed out, so a later process finds it, adopts it or reaps it."""
