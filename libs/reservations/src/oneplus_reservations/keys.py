"""Redis key layout. Every key of one cluster shares a hash tag, so the gang script runs on Redis Cluster too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeySpace:
    cluster: str = "default"

    @property
    def tag(self) -> str:
        return "{oneplus:" + self.cluster + "}"

    @property
    def fence(self) -> str:
        return f"{self.tag}:fence"

    @property
    def epoch(self) -> str:
        """The store's epoch marker: absent means the store lost its state (or was never set up)."""
        return f"{self.tag}:epoch"

    @property
    def replicated(self) -> str:
        """Written just before a WAIT that must cover every earlier write (`ReservationStore.replicated`)."""
        return f"{self.tag}:replicated"

    @property
    def history(self) -> str:
        return f"{self.tag}:history"

    @property
    def gangs(self) -> str:
        return f"{self.tag}:gangs"

    def gang(self, job_id: str) -> str:
        return f"{self.tag}:gang:{job_id}"

    def gpu(self, node: str, index: int) -> str:
        return f"{self.tag}:gpu:{node}:{index}"

    def mig(self, node: str, uuid: str) -> str:
        """A MIG instance is held whole under its own key beside its GPU's (the UUID, MIG-..., never an index)."""
        return f"{self.tag}:gpu:{node}:{uuid}"

    def mig_share(self, node: str, uuid: str) -> str:
        # Never written: an instance is not shared; the gang script pairs every whole key with a share key.
        return f"{self.tag}:share:{node}:{uuid}"

    def share(self, node: str, index: int) -> str:
        return f"{self.tag}:share:{node}:{index}"

    def gpu_prefix(self) -> str:
        return f"{self.tag}:gpu:"

    def share_prefix(self) -> str:
        return f"{self.tag}:share:"
