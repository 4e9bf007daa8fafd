"""Files of a sandbox through the daemon's API: the light client's (forkd_client.files_remote), which `forkd cp`
and RemoteBackend use with the runtime's HTTP client too. Re-exported here, one implementation for both."""

from forkd_client.files_remote import CHUNK, MAX_ENTRIES, MAX_LINE, OCTETS, RemoteFiles, chunks_of

__all__ = ["CHUNK", "MAX_ENTRIES", "MAX_LINE", "OCTETS", "RemoteFiles", "chunks_of"]
